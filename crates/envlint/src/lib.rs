//! envlint: the environment a deployment gives NVSHMEM, NCCL and DeepEP, checked against
//! what the stack's own build reads. NVSHMEM's variables come from its source (the
//! `NVSHMEMI_ENV_DEF` entries of its env_defs headers, with the `#if` guards of the build
//! options around them), its build-time options from its CMake and commstack's switch
//! table, NCCL's and DeepEP's from curated tables ([`known`]). Findings: unknown names
//! (with the nearest known one), build-time options set at run time, variables of
//! transports this NVSHMEM was built without, values of the wrong type, duplicates.
//!
//! Layering: [`cpp`] and [`nvshmem`] read the source text, [`source`] finds it, [`catalog`]
//! joins the tables for one build, [`input`] reads the files to check, [`value`] and
//! [`lint`] judge, [`report`] prints.

pub mod catalog;
pub mod cpp;
pub mod input;
pub mod known;
pub mod lint;
pub mod nvshmem;
pub mod report;
pub mod source;
pub mod value;

use std::path::Path;

use anyhow::{Context, Result};

pub use catalog::{Build, Catalog};
pub use input::{Place, Setting};
pub use lint::{Finding, Rule, lint};
pub use source::NvshmemTables;

/// The settings of one file, read by its kind (YAML manifest, shell script, env file).
pub fn read_file(path: &Path) -> Result<Vec<Setting>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.display().to_string();
    Ok(match input::kind_of(path, &text) {
        input::FileKind::Manifest => input::manifest(&name, &text)?,
        input::FileKind::Script => input::script(&name, &text),
        input::FileKind::EnvFile => input::env_file(&name, &text),
    })
}
