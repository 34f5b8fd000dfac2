//! What the engine knows of a step: its identity and place in the graph ([`StepId`]), what
//! it made ([`StepResult`], [`StoredResult`]), and what it asks of whoever knows how to do
//! the steps ([`Steps`]) and of a binary cache ([`Substitute`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::path::PathBuf;

use anyhow::{Context, Result};
use commstack_store::{StepKey, Store};
use serde::{Deserialize, Serialize};

/// The steps of one graph: a small closed set (an enum), each with a name, the steps it
/// reads the outputs of, and whether its output is a step of the store.
pub trait StepId:
    Copy + Ord + Eq + Hash + Debug + Display + Serialize + Send + Sync + 'static
{
    /// Every step, in an order where each comes after those it depends on.
    const ALL: &'static [Self];
    /// The store's names of keyed steps are `<STORE_PREFIX>-<name>-<hash>`.
    const STORE_PREFIX: &'static str;

    fn name(self) -> &'static str;
    /// The steps this one reads the outputs of.
    fn deps(self) -> &'static [Self];
    /// Whether the step's output is a step of the store (keyed by its inputs); the others
    /// (a lock file, a download cache, a container engine) are asked whether their work
    /// is done ([`Steps::pending`]).
    fn keyed(self) -> bool;
    /// Whether the step may run at the same time as another that does not read it (and
    /// that it does not read): for steps that leave cores idle, such as one that waits on
    /// another program. Compiling steps use every core already.
    fn runs_beside_others(self) -> bool {
        false
    }
}

/// `step` and every step it depends on, directly or not, in graph order.
pub fn with_ancestors<S: StepId>(step: S) -> Vec<S> {
    let mut set = BTreeSet::from([step]);
    for s in S::ALL.iter().rev() {
        if set.contains(s) {
            set.extend(s.deps().iter().copied());
        }
    }
    set.into_iter().collect()
}

/// The store's step name of a keyed graph step (`pipeline-nvshmem-source`).
pub fn store_step<S: StepId>(step: S) -> String {
    format!("{}-{}", S::STORE_PREFIX, step.name())
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

/// The file of a keyed step's directory that holds its [`StoredResult`].
pub const RESULT_FILE: &str = "result.json";

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

/// What a step directory holds besides what it ships: the store's own records, logs, and
/// build reports (they record times and paths by design).
pub fn not_shipped(rel: &str) -> bool {
    matches!(
        rel,
        commstack_store::META_FILE | ".used" | "logs" | "build-report.json" | RESULT_FILE
    )
}

/// The results of the steps done so far (reused or run), for the steps after them.
pub type Done<S> = BTreeMap<S, StepResult>;

/// What the graph needs from whoever knows how to do the steps (a stack's steps, or a
/// test's fixture recipes). Sync: two steps that do not read each other may run at the
/// same time ([`crate::Engine::run`]).
pub trait Steps<S: StepId>: Sync {
    /// Why `step` does not apply here (e.g. no image is asked for), or None.
    fn skipped(&self, step: S) -> Option<String>;
    /// What keys a keyed step (a JSON object): its settings and probes of this machine.
    /// The graph adds the keys of the steps it depends on, under "after".
    fn inputs(&self, step: S) -> Result<serde_json::Value>;
    /// For a step outside the store: why it must run, or None when its work is done.
    /// `done` holds the results of the steps before it.
    fn pending(&self, step: S, done: &Done<S>) -> Result<Option<String>>;
    /// Does the step; `say` prints (and logs) a progress line.
    fn run(&self, step: S, done: &Done<S>, say: &dyn Fn(&str)) -> Result<StepResult>;
    /// The file or directory of bytes a keyed step ships (what a second build must give
    /// again byte for byte), given its result; None for a step that ships nothing.
    fn shipped(&self, step: S, result: &StepResult) -> Option<PathBuf>;
    /// The steps a substituted `step` still reads from this store (an image's base layer
    /// may come with the base step, not with the image's artifact).
    fn reads_when_substituted(&self, _step: S) -> &'static [S] {
        &[]
    }
    /// The keyed steps this run builds here (neither reused nor substituted), told before
    /// the steps outside the store are planned (a download step then fetches only what
    /// these need), with the selection's target (`--until`/`--only`), if any.
    fn built_here(&self, _steps: &BTreeSet<S>, _target: Option<S>) {}
}

/// Whether a missing step is pulled from a binary cache or built here: the one decision
/// a binary cache makes for the plan ([`Substitute::decide`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Pull it from `from` (`host/repo:tag@sha256:..`).
    Pull { from: String },
    /// Build it here; `why` is added to the reason it runs (e.g. "not in the binary cache
    /// reg/repo"), when the cache was asked.
    Build { why: Option<String> },
}

/// What a pull gave: the result (paths of this home) and, when the output entered without
/// a trusted signature (the cache was told to accept such), why: the engine marks its
/// store step, and a later plan reuses it only when told ([`crate::Engine::allow_unsigned`]).
pub struct Pulled {
    pub stored: StoredResult,
    pub unsigned: Option<String>,
}

/// A binary cache of step outputs.
pub trait Substitute<S: StepId> {
    /// `HOST[:PORT]/REPO`, for messages.
    fn source(&self) -> String;
    /// Whether the output of `step` under `key`, which this store lacks and this run
    /// needs, is pulled from the cache or built here.
    fn decide(&self, step: S, key: &StepKey) -> Result<Decision>;
    /// Pulls the output of `step` under `key`: checks it, seals in `store` the store
    /// steps it brings (marked unsigned when it is), and returns the result (paths of this
    /// home) for the graph step, which the engine seals.
    fn pull(&self, store: &Store, step: S, key: &StepKey, say: &dyn Fn(&str)) -> Result<Pulled>;
}
