//! One known log line: what it means, when it appears, how bad it is and what to do.

use std::fmt;

use serde::{Deserialize, Serialize};

/// When in a job's life a line appears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Compiling or linking (DeepEP's setup.py, NVSHMEM's cmake).
    Build,
    /// Import, library loading, communicator / NVSHMEM initialisation.
    Init,
    /// While collectives and kernels run.
    Run,
    /// Interpreter and library teardown, after the work is done.
    Exit,
}

impl Phase {
    pub const ALL: [Phase; 4] = [Phase::Build, Phase::Init, Phase::Run, Phase::Exit];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Build => "build",
            Phase::Init => "init",
            Phase::Run => "run",
            Phase::Exit => "exit",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// How bad a line is. `Error` is fatal: the build or run did not work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }

    pub fn is_fatal(self) -> bool {
        self == Severity::Error
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// A known log line, as the knowledge base (`signatures.toml`) describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// Stable kebab-case name, e.g. `nccl-proxy-accept-failed`.
    pub id: String,
    pub phase: Phase,
    pub severity: Severity,
    /// What produces the line.
    pub cause: String,
    /// What to do about it.
    pub fix: String,
    /// The primary upstream issue, commit or doc page.
    pub reference: String,
    /// More upstream material.
    #[serde(default)]
    pub see_also: Vec<String>,
    /// The `regex` crate pattern matched against one line.
    pub regex: String,
    /// Literals of which every matching line contains one (the prefilter).
    pub needles: Vec<String>,
    /// Where the message text comes from (upstream source file and version, public report).
    pub source: String,
    /// Real lines this signature must recognise (checked by the tests).
    pub examples: Vec<String>,
}
