//! `cargo xtask gpu-bundle DIR`: everything a GPU machine with no Rust toolchain and no
//! network needs to run the GPU checks in `gpu/run.sh`: release binaries built here, the
//! locked sources from the cache (or a mirror), and optional rdma-core headers.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use commstack_pipeline::ctx::Ctx;
use commstack_pipeline::flow::fetch::base_options;
use commstack_pipeline::flow::kernels::{build_selftest, nvshmem_prefix};
use commstack_pipeline::flow::lock::{Part, artifacts_of_parts, read_lock};
use commstack_pipeline::flow::toolchain::resolve;

use crate::args::ToolchainArgs;

/// What travels to a GPU machine is limited (64 MiB for the device tool here); stay under.
const LIMIT: u64 = 60 * 1024 * 1024;

#[derive(clap::Args)]
#[command(after_help = "\
Layout written:
  DIR/bin/xtask                  this CLI (release, stripped)
  DIR/bin/commstack-selftest     the NVSHMEM self-test (release, stripped)
  DIR/mirror/                    the locked sources, for `fetch --offline --mirror DIR/mirror`
  DIR/rdma-core/                 (with --rdma-core) headers + libmlx5 for IBGDA builds
  DIR/bundle.json                what is in it, with sha256s
Make it for the GPU machine's stack: `cargo xtask --stack stacks/gpu-adopt.toml gpu-bundle DIR`
(the default stack.toml is the Debian image's). Then on the GPU machine, from a checkout of
this repository:  gpu/run.sh DIR OUT (it uses stacks/gpu-adopt.toml too)")]
pub struct Args {
    /// The bundle directory (emptied first).
    #[arg(default_value = "scratch/bundle")]
    dir: PathBuf,
    /// NVSHMEM install the self-test compiles against (default: NVIDIA's wheel of torch's pin).
    #[arg(long, value_name = "PREFIX")]
    nvshmem: Option<PathBuf>,
    /// Mirrors to take the locked sources from (see `cargo xtask fetch --help`).
    #[arg(long, value_name = "DIR|URL")]
    mirror: Vec<String>,
    /// Accept sources whose tree hash matches the lock although their archive differs.
    #[arg(long)]
    accept_tree_match: bool,
    /// A `dpkg -x` tree of libibverbs-dev + ibverbs-providers to ship for IBGDA builds.
    #[arg(long, value_name = "DIR")]
    rdma_core: Option<PathBuf>,
    /// Leave the self-test out (no CUDA compile).
    #[arg(long)]
    no_selftest: bool,
    #[command(flatten)]
    toolchain: ToolchainArgs,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let root = commstack_pipeline::util::workspace_root();
    let dir = std::path::absolute(&args.dir)?;
    // Every input is checked (and the sources fetched) before the long release builds, so a
    // missing one fails in seconds: the sources, the rdma-core tree, and for the self-test
    // the toolchain and NVIDIA's NVSHMEM wheel (`fetch --only sources,toolchain,replaced`).
    if let Some(rdma) = &args.rdma_core
        && !rdma.join("usr/include/infiniband/mlx5dv.h").is_file()
    {
        bail!(
            "--rdma-core {} has no usr/include/infiniband/mlx5dv.h: give a `dpkg -x` tree of libibverbs-dev and ibverbs-providers (see gpu/README.md)",
            rdma.display()
        );
    }
    let artifacts = artifacts_of_parts(&read_lock(ctx)?, &[Part::Sources])?;
    let options = base_options(ctx, &args.mirror, false, args.accept_tree_match)?;
    let fetched = commstack_fetch::fetch_all(&artifacts, &options).context(
        "the locked sources: give the mirror that holds them (--mirror DIR --accept-tree-match, see gpu/README.md)",
    )?;
    let selftest_inputs = match args.no_selftest {
        true => None,
        false => {
            let stack = commstack_pipeline::util::read_stack(&ctx.stack_path)?;
            let tc = resolve(ctx, &args.toolchain.clone().into(), false)?;
            let nvshmem = nvshmem_prefix(ctx, args.nvshmem.as_deref())?;
            Some((stack, tc, nvshmem))
        }
    };

    // Written beside DIR and renamed over it at the end: a failure leaves no half bundle.
    let name = dir
        .file_name()
        .context("the bundle directory has no name")?;
    let temp = dir.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = write_bundle(ctx, &root, &temp, &args, &fetched, selftest_inputs);
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot empty {}", dir.display()))?;
    }
    std::fs::rename(&temp, &dir)
        .with_context(|| format!("renaming {} to {}", temp.display(), dir.display()))?;
    println!("bundle {} ready", dir.display());
    Ok(ExitCode::SUCCESS)
}

type SelftestInputs = (
    commstack_stack::Stack,
    commstack_toolchain::Toolchain,
    commstack_pipeline::flow::kernels::NvshmemForKernels,
);

fn write_bundle(
    ctx: &Ctx,
    root: &Path,
    dir: &Path,
    args: &Args,
    fetched: &[commstack_fetch::Fetched],
    selftest: Option<SelftestInputs>,
) -> Result<()> {
    std::fs::create_dir_all(dir.join("bin"))?;
    let sh = Shell::new()?;
    sh.change_dir(root);
    let mut manifest = serde_json::Map::new();

    eprintln!("building xtask (release)");
    cmd!(sh, "cargo build --release --locked -p xtask")
        .run()
        .context("building xtask")?;
    copy_stripped(
        &sh,
        &commstack_pipeline::util::cargo_target_dir().join("release/xtask"),
        &dir.join("bin/xtask"),
    )?;

    if let Some((stack, tc, nvshmem)) = selftest {
        let bin = build_selftest(ctx, &tc.nvcc, &nvshmem, &stack.nvshmem.cuda_archs)?;
        copy_stripped(&sh, &bin, &dir.join("bin/commstack-selftest"))?;
        manifest.insert("selftest-nvshmem".into(), nvshmem.describe.clone().into());
        manifest.insert("toolchain".into(), tc.describe().into());
    }

    // The locked sources, named as the lock names them (what `--mirror DIR` reads).
    std::fs::create_dir_all(dir.join("mirror"))?;
    for f in fetched {
        if let Some(d) = f.deviation() {
            println!("WARNING {d}");
        }
        std::fs::copy(&f.path, dir.join("mirror").join(&f.filename))
            .with_context(|| format!("copying {}", f.path.display()))?;
    }
    manifest.insert("sources".into(), serde_json::to_value(fetched)?);

    if let Some(rdma) = &args.rdma_core {
        commstack_archive::copy_tree(rdma, &dir.join("rdma-core"))?;
    }

    let mut total = 0u64;
    let mut files = serde_json::Map::new();
    for entry in walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
    {
        total += entry.metadata()?.len();
        if entry.path().starts_with(dir.join("bin")) {
            files.insert(
                entry.path().strip_prefix(dir)?.display().to_string(),
                commstack_digest::sha256_file(entry.path())?.into(),
            );
        }
    }
    manifest.insert("binaries".into(), files.into());
    manifest.insert("bytes".into(), total.into());
    std::fs::write(
        dir.join("bundle.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    println!("bundle: {}", commstack_pipeline::util::human(total));
    if total > LIMIT {
        bail!(
            "the bundle is {} MiB, over the {} MiB a GPU run can carry",
            total >> 20,
            LIMIT >> 20
        );
    }
    Ok(())
}

fn copy_stripped(sh: &Shell, from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    // Debug info is most of a release binary's size and useless on the GPU machine.
    cmd!(sh, "strip {to}")
        .run()
        .context("strip (binutils) is needed to make the bundle small")?;
    Ok(())
}
