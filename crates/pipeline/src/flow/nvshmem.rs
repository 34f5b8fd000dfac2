//! NVSHMEM for the stack: the locked source unpacked into the store, then built into the
//! store with its drop-in wheel (`build nvshmem`, and `build kernels` on the way).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_nvshmem::{
    BuildRequest, DropInSpec, NvshmemOptions, build, build_dropin_wheel, compare_wheels,
    env::resolve_passthrough,
};
use commstack_store::{Outcome, Store};

use crate::ctx::Ctx;
use crate::flow::build::{Args, SourceFetchArgs};
use crate::flow::fetch::base_options;
use crate::flow::lock::{Part, artifacts_of_parts, read_lock};
use crate::flow::toolchain::resolve;

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
    let lock = read_lock(ctx).ok()?;
    lock.resolved.nvshmem_pin.map(|p| p.version.to_string())
}

/// The locked source `name`: fetched (or found in the cache), verified, and unpacked into
/// a store step keyed by its tree hash. Returns the source directory and its tree hash.
pub fn locked_source(ctx: &Ctx, fetch: &SourceFetchArgs, name: &str) -> Result<(PathBuf, String)> {
    let lock = read_lock(ctx)?;
    let artifacts: Vec<_> = artifacts_of_parts(&lock, &[Part::Sources])?
        .into_iter()
        .filter(|a| a.name == name)
        .collect();
    if artifacts.is_empty() {
        bail!("{} has no source named {name}", ctx.lock_path().display());
    }
    let options = base_options(ctx, &fetch.mirror, fetch.offline, fetch.accept_tree_match)?;
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
        // The one unpacker (not GNU tar, which stores links pointing outside as a
        // success); TopDir is --strip-components=1 that insists on one top directory.
        let options = commstack_archive::Options::strip(commstack_archive::Strip::TopDir);
        commstack_archive::unpack(&archive, &src, &options)?;
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
