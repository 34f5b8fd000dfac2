//! `cargo xtask adopt --python PATH`: bring an existing Python environment (an NGC
//! container, a machine's own torch environment) onto the stack: compare it with the lock
//! and the rules, install the stack's drop-in NVSHMEM and DeepEP with a backup, prove the
//! result with the runtime check; `--undo` restores the environment exactly. Parse, then
//! one call (commstack_pipeline::adopt).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_pipeline::adopt::{AdoptRequest, adopt};
use commstack_steps::ctx::Ctx;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// Only DeepEP: NVIDIA's NVSHMEM stays (the runtime check must then fail: the trap).
    Deepep,
    /// Only the drop-in NVSHMEM.
    Nvshmem,
}

#[derive(clap::Args)]
#[command(after_help = "\
Without --dry-run, --check or --undo: compare, install the drop-in NVSHMEM and DeepEP from
the wheelhouse `cargo xtask build deepep --python PATH` made (backing up every file they
replace), then run the runtime check (verify's runtime level).

Exit status: 0 done and the runtime check passed; 1 an error or a failed check; 2 a
check could not run.")]
pub struct Args {
    /// The interpreter of the environment to adopt (e.g. /opt/torch/.venv/bin/python3).
    #[arg(long, value_name = "PATH")]
    pub python: PathBuf,
    /// Show what differs from the lock and what would change; change nothing.
    #[arg(long, conflicts_with_all = ["undo", "check"])]
    pub dry_run: bool,
    /// Put the environment back as it was before the first adopt (every backup, newest first).
    #[arg(long, conflicts_with = "check")]
    pub undo: bool,
    /// Only compare and run the runtime check on the environment as it is.
    #[arg(long)]
    pub check: bool,
    /// Install only one of the stack's wheels.
    #[arg(long, value_enum)]
    pub only: Option<Only>,
    /// The wheelhouse to install from (default: the one `build deepep --python PATH` made).
    #[arg(long, value_name = "DIR")]
    pub wheelhouse: Option<PathBuf>,
    /// Install although the environment does not match the lock (torch, CUDA, NCCL, Python).
    #[arg(long)]
    pub force: bool,
    /// Do not run the runtime check after installing.
    #[arg(long)]
    pub no_verify: bool,
    /// How long the runtime check may take (it imports torch).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    adopt(
        ctx,
        &AdoptRequest {
            python: args.python,
            dry_run: args.dry_run,
            undo: args.undo,
            check: args.check,
            only: args.only.map(|o| match o {
                Only::Deepep => commstack_pipeline::adopt::Only::Deepep,
                Only::Nvshmem => commstack_pipeline::adopt::Only::Nvshmem,
            }),
            wheelhouse: args.wheelhouse,
            force: args.force,
            no_verify: args.no_verify,
            timeout: args.timeout,
        },
    )
}
