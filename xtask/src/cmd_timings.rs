//! `cargo xtask timings SUMMARY.json`: a build's timings page again, from its summary.json
//! and the ninja logs its steps name (what `build --timings` writes).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use commstack_steps::ctx::Ctx;

#[derive(clap::Args)]
#[command(after_help = "\
The page (one HTML file: inline SVG and CSS, no script, no network) shows every step on a
timeline with its wait and run time and what ran beside it, NVSHMEM's and DeepEP's compile
jobs from their ninja logs, and the summary table. Each ninja log a step names is read from
<summary dir>/ninja/<step>/ when it is there (a report made with --copy-to), else from the
path the step names.")]
pub struct Args {
    /// A build's summary.json (`cargo xtask build` writes <home>/pipeline/<stack>/summary.json).
    #[arg(value_name = "SUMMARY.json")]
    summary: PathBuf,
    /// Where to write the page (default: timings.html beside the summary).
    #[arg(long, short, value_name = "FILE.html", conflicts_with = "copy_to")]
    out: Option<PathBuf>,
    /// Copy the report into DIR (which must not exist): summary.json, the ninja logs under
    /// ninja/<step>/, and timings.html rendered from them, so that it renders again from
    /// DIR alone (how docs/timings-example/ was made).
    #[arg(long, value_name = "DIR")]
    copy_to: Option<PathBuf>,
}

pub fn run(_ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let out = match (args.out, args.copy_to) {
        (_, Some(dir)) => commstack_timings::copy_report(&args.summary, &dir)?,
        (None, None) => commstack_timings::write_beside(&args.summary)?,
        (Some(out), None) => {
            let html = commstack_timings::render(&args.summary)?;
            std::fs::write(&out, html)
                .with_context(|| format!("cannot write {}", out.display()))?;
            out
        }
    };
    println!("{}", out.display());
    Ok(ExitCode::SUCCESS)
}
