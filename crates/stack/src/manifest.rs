//! `stack.toml`: what the user wants. The file as written is [`crate::raw`], the validated
//! [`Stack`] and its parts are [`crate::model`], and [`Stack::parse`] (in
//! [`crate::validation`]) turns one into the other. This module re-exports the model only,
//! so that whatever imports it (known, rules, lock) depends on the model and not on
//! validation, which itself uses the rules.

pub use crate::model::*;
