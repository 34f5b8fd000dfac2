//! NCCL from the locked source (`[nccl] from-source = true`), for adopt mode: built with
//! the toolchain's CUDA for the stack's archs, and its drop-in wheel, which joins the
//! overlay wheelhouse so that `adopt` replaces the environment's NCCL with it.

use std::path::PathBuf;

use anyhow::Result;
use commstack_deepep::LockedWheel;
use commstack_nccl::{MakeRequest, build, build_dropin_wheel};
use commstack_stack::model::NCCL_SOURCE;
use commstack_store::Store;
use commstack_toolchain::Toolchain;

use crate::ctx::Ctx;
use crate::flow::nvshmem::locked_source;
use crate::options::BuildOptions;
use crate::settings::Settings;

/// The NCCL drop-in: its wheel and the prefix DeepEP V2 builds against.
pub struct NcclMade {
    pub wheel: LockedWheel,
    pub prefix: PathBuf,
}

/// None when the lock has no NCCL source (NCCL is then NVIDIA's wheel, as torch pins it).
pub fn nccl_dropin_step(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
    tc: &Toolchain,
    say: &dyn Fn(&str),
) -> Result<Option<NcclMade>> {
    let lock = &settings.lock;
    let Some(locked) = lock.sources.iter().find(|s| s.name == NCCL_SOURCE) else {
        return Ok(None);
    };
    let (source_dir, tree) = locked_source(ctx, &args.fetch, NCCL_SOURCE, say)?;
    let store = Store::open(ctx.store_dir())?;
    let built = build(
        &store,
        &MakeRequest {
            source_dir: &source_dir,
            source_tree: &tree,
            version: &locked.version,
            cuda_home: &tc.cuda_home,
            toolchain_identity: tc.identity(),
            cuda_archs: &settings.cuda_archs,
            jobs: settings.jobs,
            progress: say,
        },
        args.force,
    )?;
    let (wheel, _) = build_dropin_wheel(&store, &built, tc.cuda_major(), args.force)?;
    say(&format!(
        "nccl: NCCL {} from source ({}, {}): {}",
        built.report.version,
        built.report.nvcc_gencode,
        if built.outcome.was_cached() {
            "in the store".to_string()
        } else {
            format!("built in {:.0} s", built.report.seconds)
        },
        wheel.wheel.display()
    ));
    Ok(Some(NcclMade {
        wheel: LockedWheel::from_file(&wheel.wheel)?,
        prefix: built.prefix,
    }))
}
