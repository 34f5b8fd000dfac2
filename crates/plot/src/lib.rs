//! The self-test's bandwidth as a picture: put, get and copy (GB/s) against the message
//! size on a log2 axis (4 KiB to 256 MiB by default), and below it put and get as a
//! percentage of copy, one line per run when given several of the self-test's JSON
//! reports (`commstack-selftest --json`). Drawn by plotters' SVG backend: text stays SVG
//! text, so no font file or fontconfig is read.
//!
//! - `curves`: the points of one report (each run's lowest rank, to and from itself).
//! - `chart`: the SVG.

mod chart;
mod curves;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use chart::{COPY_COLOURS, GET_COLOURS, PUT_COLOURS};
pub use curves::{Curves, Run, read_run};

/// Reads the reports at `paths` and writes their plot to `out` (SVG); returns the runs.
pub fn write(paths: &[PathBuf], out: &Path) -> Result<Vec<Run>> {
    let runs = paths
        .iter()
        .map(|p| read_run(p))
        .collect::<Result<Vec<_>>>()?;
    let svg = chart::svg(&runs)?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Written whole or not at all.
    let tmp = out.with_extension("svg.tmp");
    std::fs::write(&tmp, svg).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(runs)
}

/// The SVG of `runs`.
pub fn svg(runs: &[Run]) -> Result<String> {
    chart::svg(runs)
}
