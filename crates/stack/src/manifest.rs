//! `stack.toml`: what the user wants. The file as written is the `raw` module, the
//! validated [`Stack`] and its parts are the `model` module, and [`Stack::parse`] (in the
//! `validation` module) turns one into the other. This module re-exports the model only,
//! so that whatever imports it (rules, lock) depends on the model and not on validation,
//! which itself uses the rules.

pub use crate::model::*;
