//! commstack-verify, the verify tool images carry, built reproducibly.

use std::path::Path;

use anyhow::Result;
use commstack_store::Store;

use crate::build::{OwnTool, Say, ToolRecipe, own_tool};

/// The verify tool for inside the image: a release build of `commstack-verify` from the
/// workspace at `root`.
pub fn build_verify_tool(store: &Store, say: Say, root: &Path, force: bool) -> Result<OwnTool> {
    own_tool(store, say, &verify_recipe(root, force))
}

/// How [`build_verify_tool`] builds: the crate alone, nothing outside the workspace.
pub fn verify_recipe(root: &Path, force: bool) -> ToolRecipe<'_> {
    ToolRecipe {
        root,
        package: "commstack-verify",
        bin: "commstack-verify",
        features: &[],
        dir: "crates/verify",
        links: Vec::new(),
        env: Vec::new(),
        inputs: serde_json::Value::Null,
        force,
    }
}
