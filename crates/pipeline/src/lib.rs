//! The commands that run the stack's graph: `build` (the plan, the run with the binary
//! cache, the summary), `build --check` (a second build in a varied home, compared), `push`
//! (the image into a registry), `gpu-bundle` (what a GPU machine runs) and `adopt` (an
//! existing environment brought onto the stack); the image's attestations, attached by
//! `push --key` and checked by `verify attestations`.
//!
//! The steps themselves are commstack-steps; the engine is commstack-graph; the binary
//! cache is commstack-binary-cache.

pub mod adopt;
pub mod attest;
pub mod check;
pub mod command;
pub mod gpu_bundle;
pub mod push;
