//! `cargo xtask logscan FILE...`: classify log lines with the logscan knowledge base.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use commstack_logscan::{KnowledgeBase, Phase, Scanner, render_human};

use commstack_steps::ctx::Ctx;

/// Exit status when a fatal (severity `error`) signature was found.
const EXIT_FATAL: u8 = 3;

#[derive(clap::Args)]
#[command(after_help = "\
Exit status:
  0  no fatal signature found (warnings and unknown lines may still be listed)
  1  logscan itself failed (a file could not be read)
  2  bad command line
  3  a fatal signature (severity error) was found")]
pub struct Args {
    /// Log files to scan; `-` reads standard input. Any size: lines are streamed.
    #[arg(value_name = "FILE", required_unless_present = "list")]
    files: Vec<PathBuf>,
    /// Print the report as JSON (its `schema_version` says the shape) instead of a summary.
    #[arg(long)]
    json: bool,
    /// List the known signatures (id, phase, severity, reference) and exit.
    #[arg(long, conflicts_with = "files")]
    list: bool,
}

pub fn run(_ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let kb = KnowledgeBase::builtin();
    let mut stdout = io::stdout().lock();
    if args.list {
        list(kb, &args, &mut stdout)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut scanner = Scanner::new(kb);
    for path in &args.files {
        if path.as_os_str() == "-" {
            scanner
                .scan("-", io::stdin().lock())
                .context("reading standard input")?;
        } else {
            let file =
                File::open(path).with_context(|| format!("opening log file {}", path.display()))?;
            let name = path.display().to_string();
            scanner
                .scan(&name, file)
                .with_context(|| format!("reading log file {}", path.display()))?;
        }
    }
    let report = scanner.finish();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report).context("writing the JSON report")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(render_human(&report).as_bytes())?;
    }
    Ok(if report.has_fatal() {
        ExitCode::from(EXIT_FATAL)
    } else {
        ExitCode::SUCCESS
    })
}

fn list(kb: &KnowledgeBase, args: &Args, out: &mut impl Write) -> Result<()> {
    if args.json {
        serde_json::to_writer_pretty(&mut *out, kb.signatures())?;
        writeln!(out)?;
        return Ok(());
    }
    for phase in Phase::ALL {
        for sig in kb.signatures().iter().filter(|s| s.phase == phase) {
            writeln!(
                out,
                "{:<6} {:<8} {:<40} {}",
                sig.phase, sig.severity, sig.id, sig.reference
            )?;
        }
    }
    Ok(())
}
