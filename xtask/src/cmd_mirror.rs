//! `cargo xtask mirror export DIR`: the air-gap bundle.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_fetch::{MIRROR_MANIFEST, export_mirror, fetch_all, preflight};

use commstack_steps::ctx::Ctx;
use commstack_steps::flow::fetch::{artifacts_for, fetch_options};

use crate::args::FetchFlags;
use commstack_steps::util::human;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Write every locked artifact into DIR under its upstream file name, with a manifest
    /// (commstack-mirror.json: name, filename, sha256, size). Fetches what the cache lacks
    /// first. Carry DIR to a machine with no network and run
    /// `cargo xtask fetch --offline --mirror DIR` there.
    #[command(after_help = "\
Example:
  cargo xtask mirror export /media/usb/commstack-bundle
  # on the air-gapped machine:
  cargo xtask fetch --offline --mirror /media/usb/commstack-bundle")]
    Export {
        /// The directory to write (created if needed; files already there with the right
        /// bytes are kept).
        dir: PathBuf,
        #[command(flatten)]
        flags: FetchFlags,
    },
}

pub fn run(ctx: &Ctx, cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::Export { dir, flags } => {
            let request = flags.into();
            let artifacts = artifacts_for(ctx, &request)?;
            let options = fetch_options(ctx, &request)?;
            // Every artifact must be reachable before gigabytes of the others are fetched.
            preflight(&artifacts, &options)?;
            let fetched = fetch_all(&artifacts, &options)?;
            let report = export_mirror(&fetched, &dir)?;
            for item in &fetched {
                if let Some(deviation) = item.deviation() {
                    println!("WARNING {deviation}");
                }
            }
            println!(
                "{}: {} artifacts ({} copied, {} already there, {} written) and {MIRROR_MANIFEST}",
                dir.display(),
                report.manifest.artifacts.len(),
                report.copied,
                report.kept,
                human(report.bytes_copied)
            );
            println!(
                "use it with: cargo xtask fetch --offline --mirror {}",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
