//! Planning: every step of a selection keyed, and whether it is reused, skipped, pulled
//! from the binary cache or run here, and why.
//!
//! Three passes. Forwards, each step is keyed (its inputs and the keys of the keyed steps
//! it reads) and looked up in the store. Backwards, a missing step is made only when a
//! step that reads it runs here (or it is the target, or nothing after it reads it), and
//! only those are put to the binary cache: a rerun whose last product is in the store asks
//! the registry nothing. Forwards again, each step that runs is given its reason, and the
//! steps outside the store are asked whether their work is done, knowing what is built
//! here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_store::StepKey;
use serde::Serialize;

use crate::engine::Engine;
use crate::explain::{explain, names};
use crate::record::Change;
use crate::step::{
    Decision, Done, StepId, StepResult, Steps, StoredResult, store_step, stored_result,
    with_ancestors,
};

/// Why a step runs, or that it is reused.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Status {
    /// Its output is there for these inputs.
    Reused,
    /// It runs, for `reason`; `changed` names the inputs that differ from its last run.
    Run {
        reason: String,
        changed: Vec<Change>,
    },
    /// It does not apply, or it is not needed (what reads it is substituted).
    Skipped { reason: String },
    /// Its output is taken from the binary cache, at `from` (`host/repo:tag@digest`).
    Substitute { from: String },
}

#[derive(Clone, Debug, Serialize)]
pub struct Planned<S: StepId> {
    pub step: S,
    /// The store directory name of a keyed step (`pipeline-nvshmem-<hash>`).
    pub key: Option<String>,
    #[serde(flatten)]
    pub status: Status,
    /// Whether the step is run by this invocation (not only a dependency of `--only`).
    pub selected: bool,
    /// A reused output that entered without a trusted signature: why (reused only with
    /// [`Engine::allow_unsigned`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsigned: Option<String>,
    #[serde(skip)]
    pub(crate) inputs: Option<serde_json::Value>,
    #[serde(skip)]
    pub(crate) store_key: Option<StepKey>,
}

impl<S: StepId> Planned<S> {
    fn outside(step: S, status: Status, selected: bool) -> Planned<S> {
        Planned {
            step,
            key: None,
            status,
            selected,
            unsigned: None,
            inputs: None,
            store_key: None,
        }
    }
}

/// Which steps to plan and run.
#[derive(Clone, Copy, Debug, Default)]
pub enum Selection<S> {
    /// Every step.
    #[default]
    All,
    /// The step and the steps it depends on.
    Until(S),
    /// Only the step: the steps it depends on must be done already.
    Only(S),
}

impl<S: StepId> Selection<S> {
    fn steps(self) -> Vec<S> {
        match self {
            Selection::All => S::ALL.to_vec(),
            Selection::Until(s) | Selection::Only(s) => with_ancestors(s),
        }
    }

    fn runs(self, step: S) -> bool {
        match self {
            Selection::Only(s) => s == step,
            _ => true,
        }
    }

    fn target(self) -> Option<S> {
        match self {
            Selection::Until(s) | Selection::Only(s) => Some(s),
            Selection::All => None,
        }
    }
}

/// The plan: every step of the selection in graph order, keyed, with its status.
#[derive(Clone, Debug, Serialize)]
pub struct Plan<S: StepId> {
    pub steps: Vec<Planned<S>>,
    #[serde(skip)]
    pub(crate) done: Done<S>,
    /// The step of `--only`, for the message when a step it needs is not done.
    #[serde(skip)]
    pub(crate) only: Option<S>,
}

impl<S: StepId> Plan<S> {
    /// Whether this run takes `pulled` from the binary cache and then builds `then` here
    /// (both selected): an image and its load, which may then begin during the pull.
    pub fn substitutes_then_runs(&self, pulled: S, then: S) -> bool {
        let has = |step: S, wanted: fn(&Status) -> bool| {
            self.steps
                .iter()
                .any(|p| p.step == step && p.selected && wanted(&p.status))
        };
        has(pulled, |s| matches!(s, Status::Substitute { .. }))
            && has(then, |s| matches!(s, Status::Run { .. }))
    }
}

/// The first pass's findings, for the other two.
struct Keyed<S: StepId> {
    out: Vec<Planned<S>>,
    done: Done<S>,
    /// Keyed steps not in the store, with the inputs changed since their last run.
    missing: BTreeMap<S, Vec<Change>>,
    /// The steps outside the store: their index in `out`, and whether selected.
    outside: Vec<(usize, bool)>,
}

impl<S: StepId> Engine<'_, S> {
    /// Keys every step of `selection` and says whether it is reused or runs, and why.
    /// Nothing is built; the results of reused steps are read.
    pub fn plan(&self, steps: &dyn Steps<S>, selection: Selection<S>) -> Result<Plan<S>> {
        let Keyed {
            mut out,
            mut done,
            mut missing,
            outside,
        } = self.key_steps(steps, selection)?;
        let not_in_cache = self.decide_missing(steps, selection.target(), &mut out, &missing)?;
        let mut runs = self.give_reasons(&mut out, &mut missing, &not_in_cache);
        let here: BTreeSet<S> = out
            .iter()
            .filter(|p| p.step.keyed() && matches!(p.status, Status::Run { .. }))
            .map(|p| p.step)
            .collect();
        steps.built_here(&here, selection.target());
        // The steps outside the store: after the steps before them, or when their work is
        // not done.
        for (index, selected) in outside {
            let step = out[index].step;
            let upstream_runs = running(step.deps(), &runs);
            let status = if !upstream_runs.is_empty() {
                Status::Run {
                    reason: format!("after {}", names(&upstream_runs)),
                    changed: Vec::new(),
                }
            } else {
                match steps.pending(step, &done)? {
                    None => {
                        done.insert(step, StepResult::default());
                        Status::Reused
                    }
                    Some(reason) => Status::Run {
                        reason,
                        changed: Vec::new(),
                    },
                }
            };
            runs.insert(step, matches!(status, Status::Run { .. }));
            out[index] = Planned::outside(step, status, selected);
        }
        let only = match selection {
            Selection::Only(s) => Some(s),
            _ => None,
        };
        Ok(Plan {
            steps: out,
            done,
            only,
        })
    }

    /// Forwards: each step skipped, outside the store, or keyed and looked up.
    fn key_steps(&self, steps: &dyn Steps<S>, selection: Selection<S>) -> Result<Keyed<S>> {
        let mut keys: BTreeMap<S, String> = BTreeMap::new();
        let mut skipped: BTreeSet<S> = BTreeSet::new();
        let mut k = Keyed {
            out: Vec::new(),
            done: Done::new(),
            missing: BTreeMap::new(),
            outside: Vec::new(),
        };
        for step in selection.steps() {
            let selected = selection.runs(step);
            if let Some(reason) = steps.skipped(step).or_else(|| {
                step.deps()
                    .iter()
                    .find(|d| skipped.contains(d))
                    .map(|d| format!("it needs {d}, which is skipped"))
            }) {
                skipped.insert(step);
                let status = Status::Skipped { reason };
                k.out.push(Planned::outside(step, status, selected));
                continue;
            }
            if !step.keyed() {
                k.outside.push((k.out.len(), selected));
                k.out.push(Planned::outside(step, Status::Reused, selected));
                continue;
            }
            let inputs = keyed_inputs(steps, step, &keys)?;
            let key = StepKey::new(&store_step(step), &inputs);
            keys.insert(step, key.hash.clone());
            let reusable = match self.force && selected {
                true => None,
                false => self.reusable(&key)?,
            };
            let mut unsigned = None;
            match reusable {
                Some(result) => {
                    unsigned = self.unsigned_reused(step, &key)?;
                    k.done.insert(step, result);
                }
                None => {
                    k.missing.insert(step, self.record.changes(step, &inputs));
                }
            }
            k.out.push(Planned {
                step,
                key: Some(key.dir_name()),
                status: Status::Reused,
                selected,
                unsigned,
                inputs: Some(inputs),
                store_key: Some(key),
            });
        }
        Ok(k)
    }

    /// Backwards: which missing steps are needed, and of those, which the binary cache
    /// gives. Returns the steps the cache was asked for and did not have, with why.
    fn decide_missing(
        &self,
        steps: &dyn Steps<S>,
        target: Option<S>,
        out: &mut [Planned<S>],
        missing: &BTreeMap<S, Vec<Change>>,
    ) -> Result<BTreeMap<S, String>> {
        let cache = self.cache();
        let mut needed: BTreeSet<S> = BTreeSet::new();
        let mut read: BTreeSet<S> = BTreeSet::new();
        let mut built_because: BTreeMap<S, String> = BTreeMap::new();
        for p in out.iter_mut().rev() {
            if matches!(p.status, Status::Skipped { .. }) {
                continue;
            }
            let step = p.step;
            read.extend(step.deps().iter().copied());
            if !step.keyed() {
                // Planned last: they may run and read what they follow.
                needed.extend(step.deps().iter().copied());
                continue;
            }
            if !missing.contains_key(&step) {
                continue;
            }
            // The target, a product nothing after it reads, or read by a step made here.
            if target != Some(step) && !needed.contains(&step) && read.contains(&step) {
                p.status = Status::Skipped {
                    reason: match cache {
                        Some(cache) => format!(
                            "not needed: every step that reads it is reused or substituted from {}",
                            cache.source()
                        ),
                        None => "not needed: every step that reads it is reused".to_string(),
                    },
                };
                continue;
            }
            let key = p.store_key.as_ref().expect("a keyed step has a key");
            let decision = match cache {
                Some(cache) => cache.decide(step, key).with_context(|| {
                    format!(
                        "looking up step {step} ({}) in the binary cache {} (to build without it, run the same command with --no-substitute)",
                        key.dir_name(),
                        cache.source()
                    )
                })?,
                None => Decision::Build { why: None },
            };
            match decision {
                Decision::Pull { from } => {
                    p.status = Status::Substitute { from };
                    needed.extend(steps.reads_when_substituted(step).iter().copied());
                }
                Decision::Build { why } => {
                    if let Some(why) = why {
                        built_because.insert(step, why);
                    }
                    // The reason is written forwards, once what runs before it is known.
                    p.status = Status::Run {
                        reason: String::new(),
                        changed: Vec::new(),
                    };
                    needed.extend(step.deps().iter().copied());
                }
            }
        }
        Ok(built_because)
    }

    /// Forwards again: why each keyed step that runs here runs. Returns, for every keyed
    /// step, whether it is made by this run (built or pulled).
    fn give_reasons(
        &self,
        out: &mut [Planned<S>],
        missing: &mut BTreeMap<S, Vec<Change>>,
        built_because: &BTreeMap<S, String>,
    ) -> BTreeMap<S, bool> {
        let mut runs: BTreeMap<S, bool> = BTreeMap::new();
        for p in out.iter_mut().filter(|p| p.step.keyed()) {
            let step = p.step;
            if let Status::Run { reason, changed } = &mut p.status {
                *changed = missing.remove(&step).unwrap_or_default();
                let keyed_deps: Vec<S> =
                    step.deps().iter().copied().filter(|d| d.keyed()).collect();
                let upstream_runs = running(&keyed_deps, &runs);
                *reason = match self.force && p.selected {
                    true => "--force".to_string(),
                    false => explain(changed, &upstream_runs, self.record.has(step)),
                };
                if let Some(why) = built_because.get(&step) {
                    reason.push_str(&format!("; {why}"));
                }
            }
            runs.insert(
                step,
                matches!(p.status, Status::Run { .. } | Status::Substitute { .. }),
            );
        }
        runs
    }

    /// The result of a keyed step in the store, if it is there and what it names still is.
    fn reusable(&self, key: &StepKey) -> Result<Option<StepResult>> {
        let Some(StoredResult { result, .. }) = stored_result(self.store, key)? else {
            return Ok(None);
        };
        // A crate's step the result points into may have been collected (`store gc`).
        Ok(result
            .output
            .as_deref()
            .is_none_or(Path::exists)
            .then_some(result))
    }
}

/// A keyed step's inputs, with the keys of the keyed steps it depends on under "after":
/// a changed upstream output changes this key too. Its keyed deps' keys only: a step
/// outside the store running (a cache filling) does not change what a build makes.
fn keyed_inputs<S: StepId>(
    steps: &dyn Steps<S>,
    step: S,
    keys: &BTreeMap<S, String>,
) -> Result<serde_json::Value> {
    let mut inputs = steps
        .inputs(step)
        .with_context(|| format!("the inputs of step {step}"))?;
    let after: serde_json::Map<String, serde_json::Value> = step
        .deps()
        .iter()
        .filter_map(|d| {
            keys.get(d)
                .map(|k| (d.name().to_string(), k.clone().into()))
        })
        .collect();
    match inputs.as_object_mut() {
        Some(object) => object.insert("after".into(), after.into()),
        None => bail!("the inputs of step {step} are not a JSON object"),
    };
    Ok(inputs)
}

/// Those of `deps` that this run makes.
fn running<S: StepId>(deps: &[S], runs: &BTreeMap<S, bool>) -> Vec<S> {
    deps.iter()
        .copied()
        .filter(|d| runs.get(d).copied().unwrap_or(false))
        .collect()
}
