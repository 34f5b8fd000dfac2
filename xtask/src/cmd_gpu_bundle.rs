//! `cargo xtask gpu-bundle DIR`: everything a GPU machine with no Rust toolchain and no
//! network needs to run the GPU checks in `gpu/run.sh`. Parse, then one call
//! (commstack_pipeline::gpu_bundle).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_pipeline::gpu_bundle::{GpuBundleRequest, gpu_bundle};
use commstack_stack::CudaArch;
use commstack_steps::ctx::Ctx;
use commstack_steps::options::{BuildOptions, SourceFetch};

use crate::args::ToolchainArgs;

#[derive(clap::Args)]
#[command(after_help = "\
Layout written:
  DIR/bin/xtask                  this CLI (release, stripped)
  DIR/bin/commstack-selftest     the NVSHMEM self-test (release, stripped)
  DIR/mirror/                    the locked sources, for `fetch --offline --mirror DIR/mirror`
  DIR/rdma-core/                 (with --rdma-core) headers + libmlx5 for IBGDA builds
  DIR/build-flags, verify-flags  the settings resolved here (--cuda-archs, --no-ibgda included),
                                 which gpu/run.sh passes to `xtask build nvshmem` and `xtask verify`
  DIR/bundle.json                what is in it, with sha256s
Make it for the GPU machine's stack: `cargo xtask --stack stacks/gpu-adopt.toml gpu-bundle DIR`
(the default stack.toml is the Debian image's). Then on the GPU machine, from a checkout of
this repository:  gpu/run.sh DIR OUT (it uses stacks/gpu-adopt.toml too)")]
pub struct Args {
    /// The bundle directory (emptied first).
    #[arg(default_value = "scratch/bundle")]
    dir: PathBuf,
    /// NVSHMEM install the self-test compiles against (default: NVIDIA's wheel of torch's pin).
    #[arg(long, value_name = "PREFIX")]
    nvshmem: Option<PathBuf>,
    /// Mirrors to take the locked sources from (see `cargo xtask fetch --help`).
    #[arg(long, value_name = "DIR|URL")]
    mirror: Vec<String>,
    /// Accept sources whose tree hash matches the lock although their archive differs.
    #[arg(long)]
    accept_tree_match: bool,
    /// A `dpkg -x` tree of libibverbs-dev + ibverbs-providers to ship for IBGDA builds.
    #[arg(long, value_name = "DIR")]
    rdma_core: Option<PathBuf>,
    /// CUDA archs to build the self-test for and to build and expect NVSHMEM with on the
    /// GPU machine (stack.toml's grammar), overriding stack.toml's nvshmem.cuda-archs.
    #[arg(long, value_delimiter = ',', value_name = "ARCH,...")]
    cuda_archs: Vec<CudaArch>,
    /// Build and expect NVSHMEM without IBGDA on the GPU machine, overriding stack.toml.
    #[arg(long)]
    no_ibgda: bool,
    /// Leave the self-test out (no CUDA compile).
    #[arg(long)]
    no_selftest: bool,
    #[command(flatten)]
    toolchain: ToolchainArgs,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    gpu_bundle(
        ctx,
        &GpuBundleRequest {
            dir: args.dir,
            nvshmem: args.nvshmem,
            no_selftest: args.no_selftest,
            build: BuildOptions {
                fetch: SourceFetch {
                    mirror: args.mirror,
                    offline: false,
                    accept_tree_match: args.accept_tree_match,
                },
                rdma_core: args.rdma_core,
                cuda_archs: args.cuda_archs,
                no_ibgda: args.no_ibgda,
                toolchain: args.toolchain.into(),
                ..BuildOptions::default()
            },
        },
    )?;
    Ok(ExitCode::SUCCESS)
}
