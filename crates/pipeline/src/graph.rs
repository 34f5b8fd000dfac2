//! The build graph: its steps, what each depends on, and the engine that plans and runs
//! them through the step store.
//!
//! A step of the graph is keyed by its inputs: what it is asked to do (settings from the
//! stack, the lock and the command line, probes of this machine) and the keys of the
//! steps it depends on. So the whole plan, every key included, is known before anything
//! runs (`--dry-run`), and a step whose key is in the store is not run again. The crates'
//! own steps (NVSHMEM's build, DeepEP's, the image's layers) keep their content-addressed
//! keys beneath: a graph step that runs finds them when they are still current.
//!
//! Three steps are not in the store because what they make lives elsewhere: `lock` (the
//! stack.lock file, handled before the graph by its caller), `fetch` (the download cache)
//! and `load` (the Docker engine). Each is asked whether its work is done.
//!
//! Steps run one after another, but verify and load, adjacent, both run here and neither
//! reading the other, run at the same time (see [`Engine::run`]).
//!
//! With a binary cache (`build --substitute`, [`Substitute`]), a keyed step that would run
//! is first looked up there by its key: when the cache has it, it is pulled and sealed in
//! the store instead of built. A step is made only when a step that reads it runs here (or
//! it is the target, or nothing after it reads it): with the image substituted, NVSHMEM,
//! DeepEP and the wheelhouse are neither built nor pulled, as `docker pull` would not
//! fetch them either (`build --until deepep` makes them). The steps outside the store are
//! planned last, knowing what is built here (fetch downloads only what those steps need).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_store::{StepKey, Store};
use serde::{Deserialize, Serialize};

use crate::cache_config::ArtifactKinds;
use crate::record::{Change, Record};

/// The steps, in an order where each comes after those it depends on.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum StepId {
    /// stack.toml resolved into stack.lock (resolved again when stale, unless --locked).
    Lock,
    /// Every locked artifact in the download cache.
    Fetch,
    /// The locked CUDA toolchain, cmake and ninja, provisioned into the store.
    Toolchain,
    /// NVSHMEM's locked source, unpacked and checked against its tree hash.
    NvshmemSource,
    /// NVSHMEM built with NVSHMEM_USE_NCCL=OFF, proven.
    Nvshmem,
    /// The drop-in NVSHMEM wheel (replaces NVIDIA's under torch's pinned version).
    Dropin,
    /// The self-test (commstack-selftest) compiled against the stack's NVSHMEM.
    Kernels,
    /// DeepEP built into a wheel against the stack's NVSHMEM and torch.
    Deepep,
    /// The wheelhouse: every wheel the image installs.
    Wheelhouse,
    /// The image's base from the locked Debian packages (mmdebstrap).
    Base,
    /// The image: base, venv, wheels, drop-in, DeepEP, tools, SBOM, provenance.
    Image,
    /// verify's static level on this machine, over the image's layer tars (no Docker).
    Verify,
    /// The image loaded into Docker under its tag.
    Load,
    /// What runs in the loaded image: `import torch` without GPUs; with --gpus, verify's
    /// runtime and selftest levels.
    Runtime,
}

impl StepId {
    pub const ALL: [StepId; 14] = [
        StepId::Lock,
        StepId::Fetch,
        StepId::Toolchain,
        StepId::NvshmemSource,
        StepId::Nvshmem,
        StepId::Dropin,
        StepId::Kernels,
        StepId::Deepep,
        StepId::Wheelhouse,
        StepId::Base,
        StepId::Image,
        StepId::Verify,
        StepId::Load,
        StepId::Runtime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StepId::Lock => "lock",
            StepId::Fetch => "fetch",
            StepId::Toolchain => "toolchain",
            StepId::NvshmemSource => "nvshmem-source",
            StepId::Nvshmem => "nvshmem",
            StepId::Dropin => "dropin",
            StepId::Kernels => "kernels",
            StepId::Deepep => "deepep",
            StepId::Wheelhouse => "wheelhouse",
            StepId::Base => "base",
            StepId::Image => "image",
            StepId::Verify => "verify",
            StepId::Load => "load",
            StepId::Runtime => "runtime",
        }
    }

    /// The steps this one reads the outputs of.
    pub fn deps(self) -> &'static [StepId] {
        use StepId::*;
        match self {
            Lock => &[],
            Fetch => &[Lock],
            Toolchain => &[Fetch],
            NvshmemSource => &[Fetch],
            Nvshmem => &[Toolchain, NvshmemSource],
            Dropin => &[Nvshmem],
            Kernels => &[Toolchain, Nvshmem],
            Deepep => &[Toolchain, Nvshmem, Dropin],
            Wheelhouse => &[Deepep, Dropin],
            Base => &[Fetch],
            Image => &[Base, Wheelhouse, Kernels],
            // The image's layer tars, read on this machine: no Docker, so it runs while
            // the image loads. The base's facts name the image's Python.
            Verify => &[Base, Image],
            Load => &[Image],
            // The image's key, not only Docker's copy: a new image is run again. After
            // verify: a statically broken image is not started.
            Runtime => &[Base, Image, Load, Verify],
        }
    }

    /// Whether the step may run at the same time as another: verify reads tars here while
    /// load is Docker's work. The compiling steps each use every core already (`-j` jobs),
    /// so two at once would gain nothing and mix their output.
    pub fn runs_beside_others(self) -> bool {
        matches!(self, StepId::Verify | StepId::Load)
    }

    /// Whether the step's output is a step of the store (keyed by its inputs).
    pub fn keyed(self) -> bool {
        !matches!(self, StepId::Lock | StepId::Fetch | StepId::Load)
    }

    /// `step` and every step it depends on, directly or not, in graph order.
    pub fn with_ancestors(self) -> Vec<StepId> {
        let mut set = std::collections::BTreeSet::from([self]);
        for s in StepId::ALL.iter().rev() {
            if set.contains(s) {
                set.extend(s.deps().iter().copied());
            }
        }
        set.into_iter().collect()
    }

    /// The store's name of the graph step (`pipeline-nvshmem-source`).
    fn store_step(self) -> String {
        format!("pipeline-{}", self.name())
    }
}

impl std::fmt::Display for StepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a step made: the path a user looks at, and facts for the summary (JSON object).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StepResult {
    pub output: Option<PathBuf>,
    #[serde(default)]
    pub facts: serde_json::Value,
}

/// What a step ships: the manifest of the files under `root` (sha256, size, mode of
/// each), recorded in its result so that two builds compare without moving bytes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Shipped {
    pub root: PathBuf,
    pub files: BTreeMap<String, commstack_digest::manifest::Entry>,
}

/// A keyed step's `result.json`: its result and what it ships.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StoredResult {
    #[serde(flatten)]
    pub result: StepResult,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shipped: Option<Shipped>,
}

/// The stored result of a keyed step in `store`, if it is there.
pub fn stored_result(store: &Store, key: &StepKey) -> Result<Option<StoredResult>> {
    let Some(dir) = store.lookup(key) else {
        return Ok(None);
    };
    let file = dir.join(RESULT_FILE);
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .with_context(|| format!("{}: not a step result", file.display()))
}

/// The results of the steps done so far (reused or run), for the steps after them.
pub type Done = BTreeMap<StepId, StepResult>;

/// What the graph needs from whoever knows how to do the steps: the stack's own steps
/// ([`crate::stack_steps::StackSteps`]), or a test's fixture recipes. Sync: two steps
/// that do not read each other run at the same time ([`Engine::run`]).
pub trait Steps: Sync {
    /// Why `step` does not apply to this stack (e.g. no [image] section), or None.
    fn skipped(&self, step: StepId) -> Option<String>;
    /// What keys a keyed step (a JSON object): its settings and probes of this machine.
    /// The graph adds the keys of the steps it depends on, under "after".
    fn inputs(&self, step: StepId) -> Result<serde_json::Value>;
    /// For a step outside the store (lock, fetch, load): why it must run, or None when
    /// its work is done. `done` holds the results of the steps before it.
    fn pending(&self, step: StepId, done: &Done) -> Result<Option<String>>;
    /// Does the step; `say` prints (and logs) a progress line.
    fn run(&self, step: StepId, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult>;
    /// The file or directory of bytes a keyed step ships (what a second build must give
    /// again byte for byte), given its result; None for a step that ships nothing.
    fn shipped(&self, step: StepId, result: &StepResult) -> Option<PathBuf>;
    /// The kinds of store step the binary cache's artifact of `step` may bring (the crate
    /// step its output lives in, and those it carries whole): None when a binary cache
    /// may not hold the step (then it is always built here). A pulled artifact bringing
    /// any other kind is refused, signed or not: a store step of another kind (a
    /// `base-...` in NVSHMEM's artifact) would be taken by a later build that reads it.
    fn artifact_kinds(&self, _step: StepId) -> Option<ArtifactKinds> {
        None
    }
    /// The steps a substituted `step` still reads from this store (the image's base
    /// layer comes with the base step, not with the image's artifact).
    fn reads_when_substituted(&self, _step: StepId) -> &'static [StepId] {
        &[]
    }
    /// The keyed steps this run builds here (neither reused nor substituted), told before
    /// lock, fetch and load are planned (fetch downloads only what these need); not told
    /// when fetch is the target (it brings everything then).
    fn built_here(&self, _steps: &BTreeSet<StepId>) {}
}

/// What a pull gave: the result (paths of this home) and, when the output entered
/// without a trusted signature (`--allow-unsigned`), why.
pub struct Pulled {
    pub stored: StoredResult,
    pub unsigned: Option<String>,
}

/// A binary cache of step outputs (`build --substitute`, crate::flow::substitute).
pub trait Substitute {
    /// `HOST[:PORT]/REPO`, for messages.
    fn source(&self) -> String;
    /// Where the cache has the output of `step` under `key` (`host/repo:tag@sha256:..`),
    /// or None when it has not.
    fn lookup(&self, step: StepId, key: &StepKey) -> Result<Option<String>>;
    /// Pulls the output of `step` under `key`: checks it (signature, digests, the shipped
    /// manifest, that it brings only store steps of the `kinds` [`Steps::artifact_kinds`]
    /// names), seals in `store` the store steps it brings (marked unsigned when it is),
    /// and returns the result (paths of this home) for the graph step, which the engine
    /// seals.
    fn pull(
        &self,
        store: &Store,
        step: StepId,
        key: &StepKey,
        kinds: &ArtifactKinds,
        say: &dyn Fn(&str),
    ) -> Result<Pulled>;
}

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
    /// It does not apply to this stack, or it is not needed (what reads it is substituted).
    Skipped { reason: String },
    /// Its output is taken from the binary cache, at `from` (`host/repo:tag@digest`).
    Substitute { from: String },
}

#[derive(Clone, Debug, Serialize)]
pub struct Planned {
    pub step: StepId,
    /// The store directory name of a keyed step (`pipeline-nvshmem-<hash>`).
    pub key: Option<String>,
    #[serde(flatten)]
    pub status: Status,
    /// Whether the step is run by this invocation (not only a dependency of `--only`).
    pub selected: bool,
    /// A reused output that entered without a trusted signature: why (reused only with
    /// `--allow-unsigned`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsigned: Option<String>,
    #[serde(skip)]
    inputs: Option<serde_json::Value>,
    #[serde(skip)]
    store_key: Option<StepKey>,
}

/// Which steps to plan and run.
#[derive(Clone, Copy, Debug, Default)]
pub enum Selection {
    /// Every step.
    #[default]
    All,
    /// The step and the steps it depends on.
    Until(StepId),
    /// Only the step: the steps it depends on must be done already.
    Only(StepId),
}

impl Selection {
    fn steps(self) -> Vec<StepId> {
        match self {
            Selection::All => StepId::ALL.to_vec(),
            Selection::Until(s) => s.with_ancestors(),
            Selection::Only(s) => s.with_ancestors(),
        }
    }
    fn runs(self, step: StepId) -> bool {
        match self {
            Selection::Only(s) => s == step,
            _ => true,
        }
    }
}

/// The plan: every step of the selection in graph order, keyed, with its status.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub steps: Vec<Planned>,
    #[serde(skip)]
    done: Done,
    /// The step of `--only`, for the message when a step it needs is not done.
    #[serde(skip)]
    only: Option<StepId>,
}

impl Plan {
    /// Whether this run takes `pulled` from the binary cache and then builds `then` here
    /// (both selected): the image and its load, which may then begin during the pull.
    pub fn substitutes_then_runs(&self, pulled: StepId, then: StepId) -> bool {
        let has = |step: StepId, wanted: fn(&Status) -> bool| {
            self.steps
                .iter()
                .any(|p| p.step == step && p.selected && wanted(&p.status))
        };
        has(pulled, |s| matches!(s, Status::Substitute { .. }))
            && has(then, |s| matches!(s, Status::Run { .. }))
    }
}

/// The store, the record of past inputs, and where step logs go.
pub struct Engine<'a> {
    pub store: &'a Store,
    pub record: &'a Record,
    /// `<dir>/<step>.log`: every progress line of the step's last run, and its error.
    pub log_dir: PathBuf,
    pub quiet: bool,
    /// Run every selected keyed step even when its output is in the store (`--force`).
    pub force: bool,
    /// ` --stack FILE` for the commands messages suggest (empty for the default stack).
    pub stack_flag: String,
    /// The binary cache to take outputs from before building them (`--substitute`);
    /// not consulted with `force`.
    pub substitute: Option<&'a dyn Substitute>,
    /// `--allow-unsigned`: take pulled outputs without a trusted signature, and reuse
    /// those that entered the store so; without it such a step in the store is an error
    /// naming what to do.
    pub allow_unsigned: bool,
}

/// How one step of a run ended, for the summary.
#[derive(Clone, Debug, Serialize)]
pub struct Ran {
    pub step: StepId,
    /// reused, built, substituted, skipped, failed, not-run
    pub outcome: &'static str,
    pub seconds: f64,
    pub output: Option<PathBuf>,
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub facts: serde_json::Value,
    /// The output entered without a trusted signature (pulled with `--allow-unsigned`,
    /// now or before): why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unsigned: Option<String>,
}

/// The result of [`Engine::run`]: a row per step, and the error of the step that failed.
pub struct RunReport {
    pub rows: Vec<Ran>,
    pub failed: Option<(StepId, anyhow::Error, PathBuf)>,
}

const RESULT_FILE: &str = "result.json";

impl Engine<'_> {
    /// Keys every step of `selection` and says whether it is reused or runs, and why.
    /// Nothing is built; the results of reused steps are read.
    pub fn plan(&self, steps: &dyn Steps, selection: Selection) -> Result<Plan> {
        let mut keys: BTreeMap<StepId, String> = BTreeMap::new();
        let mut out: Vec<Planned> = Vec::new();
        let mut done = Done::new();
        let mut skipped: BTreeMap<StepId, String> = BTreeMap::new();
        let substitute = self.substitute.filter(|_| !self.force);
        // The steps outside the store, planned once every keyed step is (see below).
        let mut outside: Vec<(usize, bool)> = Vec::new();
        // Keyed steps not in the store: what they need is decided backwards (below).
        let mut missing: BTreeMap<StepId, Vec<Change>> = BTreeMap::new();
        for step in selection.steps() {
            let selected = selection.runs(step);
            if let Some(reason) = steps.skipped(step).or_else(|| {
                step.deps()
                    .iter()
                    .find(|d| skipped.contains_key(d))
                    .map(|d| format!("it needs {d}, which is skipped"))
            }) {
                skipped.insert(step, reason.clone());
                out.push(Planned {
                    step,
                    key: None,
                    status: Status::Skipped { reason },
                    selected,
                    unsigned: None,
                    inputs: None,
                    store_key: None,
                });
                continue;
            }
            if !step.keyed() {
                outside.push((out.len(), selected));
                out.push(Planned {
                    step,
                    key: None,
                    status: Status::Reused,
                    selected,
                    unsigned: None,
                    inputs: None,
                    store_key: None,
                });
                continue;
            }
            let mut inputs = steps
                .inputs(step)
                .with_context(|| format!("the inputs of step {step}"))?;
            // The keys of the keyed steps it depends on, under "after": a changed
            // upstream output changes this key too. Its keyed deps' keys only: fetch
            // running (the cache filling) does not change what a build makes.
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
            let key = StepKey::new(&step.store_step(), &inputs);
            keys.insert(step, key.hash.clone());
            let reusable = match self.force && selected {
                true => None,
                false => self.reusable(&key)?,
            };
            let mut unsigned = None;
            match reusable {
                Some(result) => {
                    unsigned = self.unsigned_reused(step, &key)?;
                    done.insert(step, result);
                }
                None => {
                    missing.insert(step, self.record.changes(step, &inputs));
                }
            }
            out.push(Planned {
                step,
                key: Some(key.dir_name()),
                status: Status::Reused,
                selected,
                unsigned,
                inputs: Some(inputs),
                store_key: Some(key),
            });
        }
        // Backwards: a missing step is made only when something needs it (see `needs`);
        // only those are looked up in the binary cache, so a rerun whose image is in the
        // store asks the registry nothing.
        let target = match selection {
            Selection::Until(s) | Selection::Only(s) => Some(s),
            Selection::All => None,
        };
        let mut needed: BTreeSet<StepId> = BTreeSet::new();
        let mut read: BTreeSet<StepId> = BTreeSet::new();
        let mut not_in_cache: BTreeSet<StepId> = BTreeSet::new();
        for p in out.iter_mut().rev() {
            if matches!(p.status, Status::Skipped { .. }) {
                continue;
            }
            let step = p.step;
            read.extend(step.deps().iter().copied());
            if !step.keyed() {
                // Planned later: lock, fetch and load may run and read what they follow.
                needed.extend(step.deps().iter().copied());
                continue;
            }
            if !missing.contains_key(&step) {
                continue;
            }
            // The target, a product nothing after it reads, or read by a step made here.
            if target != Some(step) && !needed.contains(&step) && read.contains(&step) {
                p.status = Status::Skipped {
                    reason: match substitute {
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
            let found = match substitute {
                Some(cache) if steps.artifact_kinds(step).is_some() => {
                    let found = cache.lookup(step, key).with_context(|| {
                        format!(
                            "looking up step {step} ({}) in the binary cache {} (to build without it, run the same command with --no-substitute)",
                            key.dir_name(),
                            cache.source()
                        )
                    })?;
                    if found.is_none() {
                        not_in_cache.insert(step);
                    }
                    found
                }
                _ => None,
            };
            match found {
                Some(from) => {
                    p.status = Status::Substitute { from };
                    needed.extend(steps.reads_when_substituted(step).iter().copied());
                }
                None => {
                    // The reason is written below, once what runs before it is known.
                    p.status = Status::Run {
                        reason: String::new(),
                        changed: Vec::new(),
                    };
                    needed.extend(step.deps().iter().copied());
                }
            }
        }
        // Forwards again: why each step that runs here runs.
        let mut runs: BTreeMap<StepId, bool> = BTreeMap::new();
        for p in out.iter_mut().filter(|p| p.step.keyed()) {
            let step = p.step;
            if let Status::Run { reason, changed } = &mut p.status {
                *changed = missing.remove(&step).unwrap_or_default();
                let upstream_runs: Vec<StepId> = step
                    .deps()
                    .iter()
                    .copied()
                    .filter(|d| d.keyed() && runs.get(d).copied().unwrap_or(false))
                    .collect();
                *reason = match self.force && p.selected {
                    true => "--force".to_string(),
                    false => explain(changed, &upstream_runs, self.record.has(step)),
                };
                if not_in_cache.contains(&step) {
                    let source = substitute.map(|c| c.source()).unwrap_or_default();
                    reason.push_str(&format!("; not in the binary cache {source}: built here"));
                }
            }
            runs.insert(
                step,
                matches!(p.status, Status::Run { .. } | Status::Substitute { .. }),
            );
        }
        // Fetch brings what the steps built here read, with or without a binary cache (a
        // reused or substituted step reads nothing); `--until fetch` asks for all of it.
        if target != Some(StepId::Fetch) {
            let here: BTreeSet<StepId> = out
                .iter()
                .filter(|p| p.step.keyed() && matches!(p.status, Status::Run { .. }))
                .map(|p| p.step)
                .collect();
            steps.built_here(&here);
        }
        // Lock, fetch and load: after the steps before them, or when their work is not done.
        for (index, selected) in outside {
            let step = out[index].step;
            let upstream_runs: Vec<StepId> = step
                .deps()
                .iter()
                .copied()
                .filter(|d| runs.get(d).copied().unwrap_or(false))
                .collect();
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
            out[index] = Planned {
                step,
                key: None,
                status,
                selected,
                unsigned: None,
                inputs: None,
                store_key: None,
            };
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

    /// Why the reused output of `step` entered without a trusted signature, if it did;
    /// an error unless `--allow-unsigned` (a build reuses such an output only when told).
    fn unsigned_reused(&self, step: StepId, key: &StepKey) -> Result<Option<String>> {
        let Some(why) = self.store.unsigned(key) else {
            return Ok(None);
        };
        if !self.allow_unsigned {
            bail!(
                "step {step}: its output in the store ({}) entered without a trusted signature ({why}), and a build reuses such an output only when told: pass --allow-unsigned to use it, or remove every such output with `cargo xtask store gc --unsigned` and build again (each is then built here, or pulled signed)",
                key.dir_name()
            );
        }
        Ok(Some(why))
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

    /// Runs the plan's steps that are not reused, in order; stops at the first failure.
    ///
    /// Two adjacent steps that both are built here, neither of which reads the other, and
    /// both [`StepId::runs_beside_others`], run at the same time: verify reads the image's layer tars on this machine while
    /// Docker loads the same image, and the two together take the longer one's time, not
    /// the sum. Only pairs, and no pull from the binary cache (its client is not shared
    /// between threads). A failure of either stops the run; the other still finishes.
    pub fn run(&self, steps: &dyn Steps, plan: Plan) -> Result<RunReport> {
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
        let mut rows = Vec::new();
        let mut failed = None;
        let planned = plan.steps;
        let mut next = 0;
        while let Some(p) = planned.get(next) {
            next += 1;
            if failed.is_some() {
                // What a failure stops is not run; what was reused or skipped still is.
                rows.push(match &p.status {
                    Status::Reused => row(p, "reused", 0.0, done.get(&p.step), None),
                    Status::Skipped { reason } => {
                        row(p, "skipped", 0.0, None, Some(reason.clone()))
                    }
                    Status::Run { .. } | Status::Substitute { .. } => {
                        row(p, "not-run", 0.0, None, None)
                    }
                });
                continue;
            }
            match &p.status {
                Status::Skipped { reason } => {
                    runner.say(&format!("{:>24} {}: skipped: {reason}", "", p.step));
                    rows.push(row(p, "skipped", 0.0, None, Some(reason.clone())));
                    continue;
                }
                Status::Reused => {
                    // Reused from another stack file's run (or an older record): remember
                    // these inputs, so the next change is named against them.
                    if let Some(inputs) = &p.inputs
                        && (!self.record.has(p.step)
                            || !self.record.changes(p.step, inputs).is_empty())
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
                    rows.push(row(p, "reused", 0.0, result, None));
                    continue;
                }
                Status::Run { reason, .. } if !p.selected => {
                    bail!(
                        "--only {}: it needs {}, which is not done ({reason}): run `cargo xtask{} build --until {}` (with the same settings) first",
                        only.map_or("?", StepId::name),
                        p.step,
                        self.stack_flag,
                        p.step
                    );
                }
                Status::Substitute { .. } | Status::Run { .. } => {}
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
                    vec![(p, mine), (q, theirs)]
                }
                None => {
                    runner.starts(p, None);
                    let ended = match &p.status {
                        Status::Substitute { .. } => runner.ended(p, |log| {
                            let kinds = steps.artifact_kinds(p.step).with_context(|| {
                                format!("step {} cannot come from a binary cache", p.step)
                            })?;
                            self.substitute_one(p, &kinds, log)
                        }),
                        _ => runner.build(steps, p, &done),
                    };
                    vec![(p, ended)]
                }
            };
            // Recorded in graph order, whichever of two at once ended first.
            for (p, ended) in ended {
                let reason = match &p.status {
                    Status::Run { reason, .. } => Some(reason.clone()),
                    Status::Substitute { from } => Some(from.clone()),
                    Status::Reused | Status::Skipped { .. } => None,
                };
                match ended.outcome {
                    Ok((result, unsigned)) => {
                        let mut r = row(p, ended.label, ended.seconds, Some(&result), reason);
                        r.unsigned = unsigned.or(r.unsigned);
                        rows.push(r);
                        done.insert(p.step, result);
                    }
                    Err(err) => {
                        rows.push(row(p, "failed", ended.seconds, None, reason));
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
    fn substitute_one(
        &self,
        p: &Planned,
        kinds: &ArtifactKinds,
        log: &Path,
    ) -> Result<(StepResult, Option<String>)> {
        std::fs::write(log, "").with_context(|| format!("cannot write {}", log.display()))?;
        let (Some(cache), Some(key), Some(inputs)) = (self.substitute, &p.store_key, &p.inputs)
        else {
            bail!("step {} is not a keyed step of a binary cache", p.step);
        };
        let say = step_say(self.quiet, p.step.name(), log);
        let mut made = None;
        self.store
            .run(key, inputs, true, |dir| {
                let pulled = cache.pull(self.store, p.step, key, kinds, &say)?;
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

/// Whether `q`, planned right after `p`, runs at the same time as it: both are built here
/// and selected, and neither reads the other's output, directly or not.
fn at_the_same_time(p: &Planned, q: &Planned) -> bool {
    let built_here = |x: &Planned| {
        x.selected && x.step.runs_beside_others() && matches!(x.status, Status::Run { .. })
    };
    built_here(p)
        && built_here(q)
        && !q.step.with_ancestors().contains(&p.step)
        && !p.step.with_ancestors().contains(&q.step)
}

/// A step's row of the summary.
fn row(
    p: &Planned,
    outcome: &'static str,
    seconds: f64,
    result: Option<&StepResult>,
    reason: Option<String>,
) -> Ran {
    Ran {
        step: p.step,
        outcome,
        seconds,
        output: result.and_then(|r| r.output.clone()),
        key: p.key.clone(),
        reason,
        facts: result.map(|r| r.facts.clone()).unwrap_or_default(),
        unsigned: p.unsigned.clone(),
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
    fn starts(&self, p: &Planned, beside: Option<StepId>) {
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
    fn ended(
        &self,
        p: &Planned,
        make: impl FnOnce(&Path) -> Result<(StepResult, Option<String>)>,
    ) -> Ended {
        let (verb, label) = match p.status {
            Status::Substitute { .. } => ("pulled", "substituted"),
            _ => ("done", "built"),
        };
        let log = self.log_dir.join(format!("{}.log", p.step.name()));
        let t = Instant::now();
        let outcome = make(&log);
        let seconds = t.elapsed().as_secs_f64();
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
            log,
            outcome,
        }
    }

    /// Builds `p` here (see [`Runner::run_one`]), timed and reported.
    fn build(&self, steps: &dyn Steps, p: &Planned, done: &Done) -> Ended {
        self.ended(p, |log| Ok((self.run_one(steps, p, done, log)?, None)))
    }

    /// Runs the step's recipe; a keyed step is sealed in the store with its result.
    fn run_one(
        &self,
        steps: &dyn Steps,
        p: &Planned,
        done: &Done,
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

/// What a step directory holds besides what it ships: the store's own records, logs, and
/// build reports (they record times and paths by design).
pub(crate) fn not_shipped(rel: &str) -> bool {
    matches!(
        rel,
        commstack_store::META_FILE | ".used" | "logs" | "build-report.json" | RESULT_FILE
    )
}

/// A step's progress line: on stderr (unless quiet) and into its log.
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

fn names(steps: &[StepId]) -> String {
    steps
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a keyed step runs, in words: the upstream steps that run, the inputs that changed.
fn explain(changed: &[Change], upstream_runs: &[StepId], recorded: bool) -> String {
    let own: Vec<String> = changed
        .iter()
        .filter(|c| {
            !upstream_runs
                .iter()
                .any(|u| c.path == format!("after.{}", u.name()))
        })
        .map(Change::describe)
        .collect();
    let mut parts = Vec::new();
    if !upstream_runs.is_empty() {
        parts.push(format!("after {}", names(upstream_runs)));
    }
    if !own.is_empty() {
        parts.push(own.join("; "));
    }
    if parts.is_empty() {
        parts.push(match recorded {
            false => "not built yet for this stack".into(),
            true if changed.is_empty() => {
                "its output is not in the store (removed by `store gc`?)".into()
            }
            true => "after its inputs changed".into(),
        });
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(steps: &[(StepId, Status, bool)]) -> Plan {
        Plan {
            steps: steps
                .iter()
                .map(|(step, status, selected)| Planned {
                    step: *step,
                    key: None,
                    status: status.clone(),
                    selected: *selected,
                    unsigned: None,
                    inputs: None,
                    store_key: None,
                })
                .collect(),
            done: Done::new(),
            only: None,
        }
    }

    #[test]
    fn a_load_begins_during_the_pull_only_when_the_image_is_pulled_and_then_loaded() {
        let pulled = || Status::Substitute {
            from: "reg/repo:image-1@sha256:ab".into(),
        };
        let runs = || Status::Run {
            reason: "not loaded".into(),
            changed: Vec::new(),
        };
        let (image, load) = (StepId::Image, StepId::Load);
        let yes = plan(&[(image, pulled(), true), (load, runs(), true)]);
        assert!(yes.substitutes_then_runs(image, load));
        for no in [
            plan(&[(image, Status::Reused, true), (load, runs(), true)]),
            plan(&[(image, runs(), true), (load, runs(), true)]),
            plan(&[(image, pulled(), true), (load, Status::Reused, true)]),
            plan(&[(image, pulled(), true)]),
            plan(&[(image, pulled(), false), (load, runs(), true)]),
            plan(&[
                (image, pulled(), true),
                (
                    load,
                    Status::Skipped {
                        reason: "no image".into(),
                    },
                    true,
                ),
            ]),
        ] {
            assert!(!no.substitutes_then_runs(image, load), "{no:?}");
        }
    }
}
