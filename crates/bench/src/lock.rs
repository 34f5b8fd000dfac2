//! `bench lock`: `cargo xtask lock` on the current stack, cold (empty cache) and no-op, as
//! whole processes; optionally beside `uv pip compile` and `pip install --dry-run --report`
//! for the same target.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_steps::ctx::Ctx;

use crate::stats::stats;

/// What `bench lock` measures.
pub struct Request {
    /// Repetitions of each measurement.
    pub runs: usize,
    /// Also time `pip install --dry-run --ignore-installed --report` for the same target.
    pub with_pip: bool,
    /// Also time `uv pip compile --no-cache` with this uv binary.
    pub with_uv: Option<PathBuf>,
}

/// The stack's target, as the other resolvers are told it.
struct Target {
    torch: String,
    /// `3.11`
    python: String,
    glibc: (u32, u32),
    arch: String,
    index_url: String,
}

/// Runs the measurements and prints one table row each. `xtask` is the xtask binary (the
/// caller's `std::env::current_exe()`), run as whole processes.
pub fn bench_lock(ctx: &Ctx, req: &Request, xtask: &Path) -> Result<ExitCode> {
    let uv = req
        .with_uv
        .as_ref()
        .map(|p| std::fs::canonicalize(p).with_context(|| format!("no uv at {}", p.display())))
        .transpose()?;
    let stack = commstack_steps::util::read_stack(&ctx.stack_path)?;
    let t = &stack.target;
    let target = Target {
        torch: stack.torch.version.to_string(),
        python: format!("{}.{}", t.python.0, t.python.1),
        glibc: t.glibc,
        arch: t.arch.as_str().to_string(),
        index_url: stack.resolve.index_url.clone(),
    };
    let (cold, noop) = time_xtask_lock(ctx, req.runs, xtask)?;
    println!(
        "| `cargo xtask lock` cold (empty cache, whole process) | {} |",
        stats(&cold, 2)
    );
    println!(
        "| `cargo xtask lock` no-op (lock up to date) | {} |",
        stats(&noop, 3)
    );
    if let Some(uv) = uv {
        let times = time_uv(&uv, &target, req.runs)?;
        println!(
            "| `uv pip compile --generate-hashes --no-cache` ({}) | {} |",
            uv.display(),
            stats(&times, 2)
        );
    }
    if req.with_pip {
        let times = time_pip(&target, req.runs)?;
        println!(
            "| `pip install --dry-run --report` (same target) | {} |",
            stats(&times, 1)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `runs` times, in a fresh directory with a copy of the stack: `xtask lock` cold (an empty
/// home), then again (a no-op); the seconds of each.
fn time_xtask_lock(ctx: &Ctx, runs: usize, xtask: &Path) -> Result<(Vec<f64>, Vec<f64>)> {
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
            let out = Command::new(xtask)
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
    Ok((cold, noop))
}

/// `uv pip compile --no-cache --generate-hashes` of torch for the target, `runs` times.
fn time_uv(uv: &Path, target: &Target, runs: usize) -> Result<Vec<f64>> {
    let mut times = Vec::new();
    for _ in 0..runs {
        let dir = tempfile::tempdir()?;
        std::fs::write(
            dir.path().join("in.txt"),
            format!("torch=={}\n", target.torch),
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
                &target.python,
                "--python-platform",
                &format!("x86_64-manylinux_{}_{}", target.glibc.0, target.glibc.1),
            ])
            .args(["--index-url", &target.index_url])
            .current_dir(dir.path())
            .output()?;
        if !out.status.success() {
            bail!("uv failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(times)
}

/// `pip install --dry-run --ignore-installed --report` of torch for the target, `runs`
/// times.
fn time_pip(target: &Target, runs: usize) -> Result<Vec<f64>> {
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
            .args(["--only-binary=:all:", "--python-version", &target.python])
            // pip matches each --platform exactly: name every manylinux level up to the target.
            .args(
                pip_platforms(target.glibc.1, &target.arch)
                    .iter()
                    .flat_map(|p| ["--platform".to_string(), p.clone()]),
            )
            .arg("--target")
            .arg(dir.path().join("t"))
            .args([
                "--report",
                "report.json",
                &format!("torch=={}", target.torch),
            ])
            .env("PIP_FIND_LINKS", "")
            .current_dir(dir.path())
            .output()?;
        if !out.status.success() {
            bail!("pip failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(times)
}

/// pip's `--platform` values from manylinux_2_`glibc_minor` down to manylinux1.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pip_platforms_name_every_manylinux_level_down_to_manylinux1() {
        assert_eq!(
            pip_platforms(7, "x86_64"),
            [
                "manylinux_2_7_x86_64",
                "manylinux_2_6_x86_64",
                "manylinux_2_5_x86_64",
                "manylinux2014_x86_64",
                "manylinux2010_x86_64",
                "manylinux1_x86_64",
            ]
        );
    }
}
