//! `cargo xtask build kernels`: the CUDA kernel crate (commstack-selftest), compiled with the
//! locked toolchain against an NVSHMEM install.
//!
//! The NVSHMEM comes from, in order: `--nvshmem PREFIX`, or NVIDIA's wheel of the version
//! torch pins, unpacked from the download cache (good for compiling and for CI; a stack run
//! on a GPU links against the stack's own build, given with `--nvshmem`). The binary is
//! built by cargo, which caches it; this module only computes the environment.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_stack::CudaArch;
use commstack_store::{StepKey, Store};
use xshell::{Shell, cmd};

use crate::ctx::Ctx;

/// Where the NVSHMEM a kernel build compiles against came from.
pub struct NvshmemForKernels {
    pub prefix: PathBuf,
    pub describe: String,
}

/// `--nvshmem PREFIX`, or NVIDIA's wheel from the cache unpacked into the store.
pub fn nvshmem_prefix(ctx: &Ctx, explicit: Option<&Path>) -> Result<NvshmemForKernels> {
    if let Some(p) = explicit {
        let p = p
            .canonicalize()
            .with_context(|| format!("no NVSHMEM install at {}", p.display()))?;
        if !p.join("lib/libnvshmem_device.a").is_file() {
            bail!(
                "{} has no lib/libnvshmem_device.a: pass an NVSHMEM install prefix",
                p.display()
            );
        }
        return Ok(NvshmemForKernels {
            describe: format!("NVSHMEM at {}", p.display()),
            prefix: p,
        });
    }
    let lock = crate::flow::lock::read_lock(ctx)?;
    let wheel = lock
        .packages
        .iter()
        .find(|p| p.replaced_by.as_deref() == Some("nvshmem"))
        .context(
            "the lock names no NVIDIA NVSHMEM wheel to compile against: pass --nvshmem PREFIX",
        )?;
    let fetched = commstack_fetch::Cache::new(ctx.cache_dir())
        .get(&wheel.sha256, &wheel.filename)?
        .with_context(|| {
            format!(
                "{} is not in the cache: run `cargo xtask fetch --only replaced`",
                wheel.filename
            )
        })?;
    let store = Store::open(ctx.store_dir())?;
    let inputs = serde_json::json!({ "wheel": wheel.filename, "sha256": wheel.sha256 });
    let key = StepKey::new("nvidia-nvshmem-unpacked", &inputs);
    let outcome = store.run(&key, &inputs, false, |dir| {
        commstack_wheel::unpack(&fetched, &dir.out).map(|_| ())
    })?;
    let prefix = outcome.path().join("nvidia/nvshmem");
    Ok(NvshmemForKernels {
        describe: format!("NVIDIA's {} {} (compile only)", wheel.name, wheel.version),
        prefix,
    })
}

/// COMMSTACK_CUDA_ARCHS for the kernel crate's build script, which parses it back with
/// the same CUDA-arch type.
fn env_archs(archs: &[CudaArch]) -> String {
    let entries: Vec<String> = archs.iter().map(CudaArch::cmake).collect();
    entries.join(";")
}

/// Build commstack-selftest (release) and return its path.
pub fn build_selftest(
    ctx: &Ctx,
    nvcc: &Path,
    nvshmem: &NvshmemForKernels,
    archs: &[CudaArch],
) -> Result<PathBuf> {
    let root = crate::util::workspace_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    let archs = env_archs(archs);
    if !ctx.quiet {
        eprintln!(
            "building commstack-selftest: nvcc {}, {}, archs {archs}",
            nvcc.display(),
            nvshmem.describe
        );
    }
    cmd!(
        sh,
        "cargo build --release --locked -p commstack-kernels --bin commstack-selftest"
    )
    .env("COMMSTACK_NVCC", nvcc)
    .env("NVSHMEM_HOME", &nvshmem.prefix)
    .env("COMMSTACK_CUDA_ARCHS", &archs)
    .run()
    .context("building the kernel crate failed (its build script says what is missing)")?;
    Ok(crate::util::cargo_target_dir().join("release/commstack-selftest"))
}

/// `cargo xtask build kernels [--nvshmem-from stack|nvidia-wheel|PREFIX] [--test]`.
pub fn run(ctx: &Ctx, args: &crate::flow::build::Args) -> Result<std::process::ExitCode> {
    let settings = crate::settings::Settings::resolve(ctx, args)?;
    settings.print_notes();
    let tc = crate::flow::toolchain::resolve(ctx, &args.toolchain, false)?;
    let nvshmem = match args.nvshmem_from.as_str() {
        "nvidia-wheel" => nvshmem_prefix(ctx, None)?,
        "stack" => {
            let say = |line: &str| ctx.say(line);
            let built = crate::flow::nvshmem::nvshmem_step(ctx, &settings, args, &say)?;
            let prefix = built.prefix;
            NvshmemForKernels {
                describe: format!("the stack's NVSHMEM at {}", prefix.display()),
                prefix,
            }
        }
        path => nvshmem_prefix(ctx, Some(Path::new(path)))?,
    };
    let archs = settings.cuda_archs.clone();
    if !args.test {
        let bin = build_selftest(ctx, &tc.nvcc, &nvshmem, &archs)?;
        crate::out!(
            "commstack-selftest: {} ({})",
            bin.display(),
            nvshmem.describe
        );
    } else {
        // The tests build the crate (debug profile) with the same environment; clippy
        // needs it too (the build script compiles the .cu files), so it runs here as well.
        let sh = Shell::new()?;
        sh.change_dir(crate::util::workspace_root());
        let archs = env_archs(&archs);
        let _env = [
            sh.push_env("COMMSTACK_NVCC", &tc.nvcc),
            sh.push_env("NVSHMEM_HOME", &nvshmem.prefix),
            sh.push_env("COMMSTACK_CUDA_ARCHS", &archs),
        ];
        cmd!(sh, "cargo test --locked -p commstack-kernels")
            .run()
            .context("the kernel crate's tests failed")?;
        cmd!(
            sh,
            "cargo clippy --locked -p commstack-kernels --all-targets -- -D warnings"
        )
        .run()
        .context("clippy found warnings in the kernel crate")?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}
