//! `cargo xtask build kernels`: the CUDA kernel crate (commstack-selftest), compiled with the
//! locked toolchain against an NVSHMEM install.
//!
//! The NVSHMEM comes from, in order: `--nvshmem PREFIX`, or NVIDIA's wheel of the version
//! torch pins, unpacked from the download cache (good for compiling and for CI; a stack run
//! on a GPU links against the stack's own build, given with `--nvshmem`).
//!
//! The binary is built reproducibly (issue 17): the same sources, toolchain, NVSHMEM,
//! archs and RUNPATH give the same bytes on any machine, from any checkout, store or
//! target directory (commstack-tools' own-tool build: a copy of the workspace at
//! a fixed path, the toolchain and NVSHMEM seen through links there, the environment
//! cleared), and kept stripped in a store step keyed by the contents of those inputs.
//! Its RUNPATH is relative (`$ORIGIN/...`): the binary names no directory of the build
//! machine.

use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_store::{StepKey, Store};
use commstack_tools::{BUNDLE_RUNPATH, NvshmemForKernels, SelftestBuild, selftest_step};
use xshell::{Shell, cmd};

use crate::ctx::Ctx;

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

/// `cargo xtask build kernels [--nvshmem-from stack|nvidia-wheel|PREFIX] [--test]`.
pub fn run(ctx: &Ctx, args: &crate::options::BuildOptions) -> Result<std::process::ExitCode> {
    let settings = crate::settings::Settings::resolve(ctx, args)?;
    settings.print_notes();
    let tc = crate::flow::toolchain::resolve(ctx, &args.toolchain, false, &|l| ctx.say(l))?;
    let nvshmem = match args.nvshmem_from.as_str() {
        "nvidia-wheel" => nvshmem_prefix(ctx, None)?,
        "stack" => {
            let say = |line: &str| ctx.say(line);
            let built =
                crate::flow::nvshmem::nvshmem_step(ctx, &settings, args, &say, &|l: &str| {
                    crate::out!("{l}")
                })?;
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
        let bin = selftest_step(
            &Store::open(ctx.store_dir())?,
            (!ctx.quiet).then_some(&|l: &str| ctx.say(l)),
            &SelftestBuild {
                root: &commstack_tools::workspace_root(),
                nvcc: &tc.nvcc,
                nvshmem: &nvshmem,
                archs: &archs,
                runpath: vec![BUNDLE_RUNPATH.to_string()],
                force: args.force,
            },
        )?
        .path;
        crate::out!(
            "commstack-selftest: {} ({}; RUNPATH {BUNDLE_RUNPATH}: elsewhere run it with \
             LD_LIBRARY_PATH={}/lib)",
            bin.display(),
            nvshmem.describe,
            nvshmem.prefix.display()
        );
    } else {
        // The tests build the crate (debug profile) with the same environment; clippy
        // needs it too (the build script compiles the .cu files), so it runs here as well.
        let sh = Shell::new()?;
        sh.change_dir(commstack_tools::workspace_root());
        let archs = commstack_tools::env_archs(&archs);
        let _env = [
            sh.push_env("COMMSTACK_NVCC", &tc.nvcc),
            sh.push_env("NVSHMEM_HOME", &nvshmem.prefix),
            sh.push_env("COMMSTACK_CUDA_ARCHS", &archs),
        ];
        cmd!(
            sh,
            "cargo test --locked -p commstack-kernels --features cuda"
        )
        .run()
        .context("the kernel crate's tests failed")?;
        // NVSHMEM's nvcc flags give a seeded module id (its test needs nvcc, so it runs
        // here, where the toolchain's nvcc is known).
        cmd!(
            sh,
            "cargo test --locked -p commstack-nvshmem --test nvcc_reproducible -- --ignored"
        )
        .run()
        .context("nvcc's module id is not reproducible with NVSHMEM's flags")?;
        cmd!(
            sh,
            "cargo clippy --locked -p commstack-kernels --features cuda --all-targets -- -D warnings"
        )
        .run()
        .context("clippy found warnings in the kernel crate")?;
        // Our binaries build byte for byte: four release builds, about ten minutes, so
        // only when asked (CI keeps under 30 minutes; `build --check` covers the tools).
        if std::env::var_os("COMMSTACK_REPRO_TESTS").is_some() {
            cmd!(
                sh,
                "cargo test --locked -p commstack-tools --lib selftest::tests::own_tools_build_byte_for_byte -- --ignored --exact"
            )
            .run()
            .context("commstack-selftest or commstack-verify is not reproducible")?;
        } else {
            crate::out!(
                "not run: the tools' byte-for-byte test (ten minutes): COMMSTACK_REPRO_TESTS=1 cargo xtask build kernels --test"
            );
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_image_runpath_leads_from_the_tools_to_the_dropin_nvshmem() {
        assert_eq!(
            crate::flow::image::image_nvshmem_runpath((3, 11)),
            "$ORIGIN/../venv/lib/python3.11/site-packages/nvidia/nvshmem/lib"
        );
    }
}
