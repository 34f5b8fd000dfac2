//! `cargo xtask bench ...`: benchmarks whose results go into docs/benchmarks.md (with the
//! command, the machine and the date). Targets are checked here, not in unit tests.

// `bench fetch`'s measurements (cold fetch beside pip, kill and resume).
mod fetch;
// `bench build`: the whole graph's no-op time, and the image's size against what it holds.
mod build;
// `bench substitute`: a warm registry, docker pull against build --substitute.
mod substitute;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use commstack_pipeline::ctx::Ctx;
use commstack_pipeline::flow::lock::{Part, artifacts_of_parts, read_lock};

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    /// `cargo xtask lock` on the current stack, cold (empty cache) and no-op, as whole
    /// processes; optionally beside `pip install --dry-run --report` and `uv pip compile`.
    Lock {
        /// Repetitions of each measurement.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also time `pip install --dry-run --ignore-installed --report` for the same target
        /// (about 40 s a run).
        #[arg(long)]
        with_pip: bool,
        /// Also time `uv pip compile --no-cache` with this uv binary.
        #[arg(long, value_name = "UV")]
        with_uv: Option<PathBuf>,
    },
    /// `cargo xtask fetch` of the lock's wheels into an empty cache, beside `pip download
    /// --no-deps` of the same URLs; then a fetch killed half-way and resumed.
    Fetch {
        /// Which part of the lock: wheels (the target closure, 2.7 GB for the default
        /// stack) or toolchain.
        #[arg(long, default_value = "wheels")]
        part: String,
        /// Parallel downloads.
        #[arg(long, default_value_t = 4)]
        jobs: usize,
        /// Also time `pip download --no-deps` of the same files.
        #[arg(long)]
        with_pip: bool,
        /// Skip the kill-and-resume measurement.
        #[arg(long)]
        no_resume: bool,
    },
    /// `cargo xtask build`: its no-op time (whole processes, every step done, the image
    /// loaded; target < 1 s) and the image's size against its base's files plus its
    /// wheels' files (target <= 1.10x); builds everything first if needed.
    Build {
        /// Repetitions of the no-op (at least 1).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        #[command(flatten)]
        fetch: commstack_pipeline::flow::build::SourceFetchArgs,
    },
    /// A new machine with a warm registry: pushes this home's image and step outputs
    /// (signed), then times `docker pull` of the image against `build --substitute` in an
    /// empty home (to the loaded, statically verified image; target <= 1.2x docker pull),
    /// and checks both give the image ID that was pushed and that nothing was compiled;
    /// `--then STACK` times an update to STACK's image the same way; `--trials N` runs each
    /// part N times and judges the median of the trials' ratios.
    Substitute(substitute::Args),
    /// logscan throughput on a synthetic log (real-looking NCCL INFO chatter mixed with
    /// every known signature), written to a temporary directory.
    Logscan {
        /// Size of the synthetic log in MiB.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
    },
    /// `deploy render` of the current stack for each target, whole (stack.toml, the lock,
    /// NVSHMEM's variables read from its source, render, envlint, files written); target
    /// under 1 s each.
    Deploy {
        /// Renders per target.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        /// The image reference rendered (it is not pulled).
        #[arg(
            long,
            default_value = "registry.example.com/commstack/bench@sha256:390fb29b8501aa6f0e8ef8d0c2b9d0f6a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1"
        )]
        image: String,
        /// The NVSHMEM source, instead of the locked one in the cache.
        #[arg(long, value_name = "PATH")]
        nvshmem_source: Option<PathBuf>,
    },
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    match args.which {
        Which::Build { runs, fetch } => build::bench_build(ctx, runs as usize, fetch),
        Which::Substitute(a) => substitute::bench_substitute(
            ctx,
            &substitute::Request {
                registry: &a.registry,
                key: &a.key,
                ca_file: a.ca_file.as_deref(),
                fetch: &a.fetch,
                keep: a.keep,
                pushed: a.pushed,
                then: a.then.as_deref(),
                trials: usize::from(a.trials),
            },
        ),
        Which::Lock {
            runs,
            with_pip,
            with_uv,
        } => {
            let uv = with_uv
                .map(|p| {
                    std::fs::canonicalize(&p).with_context(|| format!("no uv at {}", p.display()))
                })
                .transpose()?;
            bench_lock(ctx, runs, with_pip, uv.as_deref())
        }
        Which::Fetch {
            part,
            jobs,
            with_pip,
            no_resume,
        } => {
            let part = match part.as_str() {
                "wheels" => Part::Wheels,
                "toolchain" => Part::Toolchain,
                other => bail!("--part {other}: use wheels or toolchain"),
            };
            let artifacts = artifacts_of_parts(&read_lock(ctx)?, &[part])?;
            let cold = fetch::cold(&artifacts, jobs, with_pip)?;
            println!("{}", cold.line());
            if !no_resume {
                let resumed = fetch::resume(&artifacts, &std::env::current_exe()?, jobs)?;
                println!("{}", resumed.line());
            }
            Ok(ExitCode::SUCCESS)
        }
        Which::Deploy {
            runs,
            image,
            nvshmem_source,
        } => {
            let req = commstack_deploy::RenderRequest {
                stack_path: ctx.stack_path.clone(),
                lock_path: ctx.lock_path(),
                cache_dir: ctx.cache_dir(),
                target: commstack_deploy::Target::K8s,
                image: commstack_deploy::ImageSource::Reference(image),
                out: None,
                nvshmem_source,
                stack_flag: ctx.stack_flag(),
            };
            for t in commstack_deploy::bench::render_timings(&req, runs as usize)? {
                let median = t.median().as_secs_f64();
                println!(
                    "| `cargo xtask deploy render --target {}` (median of {}) | {:.3} s | target < 1 s: {} |",
                    t.target.as_str(),
                    t.runs.len(),
                    median,
                    if median < 1.0 { "met" } else { "NOT met" }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Which::Logscan { mib } => {
            let dir = tempfile::tempdir()?;
            let result = commstack_logscan::bench::run(dir.path(), mib * 1024 * 1024)?;
            println!("{}", result.summary());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn bench_lock(ctx: &Ctx, runs: usize, with_pip: bool, with_uv: Option<&Path>) -> Result<ExitCode> {
    let stack = commstack_pipeline::util::read_stack(&ctx.stack_path)?;
    let exe = std::env::current_exe().context("cannot find the xtask binary")?;
    let mut cold = Vec::new();
    let mut noop = Vec::new();
    for i in 0..runs {
        let dir = tempfile::tempdir()?;
        let manifest = dir.path().join("stack.toml");
        std::fs::copy(&ctx.stack_path, &manifest)
            .with_context(|| format!("copying {}", ctx.stack_path.display()))?;
        let home = dir.path().join("home");
        let time = |label: &str| -> Result<f64> {
            let t = Instant::now();
            let out = Command::new(&exe)
                .args(["--quiet", "--stack"])
                .arg(&manifest)
                .arg("--home")
                .arg(&home)
                .arg("lock")
                .output()?;
            if !out.status.success() {
                bail!(
                    "{label} lock failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(t.elapsed().as_secs_f64())
        };
        let c = time("cold")?;
        let n = time("no-op")?;
        eprintln!("run {}: cold {c:.2} s, no-op {n:.3} s", i + 1);
        cold.push(c);
        noop.push(n);
    }
    let t = &stack.target;
    let py = format!("{}.{}", t.python.0, t.python.1);
    println!(
        "| `cargo xtask lock` cold (empty cache, whole process) | {} |",
        stats(&cold, 2)
    );
    println!(
        "| `cargo xtask lock` no-op (lock up to date) | {} |",
        stats(&noop, 3)
    );
    if let Some(uv) = with_uv {
        let mut times = Vec::new();
        for _ in 0..runs {
            let dir = tempfile::tempdir()?;
            std::fs::write(
                dir.path().join("in.txt"),
                format!("torch=={}\n", stack.torch.version),
            )?;
            let t0 = Instant::now();
            let out = Command::new(uv)
                .args([
                    "pip",
                    "compile",
                    "--quiet",
                    "--no-cache",
                    "--generate-hashes",
                    "in.txt",
                ])
                .args([
                    "--python-version",
                    &py,
                    "--python-platform",
                    &format!("x86_64-manylinux_{}_{}", t.glibc.0, t.glibc.1),
                ])
                .args(["--index-url", &stack.resolve.index_url])
                .current_dir(dir.path())
                .output()?;
            if !out.status.success() {
                bail!("uv failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            times.push(t0.elapsed().as_secs_f64());
        }
        println!(
            "| `uv pip compile --generate-hashes --no-cache` ({}) | {} |",
            uv.display(),
            stats(&times, 2)
        );
    }
    if with_pip {
        let mut times = Vec::new();
        for _ in 0..runs {
            let dir = tempfile::tempdir()?;
            let t0 = Instant::now();
            let out = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--dry-run",
                    "--ignore-installed",
                    "--no-cache-dir",
                    "--quiet",
                ])
                .args(["--only-binary=:all:", "--python-version", &py])
                // pip matches each --platform exactly: name every manylinux level up to the target.
                .args(
                    pip_platforms(t.glibc.1, t.arch.as_str())
                        .iter()
                        .flat_map(|p| ["--platform".to_string(), p.clone()]),
                )
                .arg("--target")
                .arg(dir.path().join("t"))
                .args([
                    "--report",
                    "report.json",
                    &format!("torch=={}", stack.torch.version),
                ])
                .env("PIP_FIND_LINKS", "")
                .current_dir(dir.path())
                .output()?;
            if !out.status.success() {
                bail!("pip failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            times.push(t0.elapsed().as_secs_f64());
        }
        println!(
            "| `pip install --dry-run --report` (same target) | {} |",
            stats(&times, 1)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn pip_platforms(glibc_minor: u32, arch: &str) -> Vec<String> {
    let mut out: Vec<String> = (5..=glibc_minor)
        .rev()
        .map(|m| format!("manylinux_2_{m}_{arch}"))
        .collect();
    out.extend(
        ["manylinux2014", "manylinux2010", "manylinux1"]
            .iter()
            .map(|l| format!("{l}_{arch}")),
    );
    out
}

/// "median 1.02 s (min 0.98, max 1.10, n=3)"
fn stats(v: &[f64], digits: usize) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let median = s[s.len() / 2];
    format!(
        "median {median:.digits$} s (min {:.digits$}, max {:.digits$}, n={})",
        s[0],
        s[s.len() - 1],
        s.len()
    )
}
