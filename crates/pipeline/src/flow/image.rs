//! `cargo xtask image`: the verified stack as a container image, from the store only.
//!
//! The base from the locked .debs (fetch cache), NVSHMEM, the self-test, DeepEP and the
//! wheelhouse (the build flows: found in the store when built before), the verify tool,
//! then the image step (`commstack_image`), `docker load`, and on request the OCI layout,
//! the `docker build` context and the verify level inside a container with no network.
//! Nothing here opens a network connection once `fetch` and the builds are done.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use commstack_image::{Image, ImageInputs, Tool};
use commstack_stack::{Lock, Stack};
use commstack_store::{StepKey, Store};
use xshell::{Shell, cmd};

use crate::ctx::Ctx;
use crate::flow::build::SourceFetchArgs;
use crate::flow::lock::read_lock;
use crate::util::human;

/// Where the image's own files are (see docs/image.md).
const IMAGE_BIN: &str = "/opt/commstack/bin";
const IMAGE_VENV: &str = "/opt/commstack/venv";

#[derive(clap::Args)]
#[command(after_help = "\
The stack must have an [image] section (the default stack.toml has one) and a lock with its
[base] (`cargo xtask lock`); the .debs and wheels come from the fetch cache (`cargo xtask
fetch`), NVSHMEM, the self-test and DeepEP from the store (built here when missing).

Prints the image ID (the sha256 of its config: the same lock, commit and tool binaries give
the same ID), the tag
(<name>:<first 12 hex of the lock's sha256>), the size, the layers and where the image
step's files are (config, SBOM, provenance, image.json).")]
pub struct Args {
    /// Also write the image as an OCI image layout (gzip layers, for registries) into DIR,
    /// which must not exist.
    #[arg(long, value_name = "DIR")]
    pub oci: Option<PathBuf>,
    /// Run verify's static level inside the image (`docker run --network=none`): ELF
    /// closure, one libnvshmem_host (ours, NCCL off), one libnccl at the lock's version,
    /// DeepEP's device code of the host library's build; then `import torch` with no GPU.
    /// The report is kept under <home>/reports/image-<id>/.
    #[arg(long, conflicts_with = "no_load")]
    pub verify: bool,
    /// With --verify: also the runtime and selftest levels, in a container with the GPUs
    /// (`docker run --gpus all`: needs GPUs and the NVIDIA container runtime).
    #[arg(long, requires = "verify")]
    pub gpus: bool,
    /// Write the build context of docker/Dockerfile (the same files over the same base)
    /// into DIR, which must not exist.
    #[arg(long, value_name = "DIR")]
    pub context: Option<PathBuf>,
    /// Make the image step but do not load it into Docker.
    #[arg(long)]
    pub no_load: bool,
    /// Make the image step again (its layers are reused when their inputs are unchanged).
    #[arg(long)]
    pub force: bool,
    /// Where locked sources come from when a build needs them and they are not cached.
    #[command(flatten)]
    pub fetch: SourceFetchArgs,
    /// Parallel compile jobs for builds not yet in the store (default: the CPU count).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    /// rdma-core's headers and libmlx5 for the NVSHMEM build (see `build --help`).
    #[arg(long, value_name = "DIR")]
    pub rdma_core: Option<PathBuf>,
}

/// What [`make`] made: the image step, and the steps it was made from.
pub struct Made {
    pub image: Image,
    pub base_dir: PathBuf,
    pub wheelhouse_dir: PathBuf,
    /// The verify exit code (success when --verify was not asked for).
    pub exit: ExitCode,
}

pub fn run(ctx: &Ctx, args: &Args) -> Result<ExitCode> {
    make(ctx, args).map(|m| m.exit)
}

/// Makes (or finds) everything the image needs, the image step, and what the flags ask.
pub fn make(ctx: &Ctx, args: &Args) -> Result<Made> {
    let started = Instant::now();
    let say = |line: &str| {
        if !ctx.quiet {
            eprintln!("{line}");
        }
    };
    let stack = crate::util::read_stack(&ctx.stack_path)?;
    let settings = stack.image.clone().with_context(|| {
        format!(
            "{}: no [image] section, so this stack is not made into an image (the default stack.toml \
             is one that is: `cargo xtask image` with no --stack). Add an [image] \
             section (docs/image.md) and run `cargo xtask lock`",
            stack.path().display()
        )
    })?;
    let lock = read_lock(ctx)?;
    let lock_path = ctx.lock_path();
    let base_lock = lock.base.clone().with_context(|| {
        format!(
            "{}: no [base] section although the stack has [image]: run `cargo xtask{} lock`",
            lock_path.display(),
            ctx.stack_flag()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;

    // The base, from the cached .debs only.
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut debs = Vec::new();
    let mut missing = Vec::new();
    for deb in &lock.debs {
        let file = deb.filename.rsplit('/').next().unwrap_or(&deb.filename);
        match cache.get(&deb.sha256, file)? {
            Some(path) => debs.push((deb, path)),
            None => missing.push(format!("{} {}", deb.name, deb.version)),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} of the base's {} .deb files are not in the cache ({}): run `cargo xtask{} fetch --only debs`",
            missing.len(),
            lock.debs.len(),
            missing.join(", "),
            ctx.stack_flag()
        );
    }
    let base = commstack_base::build_base(
        &store,
        &commstack_base::BaseInputs {
            base: &base_lock,
            debs,
        },
        |line| say(&format!("base: {line}")),
    )?;
    say(&format!(
        "base: {} ({} packages, {}){}",
        base.dir.display(),
        base.manifest.packages.len(),
        human(base.manifest.layer.size),
        if base.outcome.was_cached() {
            ", cached"
        } else {
            ""
        }
    ));

    // The builds: NVSHMEM, the self-test against it, DeepEP and the wheelhouse.
    let build = build_args(args)?;
    let (code, nvshmem_prefix) = crate::flow::nvshmem::nvshmem_build(ctx, &build)?;
    if code != ExitCode::SUCCESS {
        bail!("the stack's NVSHMEM build did not pass its checks: see `cargo xtask build nvshmem`");
    }
    let tc = crate::flow::toolchain::resolve(ctx, &build.toolchain, false)?;
    let selftest = crate::flow::kernels::build_selftest(
        ctx,
        &tc.nvcc,
        &crate::flow::kernels::NvshmemForKernels {
            describe: format!("the stack's NVSHMEM at {}", nvshmem_prefix.display()),
            prefix: nvshmem_prefix,
        },
        &stack.nvshmem.cuda_archs,
    )?;
    let wheelhouse = crate::flow::deepep::build_deepep(ctx, &build)?;
    let wheelhouse_dir = wheelhouse.clone();
    let verify_bin = build_verify_tool(ctx)?;
    let tools = vec![
        own_tool(
            &store,
            "commstack-selftest",
            &selftest,
            "cargo build --release -p commstack-kernels",
        )?,
        own_tool(
            &store,
            "commstack-verify",
            &verify_bin,
            "cargo build --release -p commstack-verify",
        )?,
    ];

    let lock_sha256 = commstack_digest::sha256_file(&lock_path)
        .with_context(|| format!("hashing {}", lock_path.display()))?;
    let (source_url, revision) = git_identity();
    let image = commstack_image::assemble_image(
        &store,
        &ImageInputs {
            lock: lock.clone(),
            lock_path: lock_path.clone(),
            lock_sha256,
            base_dir: base.dir.clone(),
            wheelhouse_dir: wheelhouse,
            tools,
            name: settings.name.clone(),
            user: settings.user.clone(),
            source_url,
            revision,
            large_wheel_bytes: commstack_image::LARGE_WHEEL_BYTES,
        },
        args.force,
    )?;
    print_image(&image);
    if !args.no_load {
        let t = Instant::now();
        let id = commstack_image::docker_load(&image)?;
        println!(
            "loaded: {id} as {} ({:.1} s)",
            image.tag(),
            t.elapsed().as_secs_f64()
        );
    }
    if let Some(dir) = &args.oci {
        let oci = commstack_image::export_oci(&image, dir)?;
        println!(
            "OCI layout: {} (manifest {})",
            dir.display(),
            oci.manifest_digest
        );
    }
    if let Some(dir) = &args.context {
        let context = commstack_image::write_docker_context(&image, dir)?;
        println!(
            "docker build context: {} (base {}): DOCKER_BUILDKIT=0 docker build -f docker/Dockerfile $(cat {}/build-args) -t NAME {}",
            dir.display(),
            context.base_tag,
            dir.display(),
            dir.display()
        );
    }
    let mut exit = ExitCode::SUCCESS;
    if args.verify {
        exit = verify_in_container(ctx, &stack, &lock, &image, &base.manifest.python, args.gpus)?;
    }
    say(&format!("done in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(Made {
        image,
        base_dir: base.dir,
        wheelhouse_dir,
        exit,
    })
}

/// The build flows' arguments for what the image needs, with their defaults.
fn build_args(args: &Args) -> Result<crate::flow::build::Args> {
    #[derive(Parser)]
    struct Build {
        #[command(flatten)]
        args: crate::flow::build::Args,
    }
    let mut argv: Vec<std::ffi::OsString> = vec!["build".into(), "deepep".into()];
    for m in &args.fetch.mirror {
        argv.extend(["--mirror".into(), m.into()]);
    }
    if args.fetch.offline {
        argv.push("--offline".into());
    }
    if args.fetch.accept_tree_match {
        argv.push("--accept-tree-match".into());
    }
    if let Some(j) = args.jobs {
        argv.extend(["--jobs".into(), j.to_string().into()]);
    }
    if let Some(r) = &args.rdma_core {
        argv.extend(["--rdma-core".into(), r.into()]);
    }
    Ok(Build::try_parse_from(argv)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .args)
}

/// The verify tool for inside the image: a release build of `commstack-verify`.
fn build_verify_tool(ctx: &Ctx) -> Result<PathBuf> {
    let sh = Shell::new()?;
    sh.change_dir(crate::util::workspace_root());
    if !ctx.quiet {
        eprintln!("building commstack-verify (release) ...");
    }
    // A target directory of its own: built beside the self-test in one directory, the two
    // -p builds unify dependency features differently and each rebuild the other's
    // crates, so the self-test would be compiled (and its bytes changed) on every run.
    let target = crate::util::cargo_target_dir().join("image-tools");
    // Paths of this machine (the workspace, cargo's registry) would reach the binary's
    // panic messages; remapped, the bytes do not depend on where the checkout is.
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| dirs::home_dir().map(|h| h.join(".cargo")))
        .context("no CARGO_HOME and no home directory")?;
    let rustflags = format!(
        "--remap-path-prefix={}=/cargo --remap-path-prefix={}=/commstack",
        cargo_home.display(),
        crate::util::workspace_root().display()
    );
    cmd!(
        sh,
        "cargo build --release --locked --quiet --target-dir {target} -p commstack-verify --bin commstack-verify"
    )
    .env("RUSTFLAGS", rustflags)
    .run()
    .context("building commstack-verify failed")?;
    Ok(target.join("release/commstack-verify"))
}

/// A stripped copy of one of our binaries, in a store step keyed by the binary's sha256:
/// debug info is most of a release binary and the image has no use for it.
fn own_tool(store: &Store, name: &str, built: &Path, how: &str) -> Result<Tool> {
    let sha = commstack_digest::sha256_file(built)
        .with_context(|| format!("hashing {}", built.display()))?;
    let inputs = serde_json::json!({ "recipe": "stripped-tool-1", "name": name, "sha256": sha });
    let key = StepKey::new("tool", &inputs);
    let outcome = store.run(&key, &inputs, false, |dir| {
        let to = dir.out.join(name);
        std::fs::copy(built, &to).with_context(|| format!("copying {}", built.display()))?;
        let sh = Shell::new()?;
        cmd!(sh, "strip {to}")
            .run()
            .context("strip (binutils) is needed for the image's binaries")?;
        Ok(())
    })?;
    Ok(Tool {
        name: name.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        image_path: format!("{IMAGE_BIN}/{name}"),
        host_path: outcome.path().join(name),
        source: format!("{how} (sha256 {sha} before strip)"),
    })
}

/// The repository's origin URL (credentials removed; a local path or another non-URL
/// origin is left out: it names a host's directory) and commit, for the image's labels.
fn git_identity() -> (String, String) {
    let git = |args: &[&str]| -> String {
        Command::new("git")
            .args(args)
            .current_dir(crate::util::workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let origin = url::Url::parse(&git(&["remote", "get-url", "origin"]))
        .ok()
        .filter(|u| matches!(u.scheme(), "https" | "http" | "ssh" | "git"))
        .map(|mut u| {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        })
        .unwrap_or_default();
    (origin, git(&["rev-parse", "HEAD"]))
}

fn print_image(image: &Image) {
    let m = &image.manifest;
    let total: u64 = m.layers.iter().map(|l| l.size).sum();
    println!(
        "image: {}{}",
        image.id(),
        if image.cached { " (cached)" } else { "" }
    );
    println!("tag:   {}", image.tag());
    println!("size:  {} in {} layers", human(total), m.layers.len());
    for (i, l) in m.layers.iter().enumerate() {
        println!("  {i:>2} {:>10}  {}", human(l.size), l.holds);
    }
    println!(
        "files: {} (image.json, config.json, sbom.spdx.json, provenance.json)",
        image.dir.display()
    );
}

/// Runs the verify tool inside the image with no network; keeps its report under
/// `<home>/reports/image-<id>/`. Returns the verify exit code as ours.
fn verify_in_container(
    ctx: &Ctx,
    stack: &Stack,
    lock: &Lock,
    image: &Image,
    python_full: &str,
    gpus: bool,
) -> Result<ExitCode> {
    let minor = python_full.split('.').take(2).collect::<Vec<_>>().join(".");
    let site = format!("{IMAGE_VENV}/lib/python{minor}/site-packages");
    let mut argv: Vec<String> = vec![
        "run".into(),
        "--rm".into(),
        "--network=none".into(),
        "--entrypoint".into(),
        format!("{IMAGE_BIN}/commstack-verify"),
    ];
    if gpus {
        argv.extend(["--gpus".into(), "all".into()]);
    }
    argv.push(image.id().to_string());
    let levels = if gpus {
        "static,runtime,selftest"
    } else {
        "static"
    };
    argv.extend(
        [
            "--python",
            &format!("{IMAGE_VENV}/bin/python"),
            "--level",
            levels,
            "--json",
            "--quiet",
            "--report",
            "/tmp/commstack-verify",
            "--expect-nccl",
            &lock.resolved.nccl.version.to_string(),
            "--expect-nvshmem",
            &lock.resolved.nvshmem,
            "--nvshmem-prefix",
            &format!("{site}/nvidia/nvshmem"),
            "--target-glibc",
            &format!(
                "{}.{}",
                stack.target.base.glibc.0, stack.target.base.glibc.1
            ),
            "--target-glibcxx",
            &{
                let (a, b, c) = stack.target.base.glibcxx;
                format!("{a}.{b}.{c}")
            },
        ]
        .map(String::from),
    );
    for (switch, on) in stack.nvshmem.transports.iter() {
        argv.push("--nvshmem-option".into());
        argv.push(format!(
            "{}={}",
            switch.cmake,
            if on { "ON" } else { "OFF" }
        ));
    }
    let sms: Vec<String> = stack
        .nvshmem
        .cuda_archs
        .iter()
        .filter(|a| a.has_sass())
        .map(|a| a.sm().to_string())
        .collect();
    if !sms.is_empty() {
        argv.extend(["--cuda-arch".into(), sms.join(",")]);
    }
    if gpus {
        argv.extend([
            "--selftest".into(),
            format!("{IMAGE_BIN}/commstack-selftest"),
        ]);
    }
    if !ctx.quiet {
        eprintln!("verify in the image: docker {}", argv.join(" "));
    }
    let out = Command::new("docker")
        .args(&argv)
        .output()
        .context("cannot run `docker run`: is Docker installed and its daemon running?")?;
    let report_dir = ctx.home.join("reports").join(format!(
        "image-{}",
        &image.id().trim_start_matches("sha256:")[..12]
    ));
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("cannot create {}", report_dir.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report_file = report_dir.join(if gpus {
        "verify-gpus.json"
    } else {
        "verify-static.json"
    });
    crate::util::write_all_atomically(&[(&report_file, &stdout)])?;
    let code = out.status.code().unwrap_or(1);
    let value: Option<serde_json::Value> = serde_json::from_str(&stdout).ok();
    match &value {
        Some(v) => print_verdicts(v),
        None => bail!(
            "the verify tool in the image gave no report (exit {code}): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
    println!("verify report: {} (exit {code})", report_file.display());
    let imports = import_without_gpu(image, &report_dir)?;
    Ok(ExitCode::from(match (code, imports) {
        (0, true) => 0,
        (c, true) => u8::try_from(c).unwrap_or(1),
        (_, false) => 1,
    }))
}

/// `import torch` inside the image with no network and no GPU: the Python side that needs
/// no driver. (deep_ep's extension needs the driver's libcuda.so.1: `--gpus`.)
fn import_without_gpu(image: &Image, report_dir: &Path) -> Result<bool> {
    let script = "import json, torch; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda}))";
    let out = Command::new("docker")
        .args([
            "run",
            "--rm",
            "--network=none",
            "-e",
            "CUDA_VISIBLE_DEVICES=",
        ])
        .args(["--entrypoint", &format!("{IMAGE_VENV}/bin/python")])
        .args([image.id(), "-c", script])
        .output()
        .context("cannot run `docker run`")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let file = report_dir.join("import-torch.txt");
    crate::util::write_all_atomically(&[(&file, &text)])?;
    let ok = out.status.success();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!(
        "import torch (no GPU, no network): {} {}",
        if ok { "passed" } else { "FAILED" },
        stdout.lines().last().unwrap_or("").trim()
    );
    if !ok {
        println!("  output: {}", file.display());
    }
    Ok(ok)
}

/// One line per check of the verify report.
fn print_verdicts(report: &serde_json::Value) {
    let Some(levels) = report.get("levels").and_then(|l| l.as_array()) else {
        return;
    };
    for level in levels {
        let name = level.get("level").and_then(|v| v.as_str()).unwrap_or("?");
        let status = level.get("status").and_then(|v| v.as_str()).unwrap_or("?");
        println!("verify {name}: {status}");
        for check in level
            .get("checks")
            .and_then(|c| c.as_array())
            .into_iter()
            .flatten()
        {
            println!(
                "  {:<8} {:<40} {}",
                check.get("status").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("name").and_then(|v| v.as_str()).unwrap_or("?"),
                check.get("detail").and_then(|v| v.as_str()).unwrap_or("")
            );
        }
    }
}
