//! `cargo xtask image`: the verified stack as a container image. The flow is in
//! `flow::image`; this module only hands the arguments over.

use std::process::ExitCode;

use anyhow::Result;

use commstack_pipeline::ctx::Ctx;
pub use commstack_pipeline::flow::image::Args;

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    commstack_pipeline::flow::image::run(ctx, &args)
}
