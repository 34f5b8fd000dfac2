//! The flow: what several commands share, between the command modules (xtask's `cmd_*`,
//! which parse arguments and print) and the crates under `crates/`. It never names a
//! command module (tests/tidy.rs checks), so it can move into a crate of its own.

pub mod cache_push;
pub mod deepep;
pub mod fetch;
pub mod gpu_bundle;
pub mod image;
pub mod kernels;
pub mod lock;
pub mod nvshmem;
pub mod push;
pub mod substitute;
pub mod toolchain;
pub mod verify_report;
pub mod verify_runtime;
pub mod verify_static;
