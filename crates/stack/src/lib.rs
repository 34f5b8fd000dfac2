//! The model of a stack: what the user asks for (`stack.toml`, [`manifest`]: the file as
//! written in `raw`, checked by [`validation`] into the [`model`]), what it resolves to
//! (`stack.lock`, [`lock`]) and the compatibility rules between the two ([`rules`]).
//! Dependencies run one way: model <- known <- rules <- validation.
//! This crate does no network or file I/O of its own: callers read the files and hand
//! over the text, so every function here is testable with strings.

pub mod arch;
pub mod bases;
pub mod deploy;
mod deploy_check;
pub mod diag;
pub mod gitmodules;
pub mod known;
pub mod lock;
pub mod manifest;
pub mod model;
pub mod pass_env;
pub mod pin;
mod raw;
pub mod rules;
pub mod switches;
pub mod validation;

pub use arch::CudaArch;
pub use deploy::Deploy;
pub use deploy_check::{RENDERED_ENV, env_name_ok, parse_quantity};
pub use diag::{Diagnostic, Location};
pub use lock::Lock;
pub use manifest::Stack;
pub use pin::Pin;
