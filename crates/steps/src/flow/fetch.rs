//! Fetch options and the artifact list from the command line, for the commands that fetch
//! (`fetch`, `mirror export`, and `build` / `gpu-bundle` on the way).

use anyhow::{Context, Result};
use commstack_fetch::{Artifact, FetchOptions};

use crate::ctx::Ctx;
pub use crate::flow::fetch_options::base_options;
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
