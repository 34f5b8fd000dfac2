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

/// Copies the report of `summary` into the directory `to` (which must not exist):
/// `summary.json`, the ninja logs its steps name under `ninja/<step>/`, and
/// `timings.html` rendered from those copies (so it renders again from `to` alone, on any
/// machine). Returns the page's path.
pub fn copy_report(summary: &Path, to: &Path) -> Result<PathBuf> {
    if to.exists() {
        anyhow::bail!(
            "{}: it exists; give a directory that does not",
            to.display()
        );
    }
    let s = Summary::read(summary)?;
    let logs = summary::ninja_log_paths(&s, summary)?;
    let tmp = to.with_file_name(format!(
        ".{}.tmp",
        to.file_name()
            .map(|f| f.to_string_lossy())
            .unwrap_or_default()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let copy = || -> Result<()> {
        std::fs::create_dir_all(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        for (step, path) in &logs {
            let dir = tmp.join("ninja").join(step);
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let name = path.file_name().context("a ninja log's file name")?;
            std::fs::copy(path, dir.join(name))
                .with_context(|| format!("cannot copy {}", path.display()))?;
        }
        std::fs::copy(summary, tmp.join("summary.json"))
            .with_context(|| format!("cannot copy {}", summary.display()))?;
        write_beside(&tmp.join("summary.json"))?;
        Ok(())
    };
    if let Err(e) = copy() {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, to)
        .with_context(|| format!("cannot move the copy to {}", to.display()))?;
    Ok(to.join(FILE))
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
