//! The stack's own steps on the build graph (commstack-graph): what each step of a stack
//! is keyed by and what it runs, from stack.toml and its lock to a loaded, verified image.
//!
//! - `ctx`: where the stack and the home are; `options`: what a command asks for (plain
//!   structs; the CLI parses into them); `settings`: both resolved once against the stack
//!   and its lock, read by every step.
//! - `graph`: the stack's steps and what each reads ([`graph::StepId`]).
//! - `stack_steps`: each step's inputs and recipe ([`stack_steps::StackSteps`]), and what
//!   a binary cache may hold of each.
//! - `flow`: each step's flow, also called alone by the single commands.
//! - `util`: small helpers (the manifest reader, sizes, result lines).

pub mod ctx;
pub mod flow;
pub mod graph;
pub mod options;
pub mod settings;
pub mod stack_steps;
pub mod util;
