//! The fetch options every command that fetches starts from (`fetch`, `lock` for the
//! sources it has not seen, `build`, `gpu-bundle`): below both the fetch and the lock
//! flows, which share it.

use anyhow::{Context, Result};
use commstack_fetch::{FetchOptions, Mirror};

use crate::ctx::Ctx;

/// Fetch options with the cache under `ctx.home`, the given mirrors and trust flags, and
/// progress unless `--quiet`; every other field at its default. Shared by the commands
/// that fetch on the way (build, gpu-bundle).
pub fn base_options(
    ctx: &Ctx,
    mirrors: &[String],
    offline: bool,
    accept_tree_match: bool,
) -> Result<FetchOptions> {
    let mut options = FetchOptions::new(ctx.cache_dir());
    options.mirrors = mirrors
        .iter()
        .map(|m| Mirror::parse(m).map_err(anyhow::Error::msg))
        .collect::<Result<_>>()
        .context("--mirror")?;
    options.offline = offline;
    options.accept_tree_match = accept_tree_match;
    options.progress = !ctx.quiet;
    Ok(options)
}
