//! The build graph engine: steps keyed by their inputs through the step store, planned
//! (every key known before anything runs, `--dry-run`), run in order, recorded, and
//! explained. It knows nothing of what the steps do: a [`Steps`] implementation gives
//! each step's inputs and recipe, a [`Substitute`] implementation a binary cache.
//!
//! A keyed step's output is a step of the store named by a hash of its inputs and of the
//! keys of the keyed steps it reads, so a step whose key is in the store is not run again
//! and a changed input rebuilds exactly what depends on it. Steps outside the store (a
//! lock file, a download cache, a container engine) are asked whether their work is done.
//! With a binary cache, a missing step that this run needs is first offered to the cache
//! ([`Substitute::decide`]); a step is made only when a step that reads it runs here (or
//! it is the target, or nothing after it reads it).
//!
//! - `step`: the step identity ([`StepId`]), results, and the two traits.
//! - `record`: what each step was last built from, to name the input that changed.
//! - `plan`: keys and statuses ([`Engine::plan`]); `explain`: why a step runs, in words.
//! - `run`: the runner ([`Engine::run`]).

mod engine;
mod explain;
mod plan;
mod record;
mod run;
mod step;

pub use engine::Engine;
pub use plan::{Plan, Planned, Selection, Status};
pub use record::{Change, Record};
pub use run::{Ran, RunReport};
pub use step::{
    Decision, Done, Pulled, RESULT_FILE, Shipped, StepId, StepResult, Steps, StoredResult,
    Substitute, not_shipped, store_step, stored_result, with_ancestors,
};

#[cfg(test)]
mod tests;
