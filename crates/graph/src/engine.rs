//! The engine: the store, the record of past inputs, where logs go, and the binary cache
//! to take outputs from. [`Engine::plan`] (plan.rs) and [`Engine::run`] (run.rs) use it.

use std::path::PathBuf;

use anyhow::{Result, bail};
use commstack_store::{StepKey, Store};

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
    /// Take pulled outputs without a trusted signature, and reuse those that entered the
    /// store so (the store marks them); without it such a step in the store is an error
    /// ending with `unsigned_help`.
    pub allow_unsigned: bool,
    /// What to do about a marked step when not allowed (the commands that allow or remove
    /// such outputs).
    pub unsigned_help: String,
}

impl<S: StepId> Engine<'_, S> {
    /// The binary cache, unless every selected step is to be built again.
    pub(crate) fn cache(&self) -> Option<&dyn Substitute<S>> {
        self.substitute.filter(|_| !self.force)
    }

    /// Why the reused output of `step` entered without a trusted signature, if it did; an
    /// error unless [`Engine::allow_unsigned`] (a build reuses such an output only when
    /// told).
    pub(crate) fn unsigned_reused(&self, step: S, key: &StepKey) -> Result<Option<String>> {
        let Some(why) = self.store.unsigned(key) else {
            return Ok(None);
        };
        if !self.allow_unsigned {
            bail!(
                "step {step}: its output in the store ({}) entered without a trusted signature ({why}), and a build reuses such an output only when told: {}",
                key.dir_name(),
                self.unsigned_help
            );
        }
        Ok(Some(why))
    }
}
