//! The parts of a build's `summary.json` the page reads: each step's outcome and times,
//! the verify levels, the failure; and the ninja logs the steps name in their facts.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::ninja::{NinjaLog, parse_ninja_log};

/// A build's summary (written by `cargo xtask build`).
#[derive(Clone, Debug, Deserialize)]
pub struct Summary {
    pub stack: String,
    pub lock: String,
    pub ok: bool,
    /// The whole command's seconds (the lock and the summary included).
    pub seconds: f64,
    /// When the run started (RFC 3339), when the summary records it.
    #[serde(default)]
    pub started: Option<String>,
    /// Seconds from the command's start to the graph's run (the lock, the plan): the
    /// steps' times count from the run.
    #[serde(default)]
    pub run_offset: f64,
    pub steps: Vec<Step>,
    #[serde(default)]
    pub verify: Vec<Verify>,
    #[serde(default)]
    pub failed: Option<Failed>,
}

/// One step's row.
#[derive(Clone, Debug, Deserialize)]
pub struct Step {
    pub step: String,
    /// reused, built, substituted, skipped, failed, not-run
    pub outcome: String,
    pub seconds: f64,
    /// Seconds since the run started; absent in summaries of builds before they were
    /// recorded.
    #[serde(default)]
    pub start: Option<f64>,
    #[serde(default)]
    pub end: Option<f64>,
    #[serde(default)]
    pub wait: Option<f64>,
    #[serde(default)]
    pub beside: Option<String>,
    #[serde(default)]
    pub output: Option<PathBuf>,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub facts: serde_json::Value,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Verify {
    pub level: String,
    pub status: String,
    #[serde(default)]
    pub why: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Failed {
    pub step: String,
    #[serde(default)]
    pub error: Vec<String>,
}

impl Step {
    /// (start, end, wait), which every step of a summary with times has.
    pub fn times(&self) -> (f64, f64, f64) {
        (
            self.start.unwrap_or(0.0),
            self.end.unwrap_or(0.0),
            self.wait.unwrap_or(0.0),
        )
    }

    /// Whether the step was made in this run (built, pulled, or failed while made).
    pub fn made(&self) -> bool {
        matches!(self.outcome.as_str(), "built" | "substituted" | "failed")
    }
}

impl Summary {
    /// The summary at `path`; refused when its steps carry no start and end (a build
    /// before they were recorded).
    pub fn read(path: &Path) -> Result<Summary> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let s: Summary = serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: not a build summary (cargo xtask build writes one as <home>/pipeline/<stack>/summary.json)",
                path.display()
            )
        })?;
        if let Some(step) = s
            .steps
            .iter()
            .find(|r| r.start.is_none() || r.end.is_none())
        {
            bail!(
                "{}: step {} has no start and end times (a build before they were recorded): run `cargo xtask build --timings` again",
                path.display(),
                step.step
            );
        }
        Ok(s)
    }

    /// The end of the timeline (seconds since the run started): the last step's end, or
    /// the end of the whole command when later.
    pub fn span(&self) -> f64 {
        self.steps
            .iter()
            .map(|s| s.times().1)
            .fold(self.seconds - self.run_offset, f64::max)
    }

    /// The steps that ran at the same time as `step`, any part of it.
    pub fn beside(&self, step: &Step) -> Vec<&str> {
        let (a0, a1, _) = step.times();
        self.steps
            .iter()
            .filter(|o| o.step != step.step && o.made() && step.made())
            .filter(|o| {
                let (b0, b1, _) = o.times();
                b0 < a1 && a0 < b1
            })
            .map(|o| o.step.as_str())
            .collect()
    }
}

/// Facts key of the ninja logs a step kept (paths).
pub const NINJA_LOGS: &str = "ninja_logs";

/// The ninja log files of the steps built in this run, in step order: for each path a
/// step's facts name, the file of the same name in `<summary dir>/ninja/<step>/` (where a
/// copied report keeps them) when there is one, else that path; an error names a log
/// found in neither.
pub fn ninja_log_paths(s: &Summary, summary: &Path) -> Result<Vec<(String, PathBuf)>> {
    let dir = summary.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for step in s.steps.iter().filter(|r| r.outcome == "built") {
        let Some(paths) = step.facts.get(NINJA_LOGS).and_then(|v| v.as_array()) else {
            continue;
        };
        for p in paths.iter().filter_map(|p| p.as_str()) {
            let named = PathBuf::from(p);
            let kept = named
                .file_name()
                .map(|f| dir.join("ninja").join(&step.step).join(f));
            let path = match kept {
                // A copied report's own logs first: they are the ones it was rendered from.
                Some(k) if k.is_file() => k,
                _ if named.is_file() => named,
                _ => bail!(
                    "the ninja log {} that step {} of {} names is gone, and {}/ninja/{}/ has none of its name (copy it there to render this summary elsewhere)",
                    named.display(),
                    step.step,
                    summary.display(),
                    dir.display(),
                    step.step
                ),
            };
            out.push((step.step.clone(), path));
        }
    }
    Ok(out)
}

/// The ninja logs of [`ninja_log_paths`], read.
pub fn ninja_logs(s: &Summary, summary: &Path) -> Result<Vec<(String, NinjaLog)>> {
    let mut out = Vec::new();
    for (step, path) in ninja_log_paths(s, summary)? {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let log = parse_ninja_log(&text)
            .with_context(|| format!("{}: not a ninja log", path.display()))?;
        let name = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push((step, NinjaLog { name, ..log }));
    }
    Ok(out)
}
