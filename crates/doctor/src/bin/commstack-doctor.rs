//! commstack-doctor: the doctor the image carries. `preflight` checks this node against
//! the image's expectations (/opt/commstack/preflight.json) before a job runs on it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use commstack_doctor::NvidiaSmiSource;
use commstack_doctor::preflight::{
    Expectations, IMAGE_EXPECTATIONS, PreflightInput, render_verdict, run_preflight,
};
use commstack_stack::deploy::Network;

/// Exit status when the preflight could not run (bad command line, unreadable expectations).
const EXIT_ERROR: u8 = 2;

#[derive(Parser)]
#[command(
    name = "commstack-doctor",
    version,
    about = "Can this node run the commstack image?"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check this node against the image's expectations: the driver for its CUDA, the GPU's
    /// SM among its archs, the kernel for DeepEP V2, the locked-memory limit, /dev/shm and,
    /// with a fabric, RDMA devices and GIDs, nvidia_peermem or gdrdrv and IBGDA's driver
    /// parameters. The verdict as JSON on stdout (or in --json FILE, the report on stdout).
    #[command(after_help = "\
Exit status:
  0  pass: no check failed (warnings may remain)
  1  fail: at least one check failed (the verdict's `failed` names them)
  2  the preflight could not run (bad command line, unreadable expectations)")]
    Preflight(PreflightArgs),
}

#[derive(clap::Args)]
struct PreflightArgs {
    /// The image's expectations (written from the lock when the image was made).
    #[arg(long, value_name = "FILE", default_value = IMAGE_EXPECTATIONS)]
    expectations: PathBuf,
    /// Read /proc, /sys and /dev below DIR instead of `/` (a recorded or fixture node;
    /// the verdict names it).
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/",
        env = "COMMSTACK_PREFLIGHT_ROOT"
    )]
    root: PathBuf,
    /// Read recorded nvidia-smi output (nvidia-smi.txt, nvidia-smi-query.csv,
    /// nvidia-smi-compute-cap.csv) from DIR instead of running nvidia-smi.
    #[arg(long, value_name = "DIR", env = "COMMSTACK_PREFLIGHT_NVIDIA_SMI_DIR")]
    nvidia_smi_dir: Option<PathBuf>,
    /// The node's fabric (stack.toml's deploy.network); `none` (one node) skips the RDMA
    /// checks. Default: infiniband when the image's NVSHMEM has a fabric transport.
    #[arg(long, value_enum)]
    network: Option<Fabric>,
    /// Write the JSON verdict to FILE and print the report on stdout.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Fabric {
    Infiniband,
    Roce,
    None,
}

impl From<Fabric> for Network {
    fn from(f: Fabric) -> Network {
        match f {
            Fabric::Infiniband => Network::Infiniband,
            Fabric::Roce => Network::Roce,
            Fabric::None => Network::None,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Preflight(args) = cli.command;
    match preflight(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("commstack-doctor preflight: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn preflight(args: PreflightArgs) -> Result<ExitCode> {
    if !args.root.is_dir() {
        anyhow::bail!(
            "--root {}: not a directory (give the directory that holds proc/ and sys/)",
            args.root.display()
        );
    }
    let expect = Expectations::read(&args.expectations)?;
    let input = PreflightInput {
        network: args
            .network
            .map_or_else(|| expect.default_network(), Network::from),
        root: args.root,
        nvidia_smi: args
            .nvidia_smi_dir
            .map_or(NvidiaSmiSource::Live, NvidiaSmiSource::Recorded),
        path: std::env::var("PATH").ok(),
    };
    let verdict = run_preflight(&input, &expect);
    let json = serde_json::to_string_pretty(&verdict)? + "\n";
    let mut stdout = std::io::stdout().lock();
    match &args.json {
        Some(file) => {
            write_whole(file, json.as_bytes())?;
            stdout.write_all(render_verdict(&verdict).as_bytes())?;
        }
        None => stdout.write_all(json.as_bytes())?,
    }
    Ok(match verdict.passed() {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}

/// `bytes` at `path`, whole or not at all (a temporary file beside it, renamed).
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("--json {}: not a file name", path.display()))?;
    let temp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&temp, bytes)
        .and_then(|()| std::fs::rename(&temp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&temp);
        })
        .with_context(|| format!("writing the verdict to {}", path.display()))
}
