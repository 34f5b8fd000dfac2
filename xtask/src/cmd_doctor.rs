//! `cargo xtask doctor`: can this host run the stack? Driver, GPUs, topology, RDMA, IBGDA, limits.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use commstack_doctor::{CudaVersion, DoctorInput, NvidiaSmiSource, render_human};

use commstack_steps::ctx::Ctx;

/// Exit status when at least one check failed.
const EXIT_FAIL: u8 = 3;

#[derive(clap::Args)]
#[command(after_help = "\
Each check prints pass, warn, fail or skip with a one-line finding and a fix.

Exit status:
  0  no check failed (warnings may remain)
  1  the doctor itself failed
  2  bad command line
  3  at least one check failed")]
pub struct Args {
    /// Read /proc, /sys and /dev below this directory instead of `/` (a recorded host).
    #[arg(long, value_name = "DIR", default_value = "/")]
    root: PathBuf,
    /// Read recorded nvidia-smi output (nvidia-smi.txt, nvidia-smi-query.csv,
    /// nvidia-smi-topo-m.txt) from DIR instead of running nvidia-smi.
    #[arg(long, value_name = "DIR")]
    nvidia_smi_dir: Option<PathBuf>,
    /// The CUDA version the stack is built with; the driver must support it.
    #[arg(long, value_name = "MAJOR.MINOR", default_value = "13.0")]
    cuda: CudaVersion,
    /// Print the report as JSON (its `schema_version` says the shape).
    #[arg(long)]
    json: bool,
}

pub fn run(_ctx: &Ctx, args: Args) -> Result<ExitCode> {
    if !args.root.is_dir() {
        anyhow::bail!(
            "--root {}: not a directory (give the directory that holds proc/ and sys/)",
            args.root.display()
        );
    }
    let input = DoctorInput {
        root: args.root,
        nvidia_smi: args
            .nvidia_smi_dir
            .map_or(NvidiaSmiSource::Live, NvidiaSmiSource::Recorded),
        required_cuda: args.cuda,
        ..DoctorInput::live()
    };
    let report = commstack_doctor::run(&input);
    let mut stdout = io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report).context("writing the JSON report")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render_human(&report).as_bytes())?;
    }
    Ok(if report.has_fail() {
        ExitCode::from(EXIT_FAIL)
    } else {
        ExitCode::SUCCESS
    })
}
