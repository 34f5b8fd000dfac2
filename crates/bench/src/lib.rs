//! The benchmarks `cargo xtask bench` runs; their lines go into docs/benchmarks.md (with
//! the command, the machine and the date). Targets are checked here, not in unit tests.
//!
//! One module per benchmark, each taking a plain request (clap lives in xtask): [`lock`],
//! [`fetch`], [`build`], [`deepep`], [`substitute`], [`deploy`]; logscan's own lives in commstack-logscan
//! ([`logscan`] runs it). Those that run `cargo xtask` as whole processes take the xtask
//! binary's path from the caller. [`stats`] holds what they share.

use std::process::ExitCode;

use anyhow::Result;

pub mod build;
pub mod deepep;
pub mod deploy;
pub mod fetch;
pub mod lock;
pub mod stats;
pub mod substitute;

/// `bench logscan`: logscan's throughput on a synthetic log of `mib` MiB, written to a
/// temporary directory; prints its line.
pub fn logscan(mib: u64) -> Result<ExitCode> {
    let dir = tempfile::tempdir()?;
    let result = commstack_logscan::bench::run(dir.path(), mib * 1024 * 1024)?;
    println!("{}", result.summary());
    Ok(ExitCode::SUCCESS)
}
