//! `cargo xtask build <target>`: build one part of the stack into the step store.
//! `nvshmem` today; `kernels` and `deepep` come with their issues.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_nvshmem::{
    BuildRequest, DropInSpec, NvshmemOptions, build, build_dropin_wheel, compare_wheels,
    env::resolve_passthrough,
};
use commstack_stack::CudaArch;
use commstack_store::{Outcome, Store};

use crate::cmd_toolchain::{ToolchainArgs, resolve};
use crate::ctx::Ctx;

// `build deepep` lives in its own file (the DeepEP issue's module).
#[path = "cmd_build_deepep.rs"]
pub mod deepep;

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Target {
    /// NVSHMEM from source with NVSHMEM_USE_NCCL=OFF, proven, and its drop-in wheel.
    Nvshmem,
    /// The CUDA kernel crate (not yet).
    Kernels,
    /// DeepEP into a wheel and the wheelhouse (managed venv, or --python PATH to adopt).
    Deepep,
}

#[derive(clap::Args)]
pub struct Args {
    /// What to build.
    #[arg(value_enum)]
    pub target: Target,
    /// Build again even if the store has the result.
    #[arg(long)]
    pub force: bool,
    /// Parallel compile jobs (default: the CPU count).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// An unpacked source tree to build instead of the locked one (development only: its
    /// tree hash keys the build, and the output says it is an override).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// Where the locked source comes from when it is not in the cache yet.
    #[command(flatten)]
    pub fetch: SourceFetchArgs,
    /// The install prefix of a package an enabled transport builds against, e.g.
    /// `--with ucx=/opt/ucx` (for nvshmem.ucx = true in stack.toml). Repeatable.
    #[arg(long, value_name = "KEY=PREFIX", value_parser = parse_with)]
    pub with: Vec<(String, PathBuf)>,
    #[command(flatten)]
    pub toolchain: ToolchainArgs,
    /// CMAKE_CUDA_ARCHITECTURES entries (`90`, `90a`, `100f`, `90-real`: stack.toml's
    /// grammar), overriding stack.toml's nvshmem.cuda-archs.
    #[arg(long, value_delimiter = ',', value_name = "ARCH,...")]
    pub cuda_archs: Vec<CudaArch>,
    /// Build without IBGDA, overriding stack.toml (no rdma-core needed; no internode
    /// DeepEP kernels).
    #[arg(long)]
    pub no_ibgda: bool,
    /// Also build libnvshmem.a, nvshmem-info and the CMake package with NVSHMEM's own
    /// install rules, overriding stack.toml's nvshmem.static-lib (about a third more
    /// compile work; NVIDIA's wheel ships none of them).
    #[arg(long)]
    pub static_lib: bool,
    /// Where rdma-core's headers and libmlx5 are (`/`, or a `dpkg -x` tree of
    /// libibverbs-dev + ibverbs-providers). Default: this system.
    #[arg(long, value_name = "DIR")]
    pub rdma_core: Option<PathBuf>,
    /// An environment variable to keep for the build (e.g. NVSHMEM_DISABLE_NVLS);
    /// variables NVSHMEM's CMake reads as option defaults are refused.
    #[arg(long = "keep-env", value_name = "NAME")]
    pub keep_env: Vec<String>,
    /// The NVSHMEM version torch pins (default: from stack.lock, else the source's).
    #[arg(long)]
    pub torch_pin: Option<String>,
    /// Ship another NVSHMEM version under torch's pinned version (see the error it lifts).
    #[arg(long)]
    pub allow_version_mismatch: bool,
    /// NVIDIA's wheel of the same version: compare ours with it file by file; fail on
    /// unexplained differences.
    #[arg(long, value_name = "WHEEL")]
    pub compare_with: Option<PathBuf>,
    /// kernels: the NVSHMEM to compile against: `stack` (the stack's own build, made or
    /// found in the store), `nvidia-wheel` (NVIDIA's wheel of torch's pin, from the cache:
    /// enough to compile and test on a CPU machine), or an install PREFIX.
    #[arg(
        long,
        value_name = "stack|nvidia-wheel|PREFIX",
        default_value = "stack"
    )]
    pub nvshmem_from: String,
    /// kernels: run the crate's tests (debug build) with that environment instead of
    /// building the release binary.
    #[arg(long)]
    pub test: bool,
    /// The Python interpreter NVSHMEM's CMake requires (default: python3 on PATH).
    #[arg(long)]
    pub python3: Option<PathBuf>,
    /// Only run CMake's configure step in DIR (not the store) and print the NVSHMEM
    /// options CMake ended up with: checks the option mapping against a source in seconds.
    #[arg(long, value_name = "DIR")]
    pub configure_only: Option<PathBuf>,
    #[command(flatten)]
    pub deepep: deepep::DeepepArgs,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    match args.target {
        Target::Nvshmem => nvshmem(ctx, args),
        Target::Kernels => crate::cmd_build_kernels::run(ctx, &args),
        Target::Deepep => deepep::run(ctx, &args),
    }
}

fn nvshmem(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    nvshmem_build(ctx, &args).map(|(code, _)| code)
}

/// Build (or find) the stack's NVSHMEM; returns the exit code and the install prefix.
pub fn nvshmem_build(ctx: &Ctx, args: &Args) -> Result<(ExitCode, PathBuf)> {
    let started = Instant::now();
    let say = |line: &str| {
        if !ctx.quiet {
            eprintln!("{line}");
        }
    };
    let stack = crate::util::read_stack(&ctx.stack_path)?;
    let (source, tree) = match &args.source {
        Some(dir) => {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("no source tree at {}", dir.display()))?;
            let tree = commstack_fetch::tree::tree_sha256_dir(&dir)
                .with_context(|| format!("cannot hash {}", dir.display()))?;
            println!(
                "WARNING nvshmem: OVERRIDE: building {} (tree {tree}), not the locked source",
                dir.display()
            );
            (dir, tree)
        }
        None => locked_source(ctx, &args.fetch, "nvshmem")?,
    };

    let tc = resolve(ctx, &args.toolchain, false)?;
    say(&format!("toolchain: {}", tc.describe()));

    let homes = args.with.iter().cloned().collect();
    let mut options = NvshmemOptions::from_stack(&stack.nvshmem, &homes, args.rdma_core.clone())?;
    if !args.cuda_archs.is_empty() {
        println!("note: --cuda-archs overrides stack.toml's nvshmem.cuda-archs");
        options.cuda_archs = args.cuda_archs.clone();
    }
    if args.no_ibgda {
        println!("note: --no-ibgda overrides stack.toml's nvshmem.ibgda");
        options.switches.set("ibgda", false);
    }
    if args.static_lib && !options.static_lib {
        println!("note: --static-lib overrides stack.toml's nvshmem.static-lib");
        options.static_lib = true;
    }
    let python3 = match &args.python3 {
        Some(p) => p.clone(),
        None => commstack_toolchain::find_in_path("python3", None).context(
            "NVSHMEM's CMake requires a Python interpreter: no python3 on PATH (pass --python3)",
        )?,
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
    let req = BuildRequest {
        source_dir: &source,
        source_tree_sha256: &tree,
        options: &options,
        toolchain: &tc,
        python3,
        passthrough: resolve_passthrough(
            &stack
                .nvshmem
                .pass_env
                .iter()
                .chain(&args.keep_env)
                .cloned()
                .collect::<Vec<_>>(),
        )?,
        jobs,
        progress: &say,
    };
    if let Some(work) = &args.configure_only {
        let cache = commstack_nvshmem::configure_only(&req, work)?;
        for (k, v) in &cache {
            println!("{k}={v}");
        }
        println!(
            "configured in {}: log {}",
            work.display(),
            work.join("logs/configure.log").display()
        );
        return Ok((ExitCode::SUCCESS, work.clone()));
    }
    let store = Store::open(ctx.store_dir())?;
    let built = build(&store, &req, args.force)?;
    match &built.outcome {
        Outcome::Cached { path } => println!(
            "nvshmem: already built with these inputs, nothing to do: {}",
            path.display()
        ),
        Outcome::Built { path, seconds } => {
            println!("nvshmem: built in {seconds:.1} s: {}", path.display())
        }
    }
    let p = &built.report.proof;
    println!(
        "proof: NVSHMEM_USE_NCCL={}, {} option(s) as asked, {} libnccl name(s), NVSHMEM {}, SASS {:?}, GLIBC {} / GLIBCXX {} -> {}",
        p.use_nccl,
        built
            .report
            .cmake_defines
            .iter()
            .filter(|(k, _)| k.starts_with("NVSHMEM_"))
            .count(),
        p.libnccl_hits.len(),
        p.version.as_deref().unwrap_or("?"),
        p.sass_found
            .get("lib/libnvshmem_device.a")
            .cloned()
            .unwrap_or_default(),
        p.newest_glibc.as_deref().unwrap_or("-"),
        p.newest_glibcxx.as_deref().unwrap_or("-"),
        p.manylinux
    );
    println!(
        "report: {}",
        built
            .outcome
            .path()
            .join(commstack_nvshmem::REPORT_FILE)
            .display()
    );

    let torch_pin = match &args.torch_pin {
        Some(v) => v.clone(),
        None => torch_pin_from_lock(ctx).unwrap_or_else(|| built.report.source.version.clone()),
    };
    let spec = DropInSpec {
        cuda_major: tc.cuda_major(),
        torch_pin,
        allow_version_mismatch: args.allow_version_mismatch,
    };
    let (dropin, outcome) = build_dropin_wheel(&store, &built, &spec, args.force)?;
    println!(
        "wheel{}: {}",
        if outcome.was_cached() {
            " (cached)"
        } else {
            ""
        },
        dropin.wheel.display()
    );
    for note in &dropin.notes {
        println!("  note: {note}");
    }
    let mut code = ExitCode::SUCCESS;
    if let Some(theirs) = &args.compare_with {
        let cmp = compare_wheels(&dropin.wheel, theirs, &options)?;
        print!("{}", cmp.render());
        if !cmp.passed() {
            eprintln!(
                "error: {} unexplained difference(s) with {}",
                cmp.unexplained().len(),
                theirs.display()
            );
            code = ExitCode::FAILURE;
        }
    }
    say(&format!("done in {:.2} s", started.elapsed().as_secs_f64()));
    Ok((code, built.prefix.clone()))
}

/// `nvidia-nvshmem-cu13==3.4.5` in stack.lock -> `3.4.5`.
fn torch_pin_from_lock(ctx: &Ctx) -> Option<String> {
    let lock = crate::util::read_lock(ctx).ok()?;
    lock.resolved
        .nvshmem_pin
        .split_once("==")
        .map(|(_, v)| v.trim().to_string())
}

/// Mirrors and trust flags for fetching a locked source (see `cargo xtask fetch --help`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SourceFetchArgs {
    /// A mirror directory or URL tried before upstream. Repeatable.
    #[arg(long, value_name = "DIR|URL")]
    pub mirror: Vec<String>,
    /// Open no network connection.
    #[arg(long)]
    pub offline: bool,
    /// Accept an archive whose tree hash equals the lock's although its sha256 differs.
    #[arg(long)]
    pub accept_tree_match: bool,
}

fn parse_with(s: &str) -> Result<(String, PathBuf), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=PREFIX"))?;
    Ok((k.to_string(), PathBuf::from(v)))
}

/// The locked source `name`: fetched (or found in the cache), verified, and unpacked into
/// a store step keyed by its tree hash. Returns the source directory and its tree hash.
pub fn locked_source(ctx: &Ctx, fetch: &SourceFetchArgs, name: &str) -> Result<(PathBuf, String)> {
    let lock = crate::util::read_lock(ctx)?;
    let artifacts: Vec<_> =
        crate::cmd_fetch::artifacts_of_parts(&lock, &[crate::cmd_fetch::Part::Sources])?
            .into_iter()
            .filter(|a| a.name == name)
            .collect();
    if artifacts.is_empty() {
        bail!("{} has no source named {name}", ctx.lock_path().display());
    }
    let options =
        crate::cmd_fetch::base_options(ctx, &fetch.mirror, fetch.offline, fetch.accept_tree_match)?;
    let fetched = commstack_fetch::fetch_all(&artifacts, &options)?;
    let f = &fetched[0];
    if let Some(d) = f.deviation() {
        println!("WARNING {d}");
    }
    let tree = artifacts[0]
        .tree_sha256
        .clone()
        .with_context(|| format!("the lock has no tree hash for {name}: run `cargo xtask lock`"))?;
    let store = Store::open(ctx.store_dir())?;
    let inputs = serde_json::json!({ "source": name, "tree": tree });
    let key = commstack_store::StepKey::new(&format!("{name}-source"), &inputs);
    let archive = f.path.clone();
    let outcome = store.run(&key, &inputs, false, |dir| {
        let src = dir.out.join("src");
        std::fs::create_dir_all(&src)?;
        let sh = xshell::Shell::new()?;
        xshell::cmd!(sh, "tar -xzf {archive} -C {src} --strip-components=1")
            .quiet()
            .run()?;
        let got = commstack_fetch::tree::tree_sha256_dir(&src)?;
        if got != tree {
            bail!(
                "{} unpacked to tree {got}, not the locked {tree}",
                archive.display()
            );
        }
        Ok(())
    })?;
    Ok((outcome.path().join("src"), tree))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// `--cuda-archs` parses through the stack's CUDA-arch type: the entries every place
    /// pins are kept as written, "9x0" is refused with the grammar's message.
    #[test]
    fn cuda_archs_flag_uses_the_stack_grammar() {
        let cli = Cli::try_parse_from(["build", "nvshmem", "--cuda-archs", "90,90a,100f,90-real"])
            .unwrap_or_else(|e| panic!("{e}"));
        let archs: Vec<String> = cli.args.cuda_archs.iter().map(|a| a.cmake()).collect();
        assert_eq!(archs, ["90", "90a", "100f", "90-real"]);
        let Err(e) = Cli::try_parse_from(["build", "nvshmem", "--cuda-archs", "90,9x0"]) else {
            panic!("9x0 was accepted");
        };
        let e = e.to_string();
        assert!(e.contains("\"9x0\" is not a CUDA architecture"), "{e}");
    }
}
