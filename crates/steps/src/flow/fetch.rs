//! Fetch options and the artifact list from the command line, for the commands that fetch
//! (`fetch`, `mirror export`, and `build` / `gpu-bundle` on the way).

use anyhow::{Context, Result};
use commstack_fetch::{Artifact, FetchOptions, Mirror};

use crate::ctx::Ctx;
use crate::flow::lock::{artifacts_of_parts, read_lock};
use crate::options::FetchRequest;

/// The fetch options the flags ask for, with the cache under `ctx.home`.
pub fn fetch_options(ctx: &Ctx, flags: &FetchRequest) -> Result<FetchOptions> {
    let mut options = base_options(ctx, &flags.mirror, flags.offline, flags.accept_tree_match)?;
    options.jobs = flags.jobs.max(1);
    options.retries = flags.retries;
    options.verify = flags.verify;
    Ok(options)
}

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

/// The artifacts to fetch: those of `--artifacts FILE` if given, else the lock's parts
/// that `--only` selects.
pub fn artifacts_for(ctx: &Ctx, flags: &FetchRequest) -> Result<Vec<Artifact>> {
    match flags.artifacts.as_deref() {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not a JSON list of artifacts", path.display()))
        }
        None => artifacts_of_parts(&read_lock(ctx)?, &flags.only),
    }
}
