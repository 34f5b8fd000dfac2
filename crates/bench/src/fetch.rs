//! Fetch benchmarks, for `cargo xtask bench fetch` and docs/benchmarks.md
//! ([`bench_fetch`] runs both on a part of the lock and prints their lines):
//! - [`cold`]: every artifact into an empty cache, beside `pip download --no-deps` of the
//!   same wheel URLs;
//! - [`resume`]: a real `xtask fetch` process killed (SIGKILL) half-way, then a second
//!   fetch into the same cache; reports how many bytes were downloaded twice.
//!
//! Both work in a fresh directory under the system temp dir, removed afterwards.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use commstack_fetch::{Artifact, FetchOptions, Summary, fetch_all};

use commstack_steps::ctx::Ctx;
use commstack_steps::flow::lock::{artifacts_of_parts, read_lock};
use commstack_steps::options::Part;
use commstack_steps::util::human;

/// What `bench fetch` measures.
pub struct Request {
    /// Which part of the lock (wheels: the target closure; toolchain).
    pub part: Part,
    /// Parallel downloads.
    pub jobs: usize,
    /// Also time `pip download --no-deps` of the same files.
    pub with_pip: bool,
    /// Skip the kill-and-resume measurement.
    pub no_resume: bool,
}

/// The part's artifacts of `ctx`'s lock: [`cold`], then (unless `no_resume`) [`resume`]
/// with the xtask binary `xtask`; prints a line for each.
pub fn bench_fetch(ctx: &Ctx, req: &Request, xtask: &Path) -> Result<ExitCode> {
    let artifacts = artifacts_of_parts(&read_lock(ctx)?, &[req.part])?;
    let cold = cold(&artifacts, req.jobs, req.with_pip)?;
    println!("{}", cold.line());
    if !req.no_resume {
        let resumed = resume(&artifacts, xtask, req.jobs)?;
        println!("{}", resumed.line());
    }
    Ok(ExitCode::SUCCESS)
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Result<Scratch> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "commstack-bench-{what}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Debug)]
pub struct ColdReport {
    pub artifacts: usize,
    pub bytes: u64,
    pub jobs: usize,
    pub fetch_seconds: f64,
    /// `pip download --no-deps --no-cache-dir` of the same wheel URLs (None when not run).
    pub pip_seconds: Option<f64>,
}

impl ColdReport {
    pub fn line(&self) -> String {
        let rate = |s: f64| human((self.bytes as f64 / s) as u64) + "/s";
        let mut line = format!(
            "cold fetch: {} artifacts, {} in {:.1}s ({}, --jobs {})",
            self.artifacts,
            human(self.bytes),
            self.fetch_seconds,
            rate(self.fetch_seconds),
            self.jobs
        );
        if let Some(pip) = self.pip_seconds {
            line.push_str(&format!(
                "; pip download --no-deps of the same files: {pip:.1}s ({})",
                rate(pip)
            ));
        }
        line
    }
}

/// Fetches `artifacts` into an empty cache and times it; with `with_pip`, then times
/// `python3 -m pip download --no-deps --no-cache-dir` of the same wheel URLs.
pub fn cold(artifacts: &[Artifact], jobs: usize, with_pip: bool) -> Result<ColdReport> {
    let scratch = Scratch::new("cold")?;
    let mut options = FetchOptions::new(scratch.0.join("cache"));
    options.jobs = jobs;
    options.progress = false;
    let start = Instant::now();
    let fetched = fetch_all(artifacts, &options)?;
    let fetch_seconds = start.elapsed().as_secs_f64();
    let bytes = Summary::of(&fetched).bytes_downloaded;
    let pip_seconds = match with_pip {
        false => None,
        true => {
            let wheels: Vec<&str> = artifacts
                .iter()
                .filter(|a| a.filename.ends_with(".whl"))
                .map(|a| a.urls[0].as_str())
                .collect();
            let dest = scratch.0.join("pip");
            let start = Instant::now();
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--no-cache-dir",
                    "--quiet",
                    "--dest",
                ])
                .arg(&dest)
                .args(&wheels)
                .status()
                .context("running python3 -m pip download")?;
            if !status.success() {
                bail!("pip download failed ({status})");
            }
            Some(start.elapsed().as_secs_f64())
        }
    };
    Ok(ColdReport {
        artifacts: artifacts.len(),
        bytes,
        jobs,
        fetch_seconds,
        pip_seconds,
    })
}

#[derive(Debug)]
pub struct ResumeReport {
    pub total_bytes: u64,
    /// What the killed process had written to the cache (whole and partial files).
    pub on_disk_at_kill: u64,
    /// What the second fetch downloaded.
    pub second_run_bytes: u64,
    /// Bytes downloaded by both runs: on_disk_at_kill + second_run_bytes - total_bytes.
    pub refetched_bytes: u64,
    pub second_run_seconds: f64,
}

impl ResumeReport {
    pub fn refetched_fraction(&self) -> f64 {
        self.refetched_bytes as f64 / self.total_bytes.max(1) as f64
    }

    pub fn line(&self) -> String {
        format!(
            "resume: killed at {} of {}; the second run downloaded {} in {:.1}s; re-downloaded {} ({:.2}% of the total)",
            human(self.on_disk_at_kill),
            human(self.total_bytes),
            human(self.second_run_bytes),
            self.second_run_seconds,
            human(self.refetched_bytes),
            100.0 * self.refetched_fraction()
        )
    }
}

/// Starts `<xtask> --home H --quiet fetch --artifacts LIST`, SIGKILLs it once half the
/// bytes are on disk, then fetches again in this process into the same cache.
/// `xtask` is the path of the xtask binary (the caller's `std::env::current_exe()`).
pub fn resume(artifacts: &[Artifact], xtask: &Path, jobs: usize) -> Result<ResumeReport> {
    let total_bytes: u64 = artifacts
        .iter()
        .map(|a| {
            a.size
                .with_context(|| format!("{}: the resume benchmark needs every size", a.name))
        })
        .sum::<Result<u64>>()?;
    let scratch = Scratch::new("resume")?;
    let list = scratch.0.join("artifacts.json");
    std::fs::write(&list, serde_json::to_string(artifacts)?)?;
    let cache = scratch.0.join("cache");
    let mut child = Command::new(xtask)
        .arg("--home")
        .arg(&scratch.0)
        .args([
            "--quiet",
            "fetch",
            "--jobs",
            &jobs.to_string(),
            "--artifacts",
        ])
        .arg(&list)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", xtask.display()))?;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the first fetch ended ({status}) before half-way: use larger artifacts");
        }
        if bytes_under(&cache) >= total_bytes / 2 {
            child.kill()?;
            child.wait()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let on_disk_at_kill = bytes_under(&cache);
    let mut options = FetchOptions::new(&cache);
    options.jobs = jobs;
    options.progress = false;
    let start = Instant::now();
    let fetched = fetch_all(artifacts, &options)?;
    let second_run_seconds = start.elapsed().as_secs_f64();
    let second_run_bytes = Summary::of(&fetched).bytes_downloaded;
    Ok(ResumeReport {
        total_bytes,
        on_disk_at_kill,
        second_run_bytes,
        refetched_bytes: (on_disk_at_kill + second_run_bytes).saturating_sub(total_bytes),
        second_run_seconds,
    })
}

/// Bytes of the cache's finished and partial files.
fn bytes_under(cache: &Path) -> u64 {
    let mut total = 0;
    for sub in ["sha256", "tmp"] {
        let mut stack = vec![cache.join(sub)];
        while let Some(dir) = stack.pop() {
            let Ok(read) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in read.flatten() {
                match entry.metadata() {
                    Ok(meta) if meta.is_dir() => stack.push(entry.path()),
                    Ok(meta) => total += meta.len(),
                    Err(_) => {}
                }
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two real wheels from PyPI (about 260 MB): torch 2.11.0's NVSHMEM and NCCL pins.
    fn real_wheels() -> Vec<Artifact> {
        serde_json::from_str(include_str!("bench_wheels.json")).expect("bench_wheels.json")
    }

    /// The xtask binary next to this test binary (`cargo build -p xtask` first).
    fn xtask_binary() -> PathBuf {
        let deps = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        let exe = deps.parent().unwrap().join("xtask");
        assert!(
            exe.is_file(),
            "{} missing: run `cargo build -p xtask` first",
            exe.display()
        );
        exe
    }

    /// The fixture the real benchmark below reads: it parses, and every artifact has the
    /// size `resume` needs and a URL on PyPI's file host.
    #[test]
    fn the_real_wheels_fixture_parses_with_sizes() {
        let wheels = real_wheels();
        assert_eq!(wheels.len(), 2);
        for w in &wheels {
            assert!(w.size.is_some_and(|s| s > 0), "{}: no size", w.name);
            assert!(w.filename.ends_with(".whl"), "{}", w.filename);
            assert!(
                w.urls[0].starts_with("https://files.pythonhosted.org/"),
                "{}",
                w.urls[0]
            );
        }
    }

    #[test]
    #[ignore = "downloads ~260 MB from PyPI twice; run: cargo build -p xtask && cargo test -p commstack-bench -- --ignored --nocapture fetch_bench_real_pypi"]
    fn fetch_bench_real_pypi() {
        let wheels = real_wheels();
        let cold = cold(&wheels, 4, true).unwrap();
        println!("{}", cold.line());
        let resume = resume(&wheels, &xtask_binary(), 4).unwrap();
        println!("{}", resume.line());
        assert!(resume.refetched_fraction() < 0.10, "{}", resume.line());
    }
}
