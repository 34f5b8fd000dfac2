//! commstack-doctor, the preflight images carry, built reproducibly.

use std::path::Path;

use anyhow::Result;
use commstack_store::Store;

use crate::build::{OwnTool, Say, ToolRecipe, own_tool};

/// The doctor for inside the image (its `preflight`): a release build of the
/// `commstack-doctor` binary from the workspace at `root`.
pub fn build_doctor_tool(store: &Store, say: Say, root: &Path, force: bool) -> Result<OwnTool> {
    own_tool(store, say, &doctor_recipe(root, force))
}

/// How [`build_doctor_tool`] builds: the crate alone, nothing outside the workspace.
pub fn doctor_recipe(root: &Path, force: bool) -> ToolRecipe<'_> {
    ToolRecipe {
        root,
        package: "commstack-doctor",
        bin: "commstack-doctor",
        features: &[],
        dir: "crates/doctor",
        links: Vec::new(),
        env: Vec::new(),
        inputs: serde_json::Value::Null,
        force,
    }
}
