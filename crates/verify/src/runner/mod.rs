//! The test runner: runs one Python test (a function of a file, or a script) in its own
//! process through a wrapper that prints a sentinel when the test returns, captures its
//! output with time stamps, and applies the exit-clean gate to what follows the sentinel.
//! A test that never reaches its sentinel is reported as not finished, never as passed.

mod gate;
mod sentinel;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

pub use gate::{GateFinding, GateResult, exit_clean_gate};
pub use sentinel::{Sentinel, parse_sentinel};

use crate::check::{Check, Status};
use crate::process::{Captured, Exit, run_captured};

const WRAPPER_PY: &str = include_str!("wrapper.py");
const CHILD_SITECUSTOMIZE_PY: &str = include_str!("child/sitecustomize.py");

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TestTarget {
    /// `FILE:FUNCTION`, called with no arguments; an int return value is its rc.
    Function { file: PathBuf, function: String },
    /// `python FILE ARGS...`, as `__main__`.
    Script { file: PathBuf, args: Vec<String> },
}

#[derive(Debug, Clone, Serialize)]
pub struct TestSpec {
    /// Unique in a run; no spaces (it is part of the sentinel line).
    pub name: String,
    pub target: TestTarget,
    pub timeout: Duration,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// Also mark the end of each multiprocessing child (a test's ranks), so that their
    /// teardown is judged too. On for tests that spawn ranks.
    pub mark_children: bool,
}

impl TestSpec {
    pub fn function(name: &str, file: &Path, function: &str) -> TestSpec {
        TestSpec::new(
            name,
            TestTarget::Function {
                file: file.to_path_buf(),
                function: function.into(),
            },
        )
    }

    pub fn script(name: &str, file: &Path, args: &[&str]) -> TestSpec {
        TestSpec::new(
            name,
            TestTarget::Script {
                file: file.to_path_buf(),
                args: args.iter().map(|a| a.to_string()).collect(),
            },
        )
    }

    fn new(name: &str, target: TestTarget) -> TestSpec {
        TestSpec {
            name: name.into(),
            target,
            timeout: Duration::from_secs(600),
            env: Vec::new(),
            cwd: None,
            mark_children: true,
        }
    }
}

/// How the test itself went (the gate judges its teardown separately).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TestOutcome {
    Passed,
    Failed {
        rc: i32,
    },
    /// No sentinel: it crashed, hung or exited from inside the test.
    NotFinished {
        exit: Exit,
    },
}

#[derive(Debug, Clone, Serialize)]
pub struct TestRun {
    pub name: String,
    pub outcome: TestOutcome,
    pub gate: GateResult,
    pub captured: Captured,
}

impl TestRun {
    /// The two report lines of this test: `tests.NAME` and `exit-clean.NAME`.
    pub fn checks(&self) -> [Check; 2] {
        let test_name = format!("tests.{}", self.name);
        let test = match &self.outcome {
            TestOutcome::Passed => Check::pass(
                &test_name,
                format!(
                    "returned 0 in {:.1} s",
                    self.captured.wall_ms as f64 / 1000.0
                ),
            ),
            TestOutcome::Failed { rc } => Check::fail(
                &test_name,
                format!("returned rc={rc}; last lines:\n{}", self.tail(12)),
                "read the test's log beside the report",
            ),
            TestOutcome::NotFinished { exit } => Check::fail(
                &test_name,
                format!(
                    "never returned: the process {exit} inside the test; last lines:\n{}",
                    self.tail(12)
                ),
                "read the test's log beside the report: a crash or hang inside the test is a failure, not a pass",
            ),
        };
        let gate_name = format!("exit-clean.{}", self.name);
        let gate = match self.gate.status {
            Status::Passed => Check::pass(&gate_name, self.gate.summary.clone()),
            Status::NotRun => Check::not_run(&gate_name, self.gate.summary.clone()),
            Status::Failed => {
                let mut detail = self.gate.summary.clone();
                let mut fixes: Vec<String> = Vec::new();
                for f in &self.gate.fatal {
                    detail.push_str(&format!("\n  {}\n    cause: {}", f.line.text, f.cause));
                    if let Some(r) = &f.reference {
                        detail.push_str(&format!(" ({r})"));
                    }
                    if !fixes.contains(&f.fix) {
                        fixes.push(f.fix.clone());
                    }
                }
                if fixes.is_empty() {
                    fixes.push("find what crashes at exit: run the test under gdb or with faulthandler enabled".into());
                }
                Check::fail(&gate_name, detail, fixes.join("; "))
            }
        };
        [test, gate]
    }

    fn tail(&self, n: usize) -> String {
        let lines: Vec<&str> = self
            .captured
            .lines
            .iter()
            .map(|l| l.text.as_str())
            .collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Runs `spec` with `python`.
pub fn run_test(python: &Path, spec: &TestSpec) -> Result<TestRun> {
    anyhow::ensure!(
        !spec.name.is_empty() && !spec.name.contains(char::is_whitespace),
        "test name `{}` must be one word: it is part of the sentinel line",
        spec.name
    );
    let scripts = tempfile::tempdir().context("creating a directory for the test wrapper")?;
    let wrapper = scripts.path().join("commstack_test_wrapper.py");
    std::fs::write(&wrapper, WRAPPER_PY)
        .with_context(|| format!("writing {}", wrapper.display()))?;
    let mut cmd = Command::new(python);
    cmd.arg(&wrapper);
    match &spec.target {
        TestTarget::Function { file, function } => {
            cmd.args(["function", &spec.name])
                .arg(format!("{}:{function}", file.display()));
        }
        TestTarget::Script { file, args } => {
            cmd.args(["script", &spec.name]).arg(file).args(args);
        }
    }
    cmd.env("PYTHONUNBUFFERED", "1")
        .env("PYTHONFAULTHANDLER", "1");
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    if spec.mark_children {
        let child = scripts.path().join("child");
        std::fs::create_dir_all(&child).with_context(|| format!("creating {}", child.display()))?;
        std::fs::write(child.join("sitecustomize.py"), CHILD_SITECUSTOMIZE_PY)
            .with_context(|| format!("writing {}", child.display()))?;
        let inherited = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PYTHONPATH")
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var("PYTHONPATH").ok())
            .filter(|p| !p.is_empty());
        let path = match inherited {
            Some(rest) => format!("{}:{rest}", child.display()),
            None => child.display().to_string(),
        };
        cmd.env("PYTHONPATH", path)
            .env("COMMSTACK_TEST_NAME", &spec.name);
    }
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    let captured =
        run_captured(cmd, spec.timeout).with_context(|| format!("running test {}", spec.name))?;
    let main = captured
        .lines
        .iter()
        .filter_map(|l| parse_sentinel(&l.text))
        .find(|s| s.name == spec.name);
    let outcome = match main {
        Some(s) if s.rc == 0 => TestOutcome::Passed,
        Some(s) => TestOutcome::Failed { rc: s.rc },
        None => TestOutcome::NotFinished {
            exit: captured.exit,
        },
    };
    let gate = exit_clean_gate(&spec.name, &captured);
    Ok(TestRun {
        name: spec.name.clone(),
        outcome,
        gate,
        captured,
    })
}
