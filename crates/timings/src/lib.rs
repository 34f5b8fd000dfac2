//! `cargo xtask build --timings`: the build's steps on a timeline (when each started and
//! ended, how long it waited and ran, what ran beside it), NVSHMEM's and DeepEP's compile
//! jobs as nested timelines read from their ninja logs, and the summary table, as one HTML
//! page with inline SVG and CSS (no script, no network). Modelled on cargo's `--timings`.
//!
//! The page is a pure function of `summary.json` and the ninja logs its steps name: the
//! same files render the same bytes (`cargo xtask timings SUMMARY.json`).
//!
//! - `summary`: the parts of `summary.json` the page reads.
//! - `ninja`: `.ninja_log` files as compile jobs, packed into lanes.
//! - `svg`: scales, ticks and text escaping (imports nothing of this crate).
//! - `page`: the page itself.

mod ninja;
mod page;
mod summary;
mod svg;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub use ninja::{Job, NinjaLog, parse_ninja_log};
pub use summary::{Step, Summary};

/// The page's file name, beside summary.json.
pub const FILE: &str = "timings.html";

/// The page of the build that `summary` (a summary.json) records.
pub fn render(summary: &Path) -> Result<String> {
    let s = Summary::read(summary)?;
    let logs = summary::ninja_logs(&s, summary)?;
    Ok(page::page(&s, &logs))
}

/// Renders the page of `summary` into `timings.html` beside it (written atomically);
/// returns its path.
pub fn write_beside(summary: &Path) -> Result<PathBuf> {
    let html = render(summary)?;
    let dir = summary
        .parent()
        .with_context(|| format!("{}: no directory", summary.display()))?;
    let out = dir.join(FILE);
    commstack_store::write_all_atomically(&[(&out, &html)])?;
    Ok(out)
}
