//! The flow layer: what several commands share, between the command modules (`cmd_*`,
//! which parse arguments and print) and the crates under `crates/`. It never names a
//! command module (tests/tidy.rs checks), so it can move into a crate of its own.

pub mod fetch;
pub mod lock;
pub mod toolchain;
