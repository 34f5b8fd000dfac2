//! `cargo xtask envlint FILE...`: the environment of env files, scripts and manifests
//! checked against the stack's build. Parse, then one call into crates/deploy.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_deploy::lint_files::{LintRequest, lint_files};
use commstack_envlint::report::{Report, SCHEMA, human};
use commstack_steps::ctx::Ctx;

/// Exit status when something was found.
const EXIT_FINDINGS: u8 = 3;

#[derive(clap::Args)]
#[command(after_help = "\
Files: *.yaml/*.yml are Kubernetes manifests (every container's env, and envFrom ConfigMaps
of the same file), scripts (*.sh, *.sbatch, or a #! first line) give their `export` lines,
anything else is an env file of KEY=VALUE lines.

Checked: names under NVSHMEM_, NCCL_, EP_ and UCX_ (and near misses of known names) against
NVSHMEM's variables read from the stack's locked NVSHMEM source (its NVSHMEMI_ENV_DEF entries,
with the build-option guards around them), its build-time options, NCCL's and DeepEP's
tables; values as each library reads them. Findings: unknown (with the nearest known name),
build-time (an option of the build set at run time), not-built (a variable of a transport
this NVSHMEM was built without), type, duplicate.

Exit status:
  0  nothing found
  1  envlint itself failed (a file, the stack or the NVSHMEM source could not be read)
  2  bad command line
  3  findings (listed)")]
pub struct Args {
    /// Env files, scripts and manifests to check.
    #[arg(value_name = "FILE", required = true)]
    files: Vec<PathBuf>,
    /// Print the report as JSON (schema commstack-envlint/1).
    #[arg(long)]
    json: bool,
    /// The NVSHMEM source to read its variables from (archive or unpacked tree), instead
    /// of the locked one in the download cache.
    #[arg(long, value_name = "PATH")]
    nvshmem_source: Option<PathBuf>,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let report = lint_files(&LintRequest {
        stack_path: ctx.stack_path.clone(),
        lock_path: ctx.lock_path(),
        cache_dir: ctx.cache_dir(),
        nvshmem_source: args.nvshmem_source,
        files: args.files.clone(),
        stack_flag: ctx.stack_flag(),
    })?;
    let mut out = std::io::stdout().lock();
    if args.json {
        let files: Vec<String> = args.files.iter().map(|f| f.display().to_string()).collect();
        let source = report.nvshmem_source.display().to_string();
        serde_json::to_writer_pretty(
            &mut out,
            &Report {
                schema: SCHEMA,
                nvshmem_source: &source,
                files: &files,
                settings: report.settings,
                findings: &report.findings,
            },
        )?;
        writeln!(out)?;
    } else {
        out.write_all(human(&report.findings, report.settings, args.files.len()).as_bytes())?;
    }
    Ok(if report.findings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FINDINGS)
    })
}
