//! `cargo xtask build <target>`: build one part of the stack into the step store. The
//! arguments and the builds live in the flow layer, which other commands use too.

use std::process::ExitCode;

use anyhow::Result;

use commstack_pipeline::ctx::Ctx;
use commstack_pipeline::flow;
pub use commstack_pipeline::flow::build::Args;
use commstack_pipeline::flow::build::Target;

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    match args.target {
        Target::Nvshmem => flow::nvshmem::nvshmem_build(ctx, &args).map(|(code, _)| code),
        Target::Kernels => flow::kernels::run(ctx, &args),
        Target::Deepep => flow::deepep::run(ctx, &args),
    }
}
