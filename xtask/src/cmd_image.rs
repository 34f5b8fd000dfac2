//! `cargo xtask image`: the verified stack as a container image. The flow is in
//! `flow::image`; this module only hands the arguments over.

use std::process::ExitCode;

use anyhow::Result;

use crate::ctx::Ctx;
pub use crate::flow::image::Args;

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    crate::flow::image::run(ctx, &args)
}
