//! The verify report: versioned JSON (`"schema": 1`) and a human table, written beside
//! the artifacts under the key of the environment it verified.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::check::{Check, Status, overall};
use crate::environment::{EnvironmentKey, PythonEnv};
use crate::expect::Expectations;

pub const REPORT_SCHEMA: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Level {
    Static,
    Runtime,
    Selftest,
    Tests,
    ExitClean,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::Static,
        Level::Runtime,
        Level::Selftest,
        Level::Tests,
        Level::ExitClean,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Static => "static",
            Level::Runtime => "runtime",
            Level::Selftest => "selftest",
            Level::Tests => "tests",
            Level::ExitClean => "exit-clean",
        }
    }
}

impl FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Level, String> {
        Level::ALL
            .into_iter()
            .find(|l| l.as_str() == s)
            .ok_or_else(|| {
                format!("unknown level `{s}`: use static, runtime, selftest, tests or exit-clean")
            })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    pub level: Level,
    pub status: Status,
    /// Why the level did not run at all (not requested, no GPU, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_run_because: Option<String>,
    pub checks: Vec<Check>,
    /// The level's findings (libraries read, mapped files, captured tests).
    pub details: serde_json::Value,
}

impl LevelReport {
    pub fn ran(level: Level, checks: Vec<Check>, details: serde_json::Value) -> LevelReport {
        LevelReport {
            level,
            status: overall(&checks),
            not_run_because: None,
            checks,
            details,
        }
    }

    pub fn not_run(level: Level, why: impl Into<String>) -> LevelReport {
        LevelReport {
            level,
            status: Status::NotRun,
            not_run_because: Some(why.into()),
            checks: Vec::new(),
            details: serde_json::Value::Null,
        }
    }

    pub fn failed(level: Level, error: &anyhow::Error) -> LevelReport {
        let chain: Vec<String> = error.chain().map(|c| c.to_string()).collect();
        LevelReport::ran(
            level,
            vec![Check::fail(
                &format!("{}.ran", level.as_str()),
                chain.join(": "),
                "fix the error above and verify again",
            )],
            serde_json::Value::Null,
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: u32,
    pub tool: String,
    pub generated_at: String,
    pub environment: EnvironmentReport,
    pub expectations: Expectations,
    /// The levels asked for.
    pub requested: Vec<Level>,
    pub levels: Vec<LevelReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EnvironmentReport {
    /// `python` (an interpreter's environment here) or `image` (an image's layers).
    pub kind: &'static str,
    pub python: PythonEnv,
    pub key: EnvironmentKey,
    /// For `image`: its ID and each layer, read here or taken from an earlier read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageEnvironment>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ImageEnvironment {
    /// `sha256:<hex>`: the ID Docker gives the image.
    pub id: String,
    /// Bottom first.
    pub layers: Vec<LayerRead>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LayerRead {
    pub diff_id: String,
    /// Read from its tar by this verify (false: its index was kept from an earlier one).
    pub read: bool,
}

impl Report {
    /// Failed if a requested level failed, not run if one could not run, else passed.
    pub fn status(&self) -> Status {
        self.levels
            .iter()
            .filter(|l| self.requested.contains(&l.level))
            .map(|l| l.status)
            .max()
            .unwrap_or(Status::NotRun)
    }

    /// 0 passed, 1 failed, 2 something requested could not run.
    pub fn exit_code(&self) -> u8 {
        match self.status() {
            Status::Passed => 0,
            Status::Failed => 1,
            Status::NotRun => 2,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the report serializes")
    }

    /// The table a person reads first, then every failure and not-run with its fix.
    pub fn human(&self) -> String {
        let mut out = String::new();
        let env = &self.environment;
        let _ = writeln!(
            out,
            "commstack verify: {} (Python {}, environment {})",
            env.python.executable.display(),
            env.python.version,
            env.key.id
        );
        let _ = writeln!(out, "{:<11} {:<8} checks", "level", "status");
        for l in &self.levels {
            let counts = |s: Status| l.checks.iter().filter(|c| c.status == s).count();
            let summary = match &l.not_run_because {
                Some(why) => why.clone(),
                None => {
                    let mut s = format!("{}/{} passed", counts(Status::Passed), l.checks.len());
                    if counts(Status::Failed) > 0 {
                        s.push_str(&format!(", {} failed", counts(Status::Failed)));
                    }
                    if counts(Status::NotRun) > 0 {
                        s.push_str(&format!(", {} not run", counts(Status::NotRun)));
                    }
                    s
                }
            };
            let requested = if self.requested.contains(&l.level) || l.not_run_because.is_some() {
                ""
            } else {
                " (not requested)"
            };
            let _ = writeln!(
                out,
                "{:<11} {:<8} {summary}{requested}",
                l.level.as_str(),
                l.status.to_string()
            );
        }
        for (title, status) in [("Failed", Status::Failed), ("Not run", Status::NotRun)] {
            let rows: Vec<(&LevelReport, &Check)> = self
                .levels
                .iter()
                .flat_map(|l| l.checks.iter().map(move |c| (l, c)))
                .filter(|(_, c)| c.status == status)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{title}:");
            for (_, c) in rows {
                let _ = writeln!(out, "  {}: {}", c.name, indent(&c.detail));
                if let Some(fix) = &c.fix {
                    let _ = writeln!(out, "    fix: {}", indent(fix));
                }
            }
        }
        let _ = writeln!(out, "\nverdict: {}", self.status());
        out
    }

    /// Writes `verify-<env id>.json` and `.txt` into `dir`, each through a temporary file
    /// renamed into place. Returns the JSON path.
    pub fn write_to(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the report directory {}", dir.display()))?;
        let base = format!("verify-{}", self.environment.key.id);
        let json = dir.join(format!("{base}.json"));
        write_atomic(&json, self.to_json().as_bytes())?;
        write_atomic(&dir.join(format!("{base}.txt")), self.human().as_bytes())?;
        Ok(json)
    }
}

fn indent(text: &str) -> String {
    text.replace('\n', "\n      ")
}

/// Writes `bytes` to `path` through a temporary file in the same directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}
