//! What the build recorded about an image, read back for its provenance: the image step's
//! files, the lock, and the run that made it (summary.json's rows, each keyed step's
//! `.step.json` in the store). Nothing here is invented: a field the build did not record
//! is left out of the provenance.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use commstack_image::Image;
use commstack_stack::Lock;
use serde::Deserialize;
use serde_json::Value;

/// One keyed step of the run, as the store records it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    /// The graph's step name (`nvshmem`, `image`, ...).
    pub step: String,
    /// reused, built, substituted (summary.json's outcome), or `in-store` when no summary
    /// of the run is at hand.
    pub outcome: String,
    /// The store directory (`pipeline-image-<32 hex>`).
    pub key: String,
    /// The inputs the key hashes (`.step.json`'s `inputs`).
    pub inputs: Value,
}

/// When the run that made the image started and finished (RFC 3339), from its summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunTimes {
    pub started: String,
    pub finished: String,
}

/// Everything the provenance is made from.
pub struct BuildRecord {
    /// The stack file as the command named it, and its sha256.
    pub stack_file: String,
    pub stack_sha256: String,
    /// The lock file as named, its sha256, and the lock.
    pub lock_file: String,
    pub lock_sha256: String,
    pub lock: Lock,
    pub image: Image,
    pub steps: Vec<StepRecord>,
    pub run: Option<RunTimes>,
}

/// summary.json's parts read here.
#[derive(Deserialize)]
struct Summary {
    #[serde(default)]
    started: Option<String>,
    seconds: f64,
    steps: Vec<SummaryRow>,
}

#[derive(Deserialize)]
struct SummaryRow {
    step: String,
    outcome: String,
    #[serde(default)]
    output: Option<PathBuf>,
    #[serde(default)]
    key: Option<String>,
}

impl BuildRecord {
    /// The record of `image` built from `stack` and its lock `lock_path`, with the run of
    /// `summary` (`<home>/pipeline/<stack>/summary.json`) when that run made or reused
    /// this very image; otherwise the image step's own record only.
    pub fn read(
        stack: &Path,
        lock_path: &Path,
        image: Image,
        summary: &Path,
        store_root: &Path,
    ) -> Result<BuildRecord> {
        let sha = |path: &Path| {
            commstack_digest::sha256_file(path)
                .with_context(|| format!("cannot read {}", path.display()))
        };
        let text = std::fs::read_to_string(lock_path)
            .with_context(|| format!("cannot read {}", lock_path.display()))?;
        let lock = Lock::parse(lock_path, &text).map_err(|d| anyhow::anyhow!("{d}"))?;
        let (steps, run) = match run_of(summary, &image, store_root)? {
            Some(found) => found,
            None => (vec![image_step_record(&image)?], None),
        };
        Ok(BuildRecord {
            stack_file: file_name(stack),
            stack_sha256: sha(stack)?,
            lock_file: file_name(lock_path),
            lock_sha256: sha(lock_path)?,
            lock,
            image,
            steps,
            run,
        })
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// The image crate step's own record, when no summary names the run.
fn image_step_record(image: &Image) -> Result<StepRecord> {
    let meta = read_meta(&image.dir)?;
    Ok(StepRecord {
        step: meta.step.clone(),
        outcome: "in-store".into(),
        key: file_name(&image.dir),
        inputs: meta.inputs,
    })
}

fn read_meta(dir: &Path) -> Result<commstack_store::StepMeta> {
    let path = dir.join(commstack_store::META_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (the step's record in the store; a step removed by `cargo xtask store gc` is made again by `cargo xtask build`)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a step record", path.display()))
}

/// The keyed steps and times of the run `summary` records, if its image row's output is
/// `image`'s directory (a summary of another stack's or an older build says nothing of it).
fn run_of(
    summary: &Path,
    image: &Image,
    store_root: &Path,
) -> Result<Option<(Vec<StepRecord>, Option<RunTimes>)>> {
    let Ok(text) = std::fs::read_to_string(summary) else {
        return Ok(None);
    };
    let summary: Summary = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a build summary", summary.display()))?;
    let same = |p: &Path| {
        let canon = |p: &Path| std::fs::canonicalize(p).ok();
        canon(p).is_some() && canon(p) == canon(&image.dir)
    };
    if !summary
        .steps
        .iter()
        .any(|r| r.step == "image" && r.output.as_deref().is_some_and(same))
    {
        return Ok(None);
    }
    let mut steps = Vec::new();
    for row in &summary.steps {
        let Some(key) = &row.key else { continue };
        let meta = read_meta(&store_root.join("steps").join(key))?;
        steps.push(StepRecord {
            step: row.step.clone(),
            outcome: row.outcome.clone(),
            key: key.clone(),
            inputs: meta.inputs,
        });
    }
    let run = summary
        .started
        .as_deref()
        .and_then(|s| times(s, summary.seconds));
    Ok(Some((steps, run)))
}

/// (start, start + seconds) in RFC 3339, whole seconds.
fn times(started: &str, seconds: f64) -> Option<RunTimes> {
    let start: jiff::Timestamp = started.parse().ok()?;
    let end = start
        .checked_add(jiff::SignedDuration::from_secs_f64(seconds.max(0.0)))
        .ok()?
        .round(jiff::Unit::Second)
        .ok()?;
    Some(RunTimes {
        started: start.to_string(),
        finished: end.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_finishes_its_seconds_after_it_started() {
        let t = times("2026-12-04T20:35:29Z", 4593.3).unwrap();
        assert_eq!(t.started, "2026-12-04T20:35:29Z");
        assert_eq!(t.finished, "2026-12-04T21:52:02Z");
        assert!(times("not a time", 1.0).is_none());
    }
}
