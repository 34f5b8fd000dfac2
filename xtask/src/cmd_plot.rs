//! `cargo xtask plot selftest RESULT.json... -o FILE.svg`: the self-test's bandwidth
//! curves as an SVG plot.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_steps::ctx::Ctx;

#[derive(clap::Subcommand)]
pub enum Command {
    /// The self-test's put, get and copy bandwidth against message size (log2 axis, 4 KiB
    /// to 256 MiB), and put and get as a percentage of copy; one line per report.
    #[command(after_help = "\
Each report is what `commstack-selftest --json FILE` wrote (gpu/run.sh keeps them as
selftest-<N>gpu.json); its lowest rank's put to itself, get from itself and device-to-device
copy are drawn. The SVG's text is SVG text: no font file is read to make it.")]
    Selftest(SelftestArgs),
}

#[derive(clap::Args)]
pub struct SelftestArgs {
    /// The self-test's JSON reports, one line each (named by the file name).
    #[arg(value_name = "RESULT.json", required = true)]
    reports: Vec<PathBuf>,
    /// The SVG file to write.
    #[arg(long, short, value_name = "FILE.svg")]
    out: PathBuf,
}

pub fn run(_ctx: &Ctx, cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::Selftest(a) => {
            let runs = commstack_plot::write(&a.reports, &a.out)?;
            for r in &runs {
                let last =
                    |xs: &[(u64, f64)]| xs.last().map(|(b, g)| format!("{g:.1} GB/s at {b} B"));
                eprintln!(
                    "{}: {}; put {}, copy {}",
                    r.label,
                    r.what,
                    last(&r.curves.put).unwrap_or_else(|| "none".into()),
                    last(&r.curves.copy).unwrap_or_else(|| "none".into())
                );
            }
            println!("{}", a.out.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}
