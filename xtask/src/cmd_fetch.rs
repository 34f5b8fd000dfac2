//! `cargo xtask fetch`: every artifact of stack.lock into the verified download cache.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use commstack_fetch::{Fetched, Origin, SourceOverride, Summary};

use commstack_steps::ctx::Ctx;
use commstack_steps::flow::fetch::{artifacts_for, fetch_options};
use commstack_steps::util::human;

use crate::args::FetchFlags;

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
    let request = args.flags.into();
    let artifacts = artifacts_for(ctx, &request)?;
    let mut options = fetch_options(ctx, &request)?;
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
