//! The engine: the store, the record of past inputs, where logs go, and the binary cache
//! to take outputs from. [`Engine::plan`] (plan.rs) and [`Engine::run`] (run.rs) use it.

use std::path::PathBuf;

use commstack_store::Store;

use crate::record::Record;
use crate::step::{StepId, Substitute};

pub struct Engine<'a, S: StepId> {
    pub store: &'a Store,
    pub record: &'a Record,
    /// `<dir>/<step>.log`: every progress line of the step's last run, and its error.
    pub log_dir: PathBuf,
    pub quiet: bool,
    /// Run every selected keyed step even when its output is in the store (`--force`).
    pub force: bool,
    /// How a message names the command that makes a step (`cargo xtask build --until`),
    /// with the flags that select the same graph (` --stack FILE`).
    pub until_command: String,
    /// The binary cache to take outputs from before building them; not consulted with
    /// `force`.
    pub substitute: Option<&'a dyn Substitute<S>>,
}

impl<S: StepId> Engine<'_, S> {
    /// The binary cache, unless every selected step is to be built again.
    pub(crate) fn cache(&self) -> Option<&dyn Substitute<S>> {
        self.substitute.filter(|_| !self.force)
    }
}
