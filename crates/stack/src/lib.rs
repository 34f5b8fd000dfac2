//! The model of a stack: what the user asks for (`stack.toml`, [`manifest`]), what it
//! resolves to (`stack.lock`, [`lock`]) and the compatibility rules between the two
//! ([`rules`]). This crate does no network or file I/O of its own: callers read the files
//! and hand over the text, so every function here is testable with strings.

pub mod bases;
pub mod diag;
pub mod known;
pub mod lock;
pub mod manifest;
pub mod pin;
pub mod rules;

pub use diag::{Diagnostic, Location};
pub use lock::Lock;
pub use manifest::Stack;
pub use pin::Pin;
