//! Running a plan: each step that is not reused, in order, built here or pulled from the
//! binary cache, timed, logged and sealed in the store; the first failure stops the run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::engine::Engine;
use crate::plan::{Plan, Planned, Status};
use crate::record::Record;
use crate::step::{
    Done, RESULT_FILE, Shipped, StepId, StepResult, Steps, StoredResult, not_shipped,
    with_ancestors,
};
use commstack_store::Store;

/// How one step of a run ended, for the summary.
#[derive(Clone, Debug, Serialize)]
pub struct Ran<S: StepId> {
    pub step: S,
    /// reused, built, substituted, skipped, failed, not-run
    pub outcome: &'static str,
    pub seconds: f64,
    /// When the step started and ended, in seconds since the run started (a step not
    /// made here, reused or skipped, starts and ends when the run passed it).
    pub start: f64,
    pub end: f64,
    /// Seconds between the moment every step it reads had ended (or the run started) and
    /// its start: the time it waited for a step it does not read, since steps run one at
    /// a time unless two may run beside each other. 0 for a step not made here.
    pub wait: f64,
    /// The step that ran at the same time as this one, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub beside: Option<S>,
    pub output: Option<PathBuf>,
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub facts: serde_json::Value,
    /// The output entered without a trusted signature (pulled so, now or before): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsigned: Option<String>,
}

/// The result of [`Engine::run`]: a row per step, and the error of the step that failed
/// with its log.
pub struct RunReport<S: StepId> {
    pub rows: Vec<Ran<S>>,
    pub failed: Option<(S, anyhow::Error, PathBuf)>,
}

impl<S: StepId> Engine<'_, S> {
    /// Runs the plan's steps that are not reused, in order; stops at the first failure.
    ///
    /// Two adjacent steps that both are built here, neither of which reads the other, and
    /// both [`StepId::runs_beside_others`], run at the same time: together they take the
    /// longer one's time, not the sum. Only pairs, and no pull from the binary cache (its
    /// client is not shared between threads). A failure of either stops the run; the
    /// other still finishes.
    pub fn run(&self, steps: &dyn Steps<S>, plan: Plan<S>) -> Result<RunReport<S>> {
        std::fs::create_dir_all(&self.log_dir)
            .with_context(|| format!("cannot create {}", self.log_dir.display()))?;
        self.clear_abandoned()?;
        let runner = Runner {
            store: self.store,
            record: self.record,
            log_dir: &self.log_dir,
            quiet: self.quiet,
            started: Instant::now(),
        };
        let only = plan.only;
        let mut done = plan.done;
        let mut clock = Clock::default();
        let mut rows = Vec::new();
        let mut failed = None;
        let planned = plan.steps;
        let mut next = 0;
        while let Some(p) = planned.get(next) {
            next += 1;
            if failed.is_some() {
                rows.push(clock.passed(after_failure(p, &done), runner.elapsed()));
                continue;
            }
            if let Some(row) = self.not_made(&runner, p, &done, only)? {
                rows.push(clock.passed(row, runner.elapsed()));
                continue;
            }
            let ended = match planned.get(next).filter(|q| at_the_same_time(p, q)) {
                Some(q) => {
                    next += 1;
                    runner.starts(p, Some(q.step));
                    runner.starts(q, Some(p.step));
                    let (mine, theirs) = std::thread::scope(|scope| {
                        let theirs = scope.spawn(|| runner.build(steps, q, &done));
                        (runner.build(steps, p, &done), theirs.join())
                    });
                    // A panic in the other step is this run's, as it would be alone.
                    let theirs = theirs.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    vec![(p, mine, Some(q.step)), (q, theirs, Some(p.step))]
                }
                None => {
                    runner.starts(p, None);
                    let ended = match &p.status {
                        Status::Substitute { .. } => {
                            runner.ended(p, |log| self.substitute_one(p, log))
                        }
                        _ => runner.build(steps, p, &done),
                    };
                    vec![(p, ended, None)]
                }
            };
            // Recorded in graph order, whichever of two at once ended first.
            for (p, ended, beside) in ended {
                let reason = match &p.status {
                    Status::Run { reason, .. } => Some(reason.clone()),
                    Status::Substitute { from } => Some(from.clone()),
                    Status::Reused | Status::Skipped { .. } => None,
                };
                let span = (ended.start, ended.end);
                match ended.outcome {
                    Ok((result, unsigned)) => {
                        let mut r = row(p, ended.label, ended.seconds, Some(&result), reason);
                        r.unsigned = unsigned.or(r.unsigned);
                        rows.push(clock.made(r, span, beside));
                        done.insert(p.step, result);
                    }
                    Err(err) => {
                        let r = row(p, "failed", ended.seconds, None, reason);
                        rows.push(clock.made(r, span, beside));
                        // Of two failed at once, the first is the run's failure; the
                        // other's error is in its log and its row.
                        if failed.is_none() {
                            failed = Some((p.step, err, ended.log));
                        }
                    }
                }
            }
        }
        Ok(RunReport { rows, failed })
    }

    /// The row of a step this run does not make (skipped or reused), or None when it is
    /// to be made. A step `--only` needs that is not done is an error naming the command
    /// that makes it.
    fn not_made(
        &self,
        runner: &Runner,
        p: &Planned<S>,
        done: &Done<S>,
        only: Option<S>,
    ) -> Result<Option<Ran<S>>> {
        match &p.status {
            Status::Skipped { reason } => {
                runner.say(&format!("{:>24} {}: skipped: {reason}", "", p.step));
                Ok(Some(row(p, "skipped", 0.0, None, Some(reason.clone()))))
            }
            Status::Reused => {
                // Reused from another record's run (or an older record): remember these
                // inputs, so the next change is named against them.
                if let Some(inputs) = &p.inputs
                    && (!self.record.has(p.step) || !self.record.changes(p.step, inputs).is_empty())
                {
                    self.record.set(p.step, inputs)?;
                }
                let result = done.get(&p.step);
                runner.say(&format!(
                    "[{:>7.1}s] {:<14} reused{}",
                    runner.elapsed(),
                    p.step.name(),
                    result
                        .and_then(|r| r.output.as_ref())
                        .map(|o| format!(": {}", o.display()))
                        .unwrap_or_default()
                ));
                Ok(Some(row(p, "reused", 0.0, result, None)))
            }
            Status::Run { reason, .. } if !p.selected => bail!(
                "--only {}: it needs {}, which is not done ({reason}): run `{} {}` (with the same settings) first",
                only.map_or("?", S::name),
                p.step,
                self.until_command,
                p.step
            ),
            Status::Substitute { .. } | Status::Run { .. } => Ok(None),
        }
    }

    /// What runs that ended without cleaning up (killed, or stopped by a panic) left in
    /// the store's tmp/ goes first: nothing half-written outlives the run after it.
    fn clear_abandoned(&self) -> Result<()> {
        let cleared = self.store.clear_abandoned()?;
        if !cleared.removed.is_empty() && !self.quiet {
            eprintln!(
                "removed {} directories earlier runs left in {}",
                cleared.removed.len(),
                self.store.root().join("tmp").display()
            );
        }
        for (path, why) in &cleared.failed {
            eprintln!(
                "warning: cannot remove {}, which an earlier run left: {why} (remove it by hand)",
                path.display()
            );
        }
        Ok(())
    }

    /// Takes a step's output from the binary cache: the store steps it brings are sealed
    /// by the pull, the graph step here, as [`Runner::run_one`] seals a build; each marked
    /// when the output entered without a trusted signature, which is said even with
    /// `--quiet`.
    fn substitute_one(&self, p: &Planned<S>, log: &Path) -> Result<(StepResult, Option<String>)> {
        std::fs::write(log, "").with_context(|| format!("cannot write {}", log.display()))?;
        let (Some(cache), Some(key), Some(inputs)) = (self.substitute, &p.store_key, &p.inputs)
        else {
            bail!("step {} is not a keyed step of a binary cache", p.step);
        };
        let say = step_say(self.quiet, p.step.name(), log);
        let mut made = None;
        self.store
            .run(key, inputs, true, |dir| {
                let pulled = cache.pull(self.store, p.step, key, &say)?;
                std::fs::write(
                    dir.out.join(RESULT_FILE),
                    serde_json::to_string_pretty(&pulled.stored)?,
                )?;
                if let Some(why) = &pulled.unsigned {
                    dir.mark_unsigned(why);
                }
                made = Some((pulled.stored.result, pulled.unsigned));
                Ok(())
            })
            .with_context(|| {
                format!(
                    "substituting {} from {} (to build it here instead, run the same command with --no-substitute)",
                    p.step,
                    cache.source()
                )
            })?;
        self.record.set(p.step, inputs)?;
        let made = made.context("the pull wrote no result")?;
        if let Some(why) = &made.1 {
            eprintln!("warning: step {}: {why}", p.step);
        }
        Ok(made)
    }
}

/// The row of a step after a failure: what a failure stops is not run; what was reused
/// or skipped still is.
fn after_failure<S: StepId>(p: &Planned<S>, done: &Done<S>) -> Ran<S> {
    match &p.status {
        Status::Reused => row(p, "reused", 0.0, done.get(&p.step), None),
        Status::Skipped { reason } => row(p, "skipped", 0.0, None, Some(reason.clone())),
        Status::Run { .. } | Status::Substitute { .. } => row(p, "not-run", 0.0, None, None),
    }
}

/// Whether `q`, planned right after `p`, runs at the same time as it: both are built here
/// and selected, and neither reads the other's output, directly or not.
fn at_the_same_time<S: StepId>(p: &Planned<S>, q: &Planned<S>) -> bool {
    let built_here = |x: &Planned<S>| {
        x.selected && x.step.runs_beside_others() && matches!(x.status, Status::Run { .. })
    };
    built_here(p)
        && built_here(q)
        && !with_ancestors(q.step).contains(&p.step)
        && !with_ancestors(p.step).contains(&q.step)
}

/// A step's row of the summary.
pub(crate) fn row<S: StepId>(
    p: &Planned<S>,
    outcome: &'static str,
    seconds: f64,
    result: Option<&StepResult>,
    reason: Option<String>,
) -> Ran<S> {
    Ran {
        step: p.step,
        outcome,
        seconds,
        start: 0.0,
        end: 0.0,
        wait: 0.0,
        beside: None,
        output: result.and_then(|r| r.output.clone()),
        key: p.key.clone(),
        reason,
        facts: result.map(|r| r.facts.clone()).unwrap_or_default(),
        unsigned: p.unsigned.clone(),
    }
}

/// When each step of the run ended, for the start, end and wait of the rows after it.
pub(crate) struct Clock<S> {
    ends: std::collections::BTreeMap<S, f64>,
}

impl<S: StepId> Default for Clock<S> {
    fn default() -> Self {
        Clock {
            ends: Default::default(),
        }
    }
}

impl<S: StepId> Clock<S> {
    /// The row of a step the run passed without making it (reused, skipped, not run): it
    /// starts and ends `at`, and waited for nothing.
    pub(crate) fn passed(&mut self, mut r: Ran<S>, at: f64) -> Ran<S> {
        (r.start, r.end) = (at, at);
        self.ends.insert(r.step, at);
        r
    }

    /// The row of a step made here (built, pulled, or failed): its start and end, the
    /// step beside it, and how long it waited after the last step it reads had ended.
    pub(crate) fn made(
        &mut self,
        mut r: Ran<S>,
        (start, end): (f64, f64),
        beside: Option<S>,
    ) -> Ran<S> {
        let ready = r
            .step
            .deps()
            .iter()
            .filter_map(|d| self.ends.get(d))
            .fold(0.0_f64, |a, b| a.max(*b));
        (r.start, r.end, r.beside) = (start, end, beside);
        r.wait = (start - ready).max(0.0);
        self.ends.insert(r.step, end);
        r
    }
}

/// What building a step here needs of the engine: unlike the engine (its binary cache),
/// shared by the two threads of steps that run at the same time.
struct Runner<'a> {
    store: &'a Store,
    record: &'a Record,
    log_dir: &'a Path,
    quiet: bool,
    /// When the run started: the `[   1.2s]` of each line.
    started: Instant,
}

/// How a step that was built or pulled ended.
struct Ended {
    /// The row's outcome when it succeeded: built or substituted.
    label: &'static str,
    seconds: f64,
    /// Seconds since the run started, when it started and ended.
    start: f64,
    end: f64,
    log: PathBuf,
    /// The result, and why it entered without a trusted signature when it did.
    outcome: Result<(StepResult, Option<String>)>,
}

impl Runner<'_> {
    fn say(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }

    fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// A step's first line: how it is made (built here or pulled), and the step it runs
    /// beside.
    fn starts<S: StepId>(&self, p: &Planned<S>, beside: Option<S>) {
        let how = match &p.status {
            Status::Substitute { from } => format!("substituted from {from}"),
            Status::Run { reason, .. } => format!("runs: {reason}"),
            Status::Reused | Status::Skipped { .. } => String::new(),
        };
        let beside = beside
            .map(|s| format!(" (at the same time as {s})"))
            .unwrap_or_default();
        self.say(&format!(
            "[{:>7.1}s] {:<14} {how}{beside}",
            self.elapsed(),
            p.step.name()
        ));
    }

    /// Times `make` (given the step's log) and says how it ended: its `done in` line, or
    /// its error appended to its log.
    fn ended<S: StepId>(
        &self,
        p: &Planned<S>,
        make: impl FnOnce(&Path) -> Result<(StepResult, Option<String>)>,
    ) -> Ended {
        let (verb, label) = match p.status {
            Status::Substitute { .. } => ("pulled", "substituted"),
            _ => ("done", "built"),
        };
        let log = self.log_dir.join(format!("{}.log", p.step.name()));
        let start = self.elapsed();
        let t = Instant::now();
        let outcome = make(&log);
        let seconds = t.elapsed().as_secs_f64();
        let end = start + seconds;
        match &outcome {
            Ok((result, _)) => self.say(&format!(
                "[{:>7.1}s] {:<14} {verb} in {seconds:.1} s{}",
                self.elapsed(),
                p.step.name(),
                result
                    .output
                    .as_ref()
                    .map(|o| format!(": {}", o.display()))
                    .unwrap_or_default()
            )),
            Err(err) => {
                let _ = append_log(&log, &format!("error: {err:#}\n"));
            }
        }
        Ended {
            label,
            seconds,
            start,
            end,
            log,
            outcome,
        }
    }

    /// Builds `p` here (see [`Runner::run_one`]), timed and reported.
    fn build<S: StepId>(&self, steps: &dyn Steps<S>, p: &Planned<S>, done: &Done<S>) -> Ended {
        self.ended(p, |log| Ok((self.run_one(steps, p, done, log)?, None)))
    }

    /// Runs the step's recipe; a keyed step is sealed in the store with its result.
    fn run_one<S: StepId>(
        &self,
        steps: &dyn Steps<S>,
        p: &Planned<S>,
        done: &Done<S>,
        log: &Path,
    ) -> Result<StepResult> {
        std::fs::write(log, "").with_context(|| format!("cannot write {}", log.display()))?;
        let say = step_say(self.quiet, p.step.name(), log);
        let (Some(key), Some(inputs)) = (&p.store_key, &p.inputs) else {
            return steps.run(p.step, done, &say);
        };
        let mut made = None;
        // The graph step is sealed only after the step's own work returned: a run killed
        // halfway leaves it in the store's tmp/, never marked done.
        self.store.run(key, inputs, true, |dir| {
            let result = steps.run(p.step, done, &say)?;
            let shipped = match steps.shipped(p.step, &result) {
                None => None,
                Some(root) => Some(Shipped {
                    files: commstack_digest::manifest::manifest(&root, &not_shipped).with_context(
                        || format!("hashing what step {} ships, {}", p.step, root.display()),
                    )?,
                    root,
                }),
            };
            let stored = StoredResult {
                result: result.clone(),
                shipped,
            };
            std::fs::write(
                dir.out.join(RESULT_FILE),
                serde_json::to_string_pretty(&stored)?,
            )?;
            made = Some(result);
            Ok(())
        })?;
        self.record.set(p.step, inputs)?;
        made.context("the step wrote no result")
    }
}

/// A step's progress line: on stderr (unless quiet), indented under the step's first
/// line, and into its log.
fn step_say<'a>(quiet: bool, name: &'a str, log: &'a Path) -> impl Fn(&str) + 'a {
    move |line: &str| {
        if !quiet {
            eprintln!("{:>24} {name}: {line}", "");
        }
        let _ = append_log(log, &format!("{line}\n"));
    }
}

fn append_log(log: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)?
        .write_all(text.as_bytes())
}
