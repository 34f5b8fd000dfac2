//! `cargo xtask deploy render`: the pushed image onto Kubernetes or Slurm from stack.toml's
//! `[deploy]`. Parse, then one call into crates/deploy.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_deploy::{ImageSource, RenderRequest, Target};
use commstack_steps::ctx::Ctx;

#[derive(clap::Subcommand)]
pub enum Command {
    /// Render the deploy of the image into DIR: for k8s a JobSet gate (the image's
    /// preflight on every node, then the self-test and DeepEP's tests across them) and a
    /// LeaderWorkerSet serving group, each with a kustomization.yaml, and rollout.sh; for
    /// slurm an sbatch script (preflight first on every node).
    Render(RenderArgs),
}

#[derive(clap::Args)]
#[command(after_help = "\
The image is pulled by digest only: --image HOST/REPO@sha256:<64 hex> (what `cargo xtask
push` prints last), or --pushed FILE with push's output (`cargo xtask push ... --json >
FILE`, or its plain output). A tag alone is refused.

The environment the files set is checked as `cargo xtask envlint` checks any file: NVSHMEM's
variables are read from the locked NVSHMEM source in the download cache (`cargo xtask fetch
--only sources` puts it there) or --nvshmem-source; a finding refuses the render and
nothing is written. The image's own environment (which Slurm's OCI job sets again; DeepEP
V2's JIT cache volume on Kubernetes) comes from the stack's lock, which must be fresh
(`cargo xtask lock`). Files are written each atomically (a temporary file renamed into
place); other files in DIR are left alone.

Examples:
  cargo xtask deploy render --target k8s --image registry.example.com/commstack/debian-12@sha256:<hex>
  cargo xtask deploy render --target slurm --pushed pushed.json --out /shared/jobs/ep
  (see docs/deploy.md)")]
pub struct RenderArgs {
    /// Where it runs: k8s (JobSet gate + LeaderWorkerSet) or slurm (sbatch).
    #[arg(long, value_parser = target_parser())]
    target: Target,
    /// The image: HOST[:PORT]/REPO@sha256:<64 hex>.
    #[arg(
        long,
        value_name = "REF@sha256:...",
        required_unless_present = "pushed",
        conflicts_with = "pushed"
    )]
    image: Option<String>,
    /// What `cargo xtask push` printed (plain or --json), to take the reference from.
    #[arg(long, value_name = "FILE")]
    pushed: Option<PathBuf>,
    /// Where the files go. Default: deploy/<target>/ beside the stack file.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The NVSHMEM source to read its variables from (the archive or an unpacked tree),
    /// instead of the locked one in the download cache.
    #[arg(long, value_name = "PATH")]
    nvshmem_source: Option<PathBuf>,
}

pub fn run(ctx: &Ctx, cmd: Command) -> Result<ExitCode> {
    let Command::Render(args) = cmd;
    let image = match (args.image, args.pushed) {
        (Some(r), _) => ImageSource::Reference(r),
        (None, Some(f)) => ImageSource::PushOutput(f),
        (None, None) => unreachable!("clap requires one of --image and --pushed"),
    };
    let report = commstack_deploy::run(&RenderRequest {
        stack_path: ctx.stack_path.clone(),
        lock_path: ctx.lock_path(),
        cache_dir: ctx.cache_dir(),
        target: args.target,
        image,
        out: args.out,
        nvshmem_source: args.nvshmem_source,
        stack_flag: ctx.stack_flag(),
    })?;
    ctx.say(&format!(
        "image {}; environment checked against NVSHMEM's variables of {}",
        report.image,
        report.nvshmem_source.display()
    ));
    for path in &report.written {
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--target`'s value: a target by its name (`k8s`, `slurm`).
fn target_parser() -> impl clap::builder::TypedValueParser<Value = Target> {
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(Target::ALL.map(Target::as_str)).map(|name| {
        Target::ALL
            .into_iter()
            .find(|t| t.as_str() == name)
            .expect("a possible value names a target")
    })
}
