//! The build toolchain the arguments name: this machine's CUDA (`--system`), a wheel
//! directory, or the lock's toolchain wheels from the cache, provisioned into the store.
//! Shared by `toolchain`, `build` and `gpu-bundle`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_store::Store;
use commstack_toolchain::{SystemOptions, Toolchain, WheelInput, provision_wheels, system};

use crate::ctx::Ctx;
use crate::flow::lock::read_lock;
use crate::options::ToolchainChoice;

/// The toolchain the arguments name: system, a wheel directory, or stack.lock's
/// toolchain wheels from the download cache.
pub fn resolve(
    ctx: &Ctx,
    args: &ToolchainChoice,
    force: bool,
    say: &dyn Fn(&str),
) -> Result<Toolchain> {
    if args.system {
        return system(&SystemOptions {
            cuda_home: args.cuda_home.clone(),
            ..Default::default()
        });
    }
    let wheels = match &args.wheels {
        Some(dir) => wheels_in_dir(dir)?,
        None => wheels_from_lock(ctx)?,
    };
    let store = Store::open(ctx.store_dir())?;
    let provisioned = provision_wheels(&store, &wheels, force)?;
    say(&match &provisioned.outcome {
        commstack_store::Outcome::Cached { path } => {
            format!(
                "toolchain: in the store, nothing to do ({})",
                path.display()
            )
        }
        commstack_store::Outcome::Built { path, seconds } => format!(
            "toolchain: provisioned and checked in {seconds:.1} s ({})",
            path.display()
        ),
    });
    Ok(provisioned.toolchain)
}

fn wheels_from_lock(ctx: &Ctx) -> Result<Vec<WheelInput>> {
    let lock = read_lock(ctx)
        .context("the toolchain comes from the lock, or from --wheels DIR or --system")?;
    if lock.toolchain.is_empty() {
        bail!(
            "{} lists no toolchain wheels: run `cargo xtask lock` again, or pass --wheels DIR or --system",
            ctx.lock_path().display()
        );
    }
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut out = Vec::new();
    for w in &lock.toolchain {
        let file = cache.get(&w.sha256, &w.filename)?.with_context(|| {
            format!(
                "the toolchain wheel {} is not in the download cache: run `cargo xtask fetch --only toolchain{}`",
                w.filename,
                ctx.stack_flag()
            )
        })?;
        out.push(WheelInput {
            filename: w.filename.clone(),
            path: file,
            sha256: w.sha256.clone(),
        });
    }
    Ok(out)
}

/// Every toolchain wheel in `dir`, hashed here (development: the lock pins them otherwise).
fn wheels_in_dir(dir: &Path) -> Result<Vec<WheelInput>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let Some(filename) = path
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let Ok(parsed) = commstack_wheel::WheelFilename::parse(&filename) else {
            continue;
        };
        if !commstack_toolchain::REQUIRED_WHEELS
            .contains(&commstack_wheel::normalize_name(&parsed.name).as_str())
        {
            continue;
        }
        let sha256 = commstack_digest::sha256_file(&path)
            .with_context(|| format!("cannot hash {}", path.display()))?;
        out.push(WheelInput {
            filename,
            path,
            sha256,
        });
    }
    Ok(out)
}
