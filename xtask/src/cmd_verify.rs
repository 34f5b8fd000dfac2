//! `cargo xtask verify`: prove a Python environment holds the stack, level by level, and
//! file the report beside the artifacts. The command line itself is the verify crate's
//! (`commstack_verify::cli`), shared with the `commstack-verify` binary images carry.

use std::process::ExitCode;

use anyhow::Result;

use commstack_steps::ctx::Ctx;

pub use commstack_verify::cli::Args;

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    commstack_verify::cli::run(args, ctx.home.join("reports"), ctx.quiet)
}
