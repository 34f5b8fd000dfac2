//! `cargo xtask build [TARGET]`: the whole graph (stack.toml to a verified image), or one
//! target with its own flags. Parse, then one call into the pipeline crate.

use std::process::ExitCode;

use anyhow::Result;
use commstack_steps::ctx::Ctx;

use crate::args::{BuildArgs, DeepepTarget, GraphArgs, ImageTarget, KernelsTarget, NvshmemTarget};

/// With no target: every step of the graph, in order, each reused when its inputs are
/// unchanged: lock, fetch, toolchain, nvshmem-source, nvshmem, dropin, kernels, deepep,
/// wheelhouse, base, image, verify, load, runtime. A failed step stops the run; the same
/// command resumes there.
#[derive(clap::Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_help = "\
Steps (for --until and --only): lock, fetch, toolchain, nvshmem-source, nvshmem, dropin,
kernels, deepep, wheelhouse, base, image, verify, load, runtime. verify is verify's static
level on this machine, read from the image's layers; runtime is what runs in the loaded
image (`import torch` with no GPU; with --gpus, verify's runtime and selftest levels). Two
adjacent steps that do not read each other run at the same time (verify while Docker
loads the image). A stack without [image] stops after the wheelhouse and the kernels.

The summary (each step: reused or built, time, output; the verify levels that ran and those
that could not, and why) is also written as JSON to <home>/pipeline/<stack-id>/summary.json,
each step with its start, end and wait (seconds since the run began); each step's log is
beside it under logs/. With --timings, timings.html beside it draws the run (`cargo xtask
timings SUMMARY.json` draws it again). docs/pipeline.md explains keys, plans and the page.

Binary cache: with --substitute HOST[:PORT]/REPO (or stack.toml's [cache] registry), each
step that would be built is first looked up there (`<step>-<key>`, what `cargo xtask cache
push` filled): nvshmem, dropin, kernels, deepep, wheelhouse, base and image (with its
layer steps) are pulled, their
signatures checked under [cache] trusted-keys (refused otherwise, unless --allow-unsigned),
their configs checked (only store steps of their own kind, paths inside this store only),
their documents and blobs read within bounds and their sha256 checked as they stream; the
toolchain and NVSHMEM's source are then not made. The plan (--dry-run) says which steps
would be substituted; the summary says `substituted` and from where. An output taken with
--allow-unsigned is marked in the store and said UNSIGNED in the summary (and
summary.json); later builds reuse it only with --allow-unsigned (`cargo xtask store gc
--unsigned` removes such outputs). With or without a cache, fetch downloads only what the
steps built here read. docs/registry.md explains it."
)]
pub struct Args {
    #[command(subcommand)]
    target: Option<Target>,
    #[command(flatten)]
    graph: GraphArgs,
    #[command(flatten)]
    build: BuildArgs,
}

#[derive(clap::Subcommand)]
enum Target {
    /// NVSHMEM from source with NVSHMEM_USE_NCCL=OFF, proven, and its drop-in wheel.
    Nvshmem(NvshmemTarget),
    /// The NVSHMEM self-test (commstack-selftest), compiled with the toolchain's nvcc.
    Kernels(KernelsTarget),
    /// DeepEP into a wheel and the wheelhouse (managed venv, or --python PATH to adopt).
    Deepep(DeepepTarget),
    /// The verified stack as a container image, loaded into Docker (--verify, --oci, --context).
    Image(ImageTarget),
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    use commstack_steps::flow;
    match args.target {
        None => commstack_pipeline::command::build(ctx, &args.graph.into(), &args.build.into())
            .map(|b| b.exit),
        Some(Target::Nvshmem(t)) => {
            flow::nvshmem::nvshmem_build(ctx, &t.into_options()).map(|(code, _)| code)
        }
        Some(Target::Kernels(t)) => flow::kernels::run(ctx, &t.into_options()),
        Some(Target::Deepep(t)) => flow::deepep::run(ctx, &t.into_options()),
        Some(Target::Image(t)) => {
            let (graph, build) = t.into_graph();
            commstack_pipeline::command::build(ctx, &graph, &build).map(|b| b.exit)
        }
    }
}
