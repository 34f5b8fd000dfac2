//! `commstack-verify`: the verify levels as a standalone binary, for places with no Rust
//! toolchain and no xtask (inside the image, where `cargo xtask build image --verify` runs it in a
//! container with no network). Same flags and exit codes as `cargo xtask verify`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Prove a Python environment holds the stack, level by level.
#[derive(Parser)]
#[command(name = "commstack-verify", version)]
struct Cli {
    #[command(flatten)]
    args: commstack_verify::cli::Args,
    /// Print only the report (no "report: PATH" line).
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match commstack_verify::cli::run(cli.args, PathBuf::from("reports"), cli.quiet) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
