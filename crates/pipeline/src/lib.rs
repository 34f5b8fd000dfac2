//! The commands that run the stack's graph: `build` (the plan, the run with the binary
//! cache, the summary), `build --check` (a second build in a varied home, compared), `push`
//! (the image into a registry) and `gpu-bundle` (what a GPU machine runs).
//!
//! The steps themselves are commstack-steps; the engine is commstack-graph; the binary
//! cache is commstack-binary-cache.

pub mod check;
pub mod command;
pub mod gpu_bundle;
pub mod push;
