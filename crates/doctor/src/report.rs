//! The doctor's report: one entry per check, each pass / warn / fail / skip with a finding and a fix.

use std::fmt::{self, Write};

use serde::{Deserialize, Serialize};

/// The version of the JSON report's shape.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    /// Works, but something the stack may need is missing or off.
    Warn,
    /// The stack cannot work here as it is.
    Fail,
    /// Not applicable, or nothing to look at.
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One host check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    /// Stable name, e.g. `ibgda-stream-memops`.
    pub id: String,
    pub title: String,
    pub status: Status,
    /// One line: what was found.
    pub finding: String,
    /// What to do, when the status is not `pass`.
    pub fix: Option<String>,
    /// Supporting facts (one per line): devices, values, variables.
    pub details: Vec<String>,
}

impl Check {
    pub(crate) fn new(id: &str, title: &str, status: Status, finding: impl Into<String>) -> Check {
        Check {
            id: id.into(),
            title: title.into(),
            status,
            finding: finding.into(),
            fix: None,
            details: Vec::new(),
        }
    }

    pub(crate) fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }

    pub(crate) fn details(mut self, details: Vec<String>) -> Check {
        self.details = details;
        self
    }
}

/// Everything the doctor found on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub schema_version: u32,
    /// The directory /proc, /sys and /dev were read under (`/` for the live host).
    pub root: String,
    /// Where nvidia-smi output came from: `live` or the recorded directory.
    pub nvidia_smi: String,
    /// The CUDA version the stack needs, e.g. `13.0`.
    pub required_cuda: String,
    pub checks: Vec<Check>,
}

impl DoctorReport {
    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    pub fn has_fail(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// The report for a terminal.
pub fn render_human(report: &DoctorReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "commstack doctor — root {}, nvidia-smi {}, stack CUDA {}\n",
        report.root, report.nvidia_smi, report.required_cuda
    );
    let width = report.checks.iter().map(|c| c.id.len()).max().unwrap_or(0);
    for check in &report.checks {
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {}",
            check.status.as_str().to_uppercase(),
            check.id,
            check.finding
        );
        for detail in &check.details {
            let _ = writeln!(out, "      {:<width$}  · {detail}", "");
        }
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "      {:<width$}  fix: {fix}", "");
        }
    }
    let _ = writeln!(
        out,
        "\n{} pass, {} warn, {} fail, {} skip",
        report.count(Status::Pass),
        report.count(Status::Warn),
        report.count(Status::Fail),
        report.count(Status::Skip)
    );
    out
}
