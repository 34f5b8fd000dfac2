//! The vocabulary every level reports in: a check passed, failed (with cause and fix) or
//! could not run (with why). A check that could not run is never counted as passed.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Passed,
    /// Could not run here (no GPU, a module absent, nothing expected given): not passed.
    NotRun,
    Failed,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Passed => "passed",
            Status::NotRun => "not run",
            Status::Failed => "FAILED",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short and stable: `nvshmem-host.mapped-once`.
    pub name: String,
    pub status: Status,
    /// What was found (for a pass) or what is wrong and why (for a failure).
    pub detail: String,
    /// What to do about a failure or a check that could not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(name: &str, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Passed,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Failed,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    pub fn not_run(name: &str, why: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::NotRun,
            detail: why.into(),
            fix: None,
        }
    }

    pub fn not_run_fix(name: &str, why: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::NotRun,
            detail: why.into(),
            fix: Some(fix.into()),
        }
    }
}

/// A set of checks' overall status: failed if any failed, not run if any could not run,
/// passed only when every one passed (and there was at least one).
pub fn overall(checks: &[Check]) -> Status {
    checks
        .iter()
        .map(|c| c.status)
        .max()
        .unwrap_or(Status::NotRun)
}
