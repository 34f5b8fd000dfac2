//! `cargo xtask`: the command line of commstack. Thin on purpose: it parses arguments,
//! calls the crates under `crates/`, and prints. Each command lives in its own module
//! (`cmd_*`); what several commands share lives in `flow`, never in another command.

mod args;
mod cmd_adopt;
mod cmd_bench;
mod cmd_build;
mod cmd_cache;
mod cmd_deploy;
mod cmd_doctor;
mod cmd_envlint;
mod cmd_fetch;
mod cmd_gpu_bundle;
mod cmd_lock;
mod cmd_logscan;
mod cmd_mirror;
mod cmd_plot;
mod cmd_push;
mod cmd_store;
mod cmd_timings;
mod cmd_toolchain;
mod cmd_verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// commstack: build, pin and verify the expert-parallel communication stack
/// (NVSHMEM without NCCL, DeepEP, PyTorch and its NCCL).
///
/// Data flows one way: stack.toml -> stack.lock -> fetch -> build -> image -> verify.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    version,
    propagate_version = true
)]
struct Cli {
    #[command(flatten)]
    global: args::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Resolve stack.toml into stack.lock (every artifact with URL and sha256).
    ///
    /// With `[image]`, the mirror's signed Debian index must be current: not expired
    /// (Valid-Until), not dated more than 5 minutes in the future, not older than
    /// `image.index-max-age-days` when it has no Valid-Until, and not older than the index
    /// the existing lock records for the same mirror and suite (docs/bounds.md).
    ///
    /// `[nccl] version = "X.Y.Z"` replaces torch's NCCL pin in the closure (as uv's
    /// override-dependencies): refused when older than torch's pin (rule
    /// nccl-not-older-than-torch) or when its wheel's file list has no libnccl.so.2 (rule
    /// nccl-soname); the lock records the override and why, and `lock` prints it.
    Lock(cmd_lock::Args),
    /// Download every artifact of stack.lock into the verified cache.
    Fetch(cmd_fetch::Args),
    /// Inspect, verify or prune the download cache; push the step outputs to a registry
    /// as the binary cache (`cache push`).
    #[command(subcommand)]
    Cache(cmd_cache::Command),
    /// Write or use an air-gap bundle of every locked artifact.
    #[command(subcommand)]
    Mirror(cmd_mirror::Command),
    /// Inspect or prune the step store (content-addressed build outputs).
    #[command(subcommand)]
    Store(cmd_store::Command),
    /// Provision the locked CUDA toolchain, cmake and ninja into the store.
    Toolchain(cmd_toolchain::Args),
    /// stack.toml to a verified image: every step, planned, reused when unchanged,
    /// explained; or one target (nvshmem, kernels, deepep, image).
    // Boxed: its arguments are most of the enum's size (clippy::large_enum_variant).
    Build(Box<cmd_build::Args>),
    /// Push the image to an OCI registry by digest (tagged with the lock's sha256); prints
    /// the HOST/REPO@sha256:... reference deploys pull.
    // Boxed as build's: it takes build's arguments.
    Push(Box<cmd_push::Args>),
    /// Bring an existing Python environment onto the stack: compare with the lock, install
    /// the drop-in NVSHMEM and DeepEP with a backup, prove it (--undo restores it).
    Adopt(cmd_adopt::Args),
    /// Assemble the folder that runs every GPU check on a machine with no Rust or network.
    GpuBundle(cmd_gpu_bundle::Args),
    /// Prove a Python environment holds the stack: static, runtime, selftest, tests, exit-clean;
    /// or check a pushed image's attestations against the lock (`verify attestations`).
    Verify(cmd_verify::VerifyArgs),
    /// Classify the NCCL / NVSHMEM / DeepEP lines of log files: cause, phase, fix.
    Logscan(cmd_logscan::Args),
    /// Check this host: driver, GPUs and topology, RDMA, peermem, IBGDA settings, limits.
    Doctor(cmd_doctor::Args),
    /// Render the pushed image's deploy (by digest) for Kubernetes or Slurm from
    /// stack.toml's [deploy]: a gate before the rollout, the environment checked.
    #[command(subcommand)]
    Deploy(cmd_deploy::Command),
    /// Check the NVSHMEM / NCCL / DeepEP environment of env files, scripts and manifests
    /// against the stack's build: unknown names, build-time options, transports not
    /// built, wrong types.
    Envlint(cmd_envlint::Args),
    /// Run a benchmark and print a line for docs/benchmarks.md.
    Bench(cmd_bench::Args),
    /// A build's timings page (HTML) again from its summary.json and ninja logs.
    Timings(cmd_timings::Args),
    /// Plot results as SVG: the self-test's bandwidth curves.
    #[command(subcommand)]
    Plot(cmd_plot::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = match commstack_steps::ctx::Ctx::new(cli.global.into()) {
        Ok(ctx) => ctx,
        Err(err) => return report(err),
    };
    let result = match cli.command {
        Command::Lock(args) => cmd_lock::run(&ctx, args),
        Command::Fetch(args) => cmd_fetch::run(&ctx, args),
        Command::Cache(cmd) => cmd_cache::run(&ctx, cmd),
        Command::Mirror(cmd) => cmd_mirror::run(&ctx, cmd),
        Command::Push(args) => cmd_push::run(&ctx, *args),
        Command::Store(cmd) => cmd_store::run(&ctx, cmd),
        Command::Toolchain(args) => cmd_toolchain::run(&ctx, args),
        Command::Build(args) => cmd_build::run(&ctx, *args),
        Command::Adopt(args) => cmd_adopt::run(&ctx, args),
        Command::GpuBundle(args) => cmd_gpu_bundle::run(&ctx, args),
        Command::Verify(args) => cmd_verify::run(&ctx, args),
        Command::Logscan(args) => cmd_logscan::run(&ctx, args),
        Command::Doctor(args) => cmd_doctor::run(&ctx, args),
        Command::Deploy(cmd) => cmd_deploy::run(&ctx, cmd),
        Command::Envlint(args) => cmd_envlint::run(&ctx, args),
        Command::Bench(args) => cmd_bench::run(&ctx, args),
        Command::Timings(args) => cmd_timings::run(&ctx, args),
        Command::Plot(cmd) => cmd_plot::run(&ctx, cmd),
    };
    match result {
        Ok(code) => code,
        Err(err) => report(err),
    }
}

/// Errors print their whole chain: the outer context says what we were doing, the inner
/// ones say which file, field or artifact was at fault.
/// Messages can quote untrusted text (archive entries, server answers, log lines): every
/// line is printed with its control characters escaped.
fn report(err: anyhow::Error) -> ExitCode {
    let safe = |text: String| -> String {
        text.split('\n')
            .map(|line| commstack_digest::terminal_safe(line).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    };
    eprintln!("error: {}", safe(err.to_string()));
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {}", safe(cause.to_string()));
    }
    ExitCode::FAILURE
}
