//! Our own tools, built from this workspace at a fixed path so that the same sources and
//! inputs give the same bytes on any machine, and kept stripped in the step store: the
//! self-test (the kernel crate, against an NVSHMEM and a CUDA toolkit), the verify tool
//! and the doctor (the image's preflight), which images and GPU bundles carry.
//!
//! - `workspace`: where the workspace is, what a build copies of it, its sources' hash
//!   and identity.
//! - `build`: the reproducible build of one binary ([`own_tool`]).
//! - `selftest`, `verify`, `doctor`: the tools' recipes.

mod build;
mod doctor;
mod selftest;
mod verify;
mod workspace;

pub use build::{OwnTool, Say, TOOL_STEP, ToolRecipe, own_tool, tool_build_dir, tool_key};
pub use doctor::{build_doctor_tool, doctor_recipe};
pub use selftest::{
    BUNDLE_RUNPATH, NvshmemForKernels, SelftestBuild, build_selftest, env_archs, nvshmem_identity,
    selftest_step,
};
pub use verify::{build_verify_tool, verify_recipe};
pub use workspace::{cargo_target_dir, copy_workspace, git_identity, sources_hash, workspace_root};
