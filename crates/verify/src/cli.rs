//! The verify command line, shared by `cargo xtask verify` and the `commstack-verify`
//! binary that images carry (so the check inside a container is the same code and flags).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use commstack_elf::{DottedVersion, NvshmemVersion};

use crate::runner::TestSpec;
use crate::{Expectations, Level, NcclVersion, VerifyOptions, verify_python};

#[derive(clap::Args)]
#[command(after_help = "\
Levels: static (ELF checks, no GPU), runtime (what `import torch, deep_ep` maps), selftest,
tests (--test / --deepep-source, through the runner), exit-clean (the teardown gate of those tests).

Exit status:
  0  every requested level passed
  1  a check failed (or verify itself failed)
  2  nothing failed, but something requested could not run (no GPU, module absent, no
     expected value given): never reported as passed")]
pub struct Args {
    /// The Python interpreter of the environment to verify.
    #[arg(long, value_name = "PATH")]
    python: PathBuf,
    /// Levels to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "static,runtime,selftest,tests,exit-clean"
    )]
    level: Vec<Level>,
    #[command(flatten)]
    expect: Box<ExpectArgs>,
    /// A test to run through the runner and the exit-clean gate: FILE:FUNCTION, or FILE
    /// to run it as a script. Repeatable.
    #[arg(long = "test", value_name = "FILE[:FUNCTION]")]
    tests: Vec<String>,
    /// A DeepEP source tree: tests/test_intranode.py runs with 2, 4 and 8 ranks where
    /// that many GPUs exist, tests/test_low_latency.py with one rank per GPU (up to 8).
    #[arg(long, value_name = "DIR")]
    deepep_source: Option<PathBuf>,
    /// The kernel crate's self-test binary (`cargo xtask build kernels`), for the selftest
    /// level: run on 1 GPU against the environment's NVSHMEM (--nvshmem-prefix).
    #[arg(long, value_name = "PATH")]
    selftest: Option<PathBuf>,
    /// PEs per GPU for the selftest level (its --pes-per-gpu): more than 1 starts a CUDA
    /// MPS daemon for the run (pipe and log directories in a temporary directory) and
    /// stops it after: NVSHMEM's multiple-PEs-per-GPU mode, which checks the bootstrap and
    /// the cross-process paths on a machine with one GPU.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    selftest_pes_per_gpu: u32,
    /// Where the report (verify-<environment>.json and .txt) and test logs go.
    /// Default: <home>/reports for `cargo xtask verify`, ./reports for `commstack-verify`.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Print the JSON report instead of the table.
    #[arg(long)]
    json: bool,
}

/// What the environment must hold (boxed: these are many, and clap keeps them all).
#[derive(clap::Args)]
pub struct ExpectArgs {
    /// The NCCL version the stack pins (ncclGetVersion of the loaded library must match).
    #[arg(long, value_name = "X.Y.Z")]
    expect_nccl: Option<NcclVersion>,
    /// The NVSHMEM version the stack builds.
    #[arg(long, value_name = "X.Y.Z")]
    expect_nvshmem: Option<NvshmemVersion>,
    /// The directory our libnvshmem_host must be loaded from (install prefix or the
    /// drop-in wheel's nvidia/nvshmem).
    #[arg(long, value_name = "DIR")]
    nvshmem_prefix: Option<PathBuf>,
    /// An NVSHMEM build option the library must carry, e.g. NVSHMEM_IBGDA_SUPPORT=ON
    /// (NVSHMEM_USE_NCCL=OFF is always required). Repeatable.
    #[arg(long = "nvshmem-option", value_name = "KEY=VALUE")]
    nvshmem_options: Vec<String>,
    /// SASS architectures libnvshmem_device must hold, e.g. 90. Comma-separated.
    #[arg(long, value_delimiter = ',', value_name = "SM")]
    cuda_arch: Vec<u32>,
    /// The target's glibc version (Debian bookworm: 2.36).
    #[arg(long, value_name = "X.Y")]
    target_glibc: Option<DottedVersion>,
    /// The target's libstdc++ symbol version (gcc 12: 3.4.30).
    #[arg(long, value_name = "X.Y.Z")]
    target_glibcxx: Option<DottedVersion>,
}

/// Runs the levels asked for and writes the report (under `default_report_dir` unless
/// `--report` says otherwise); the exit code is the report's.
pub fn run(args: Args, default_report_dir: PathBuf, quiet: bool) -> Result<ExitCode> {
    let python = args.python.clone();
    let expect = expectations(&args.expect)?;
    let report_dir = args.report.clone().unwrap_or(default_report_dir);
    let mut opts = VerifyOptions::new(&python, args.level.clone(), expect);
    opts.tests = args
        .tests
        .iter()
        .enumerate()
        .map(|(i, t)| test_spec(i, t))
        .collect::<Result<_>>()?;
    opts.deepep_source = args.deepep_source.clone();
    opts.selftest = args.selftest.clone();
    opts.selftest_pes_per_gpu = args.selftest_pes_per_gpu;
    opts.log_dir = Some(report_dir.clone());
    let report = verify_python(&opts)
        .with_context(|| format!("verifying the environment of {}", python.display()))?;
    let written = report.write_to(&report_dir)?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.human());
    }
    if !quiet {
        eprintln!("report: {}", written.display());
    }
    Ok(ExitCode::from(report.exit_code()))
}

/// What the environment must hold, from the command line. The stack lock fills the same
/// struct once it carries these pins.
fn expectations(args: &ExpectArgs) -> Result<Expectations> {
    let mut e = Expectations::new();
    e.nccl_version = args.expect_nccl;
    e.nvshmem_version = args.expect_nvshmem;
    e.nvshmem_prefix = args.nvshmem_prefix.clone();
    for opt in &args.nvshmem_options {
        let (k, v) = opt
            .split_once('=')
            .with_context(|| format!("--nvshmem-option `{opt}` is not KEY=VALUE"))?;
        e.nvshmem_build_vars.insert(k.to_string(), v.to_string());
    }
    if !args.cuda_arch.is_empty() {
        e.cuda_archs = Some(args.cuda_arch.iter().copied().collect::<BTreeSet<u32>>());
    }
    e.target_glibc = args.target_glibc.clone();
    e.target_glibcxx = args.target_glibcxx.clone();
    Ok(e)
}

/// The flags that give `expect` back through [`ExpectArgs`]: how a caller that holds the
/// expectations (the build's verify step) asks the verify tool in an image for the same.
/// Only what the flags can carry: the defaults of [`Expectations::new`] are the tool's own.
pub fn expect_args(expect: &Expectations) -> Vec<String> {
    let mut out = Vec::new();
    let mut flag = |name: &str, value: String| {
        out.push(format!("--{name}"));
        out.push(value);
    };
    if let Some(v) = expect.nccl_version {
        flag("expect-nccl", v.to_string());
    }
    if let Some(v) = expect.nvshmem_version {
        flag("expect-nvshmem", v.to_string());
    }
    if let Some(p) = &expect.nvshmem_prefix {
        flag("nvshmem-prefix", p.display().to_string());
    }
    for (k, v) in &expect.nvshmem_build_vars {
        flag("nvshmem-option", format!("{k}={v}"));
    }
    if let Some(archs) = &expect.cuda_archs {
        let list: Vec<String> = archs.iter().map(u32::to_string).collect();
        flag("cuda-arch", list.join(","));
    }
    if let Some(v) = &expect.target_glibc {
        flag("target-glibc", v.to_string());
    }
    if let Some(v) = &expect.target_glibcxx {
        flag("target-glibcxx", v.to_string());
    }
    out
}

fn test_spec(index: usize, arg: &str) -> Result<TestSpec> {
    let (file, function) = match arg.rsplit_once(':') {
        Some((f, func)) if !func.is_empty() && !func.contains('/') => {
            (PathBuf::from(f), Some(func))
        }
        _ => (PathBuf::from(arg), None),
    };
    if !file.is_file() {
        bail!("--test {arg}: {} is not a file", file.display());
    }
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| format!("test{index}"));
    let name = match function {
        Some(f) => format!("{stem}.{f}"),
        None => stem,
    };
    Ok(match function {
        Some(f) => TestSpec::function(&name, &file, f),
        None => TestSpec::script(&name, &file, &[]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        expect: ExpectArgs,
    }

    #[test]
    fn expectations_go_through_the_flags_unchanged() {
        let mut e = Expectations::new();
        e.nccl_version = Some("2.28.9".parse().unwrap());
        e.nvshmem_version = Some("3.4.5".parse().unwrap());
        e.nvshmem_prefix = Some("/opt/commstack/venv/site/nvidia/nvshmem".into());
        e.nvshmem_build_vars
            .insert("NVSHMEM_IBGDA_SUPPORT".into(), "ON".into());
        e.nvshmem_build_vars
            .insert("NVSHMEM_UCX_SUPPORT".into(), "OFF".into());
        e.cuda_archs = Some([90, 100].into_iter().collect());
        e.target_glibc = Some("2.36".parse().unwrap());
        e.target_glibcxx = Some("3.4.30".parse().unwrap());
        let mut argv = vec!["verify".to_string()];
        argv.extend(expect_args(&e));
        let back = expectations(&Cmd::parse_from(argv).expect).unwrap();
        assert_eq!(
            serde_json::to_value(&back).unwrap(),
            serde_json::to_value(&e).unwrap()
        );
        // Nothing given, nothing asked.
        assert!(expect_args(&Expectations::new()).is_empty());
    }
}
