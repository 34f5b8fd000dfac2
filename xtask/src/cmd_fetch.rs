//! `cargo xtask fetch`: every artifact of stack.lock into the verified download cache.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use commstack_fetch::{Artifact, FetchOptions, Fetched, Mirror, Origin, SourceOverride, Summary};

use crate::ctx::Ctx;
use crate::util::human;

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
    /// cache and reported by every run that uses it.
    #[arg(long)]
    pub accept_tree_match: bool,
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

/// A part of the lock, by the role its artifacts play.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Sources,
    Toolchain,
    Wheels,
    Replaced,
}

impl Part {
    fn of(role: commstack_stack::lock::Role) -> Part {
        use commstack_stack::lock::Role;
        match role {
            Role::Source => Part::Sources,
            Role::Toolchain => Part::Toolchain,
            Role::Package => Part::Wheels,
            Role::Replaced => Part::Replaced,
        }
    }
}

#[derive(clap::Args)]
#[command(after_help = "\
Every file is checked against its sha256 while it streams and appears in the cache
(<home>/cache) only once it matched. Interrupted downloads resume where they stopped.
Several fetches may run at once on one cache: each file is downloaded once.

Examples:
  cargo xtask fetch                                  # from upstream (PyPI, NVIDIA, GitHub)
  cargo xtask fetch --offline --mirror /media/bundle # air-gapped, from `mirror export`
  cargo xtask fetch --source nvshmem=../nvshmem_src  # development: marked as an override")]
pub struct Args {
    #[command(flatten)]
    pub flags: FetchFlags,
    /// Use a local directory or archive instead of the locked artifact NAME. For
    /// development only: it breaks reproducibility, and every output that follows marks
    /// it as an override. Repeatable.
    #[arg(long = "source", value_name = "NAME=PATH")]
    pub sources: Vec<SourceOverride>,
    /// Print the results as JSON (one object per artifact) instead of lines for people.
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let artifacts = artifacts_for(ctx, &args.flags)?;
    let mut options = fetch_options(ctx, &args.flags)?;
    options.overrides = args.sources;
    let start = Instant::now();
    let fetched = commstack_fetch::fetch_all(&artifacts, &options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&fetched)?);
    } else {
        print_fetched(&fetched, start.elapsed().as_secs_f64(), ctx.quiet);
    }
    Ok(ExitCode::SUCCESS)
}

/// The fetch options the flags ask for, with the cache under `ctx.home`.
pub fn fetch_options(ctx: &Ctx, flags: &FetchFlags) -> Result<FetchOptions> {
    let mut options = base_options(ctx, &flags.mirror, flags.offline, flags.accept_tree_match)?;
    options.jobs = flags.jobs.max(1);
    options.retries = flags.retries;
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
        None => artifacts_of_parts(&crate::util::read_lock(ctx)?, &flags.only),
    }
}

/// Every artifact of the stack's lock (sources, toolchain wheels, packages).
pub fn locked_artifacts(ctx: &Ctx) -> Result<Vec<Artifact>> {
    let lock = crate::util::read_lock(ctx)?;
    artifacts_of_lock(&lock).with_context(|| format!("in {}", ctx.lock_path().display()))
}

/// The one mapping from the lock's model to what the fetcher needs.
pub fn artifacts_of_lock(lock: &commstack_stack::Lock) -> Result<Vec<Artifact>> {
    artifacts_of_parts(lock, &[])
}

/// The lock's artifacts of the given parts (all of them when `parts` is empty).
pub fn artifacts_of_parts(lock: &commstack_stack::Lock, parts: &[Part]) -> Result<Vec<Artifact>> {
    lock.artifacts()
        .into_iter()
        .filter(|a| parts.is_empty() || parts.contains(&Part::of(a.role)))
        .map(|a| {
            let artifact = Artifact {
                name: a.name,
                filename: a.filename,
                urls: vec![a.url],
                sha256: a.sha256,
                size: a.size,
                tree_sha256: a.tree,
            };
            // An unpinned entry is not an error here: the fetch reports it beside the others.
            artifact.validate().map_err(anyhow::Error::msg)?;
            Ok(artifact)
        })
        .collect()
}

fn print_fetched(fetched: &[Fetched], seconds: f64, quiet: bool) {
    if !quiet {
        for item in fetched {
            let (what, from) = match &item.origin {
                Origin::Cache => ("cached", String::new()),
                Origin::Mirror { url } => ("mirror", format!("  <- {url}")),
                Origin::Upstream { url } => ("fetched", format!("  <- {url}")),
                Origin::Local { path } => ("local", format!("  <- {}", path.display())),
            };
            let bytes = match item.bytes_downloaded {
                0 => String::new(),
                n => human(n),
            };
            println!("{what:>8} {:<40} {bytes:>10}{from}", item.filename);
        }
    }
    // Always shown, even with --quiet: the lock's promise does not hold for these.
    for item in fetched {
        if let Some(deviation) = item.deviation() {
            println!("WARNING {deviation}");
        }
    }
    let s = Summary::of(fetched);
    println!(
        "{} artifacts: {} cached, {} from mirrors, {} downloaded ({} in {seconds:.1}s){}{}",
        s.artifacts,
        s.from_cache,
        s.from_mirror,
        s.from_upstream,
        human(s.bytes_downloaded),
        if s.overrides > 0 {
            format!(", {} OVERRIDDEN", s.overrides)
        } else {
            String::new()
        },
        if s.tree_matches > 0 {
            format!(", {} accepted by tree hash", s.tree_matches)
        } else {
            String::new()
        },
    );
}
