//! The build graph of commstack: stack.toml to a verified image in one call.
//!
//! - `ctx`: the options every command shares (stack, home) and the paths they give.
//! - `flow`: the steps the graph is made of, one function each, also called by the single
//!   build commands (`build nvshmem`, ...), `fetch`, `toolchain`, `gpu-bundle` and `adopt`.
//! - `util`: small helpers (atomic writes, the manifest reader, sizes).
//! - `cache_config`: the binary cache's wire format (a step artifact's config), written by
//!   `cache push` and checked and read by `build --substitute`.

pub mod cache_config;
pub mod check;
pub mod command;
pub mod ctx;
pub mod flow;
pub mod graph;
pub mod options;
pub mod settings;
pub mod stack_steps;
pub mod util;
