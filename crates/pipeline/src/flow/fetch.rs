//! Fetch options and the artifact list from the command line, for the commands that fetch
//! (`fetch`, `mirror export`, and `build` / `gpu-bundle` on the way).

use std::path::PathBuf;

use anyhow::{Context, Result};
use commstack_fetch::{Artifact, FetchOptions, Mirror};

use crate::ctx::Ctx;
use crate::flow::lock::{Part, artifacts_of_parts, read_lock};

/// Where the artifacts come from and how to get them; shared by `fetch` and `mirror export`.
#[derive(clap::Args, Clone, Debug)]
pub struct FetchFlags {
    /// A mirror tried before upstream: a directory of files named as upstream names them
    /// (as `cargo xtask mirror export` writes), a file:// URL, or an http(s) base URL.
    /// Repeat to give several; they are tried in order.
    #[arg(long, value_name = "DIR|URL")]
    pub mirror: Vec<String>,
    /// Open no network connection: use only the cache and mirror directories, and fail
    /// with the list of everything missing.
    #[arg(long)]
    pub offline: bool,
    /// Downloads at once.
    #[arg(long, short, value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Retries of one URL after failures that brought no bytes (5xx, 429, resets,
    /// timeouts), with exponential backoff.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub retries: u32,
    /// Accept a source archive whose sha256 differs from the lock when its unpacked tree
    /// hash equals the lock's (the same release from another origin). Recorded in the
    /// cache with the archive's own sha256: later runs use it without the flag, hold it
    /// to that sha256, and report it.
    #[arg(long)]
    pub accept_tree_match: bool,
    /// Hash every cached file before trusting it; a damaged one is moved to the cache's
    /// quarantine/ (kept to inspect) and downloaded again.
    #[arg(long)]
    pub verify: bool,
    /// Fetch the artifacts listed in this JSON file instead of the lock's: an array of
    /// {"name", "filename", "urls": [..], "sha256", "size"?, "tree_sha256"?}.
    /// For benchmarks and tests.
    #[arg(long, value_name = "FILE")]
    pub artifacts: Option<PathBuf>,
    /// Only these parts of the lock (comma-separated): `sources` (NVSHMEM, DeepEP),
    /// `toolchain` (CUDA compiler wheels, cmake, ninja), `wheels` (the target's Python
    /// closure), `replaced` (wheels the stack replaces, kept for comparison). Default: all.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "PART,...")]
    pub only: Vec<Part>,
}

/// The fetch options the flags ask for, with the cache under `ctx.home`.
pub fn fetch_options(ctx: &Ctx, flags: &FetchFlags) -> Result<FetchOptions> {
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
pub fn artifacts_for(ctx: &Ctx, flags: &FetchFlags) -> Result<Vec<Artifact>> {
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
