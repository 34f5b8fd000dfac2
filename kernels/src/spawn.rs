//! `--gpus N [--pes-per-gpu K]`: starts N*K copies of this program as ranks 0..N*K (K
//! on each GPU), waits for them (with a deadline), and merges the rank reports they write.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::driver;
use crate::options::{TestOptions, env_names, mps_env_defaults, nvshmem_env_defaults};
use crate::report::{RankReport, Report, read_json};

/// How long the other ranks may keep running after one has failed: they are likely
/// blocked in a collective waiting for it.
const GRACE_AFTER_FAILURE: Duration = Duration::from_secs(15);

/// Runs `gpus * pes_per_gpu` ranks of `exe` on this machine, rank r on GPU r /
/// pes_per_gpu, and returns the merged report.
pub fn run_local(
    exe: &Path,
    opts: &TestOptions,
    gpus: usize,
    pes_per_gpu: usize,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let visible = driver::device_count()?;
    if visible < gpus {
        bail!("--gpus {gpus}, but only {visible} GPU(s) are visible (CUDA_VISIBLE_DEVICES?)");
    }
    let dir = tempfile::Builder::new()
        .prefix("commstack-selftest-")
        .tempdir()
        .context("creating a directory for the rank reports")?;
    let rdzv = free_loopback_addr()?;
    let world = gpus * pes_per_gpu;
    let defaults: Vec<(&str, String)> = nvshmem_env_defaults(opts, world, true)
        .into_iter()
        .chain(mps_env_defaults(pes_per_gpu as u32))
        .filter(|(k, _)| std::env::var_os(k).is_none())
        .collect();
    for (k, v) in &defaults {
        eprintln!("commstack-selftest: {k}={v} for the ranks (set it to override)");
    }

    let report_path = |rank: usize| dir.path().join(format!("rank{rank}.json"));
    let mut children: Vec<Option<Child>> = Vec::with_capacity(world);
    for rank in 0..world {
        let mut cmd = Command::new(exe);
        cmd.args(opts.to_args())
            .env(env_names::RANK, rank.to_string())
            .env(env_names::WORLD_SIZE, world.to_string())
            .env(env_names::LOCAL_RANK, (rank / pes_per_gpu).to_string())
            .env(env_names::REPORT, report_path(rank))
            .env(env_names::RDZV_ADDR, &rdzv)
            .envs(defaults.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null());
        match cmd.spawn() {
            Ok(child) => children.push(Some(child)),
            Err(e) => {
                kill_all(&mut children);
                return Err(e).with_context(|| format!("starting rank {rank} ({})", exe.display()));
            }
        }
    }

    let statuses = wait_all(&mut children, timeout);
    let mut report = Report::new(opts.seed, world, opts.clone());
    for (rank, status) in statuses.into_iter().enumerate() {
        let path = report_path(rank);
        match (status, path.exists()) {
            (_, true) => match read_json::<RankReport>(&path) {
                Ok(r) => report.ranks.push(r),
                Err(e) => report
                    .errors
                    .push(format!("rank {rank}: unreadable report: {e:#}")),
            },
            (Outcome::Exited(s), false) => report.errors.push(format!(
                "rank {rank} exited with {s} without a report (see its output above)"
            )),
            (Outcome::Killed(why), false) => {
                report.errors.push(format!("rank {rank} was killed: {why}"))
            }
        }
    }
    Ok(report)
}

#[derive(Debug)]
enum Outcome {
    Exited(ExitStatus),
    Killed(String),
}

/// Waits for every child; after the first failure the rest get [`GRACE_AFTER_FAILURE`],
/// after `timeout` everything left is killed.
fn wait_all(children: &mut [Option<Child>], timeout: Duration) -> Vec<Outcome> {
    let start = Instant::now();
    let mut outcomes: Vec<Option<Outcome>> = (0..children.len()).map(|_| None).collect();
    let mut first_failure: Option<(usize, Instant)> = None;
    loop {
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    // Exit status 1 is "wrong data", a finished run: not a failure here.
                    if !status.success() && status.code() != Some(1) && first_failure.is_none() {
                        first_failure = Some((rank, Instant::now()));
                    }
                    outcomes[rank] = Some(Outcome::Exited(status));
                    *slot = None;
                }
                Ok(None) => {}
                Err(e) => {
                    outcomes[rank] = Some(Outcome::Killed(format!("could not wait for it: {e}")));
                    let _ = child.kill();
                    let _ = child.wait();
                    *slot = None;
                }
            }
        }
        if children.iter().all(Option::is_none) {
            break;
        }
        let why = if start.elapsed() >= timeout {
            Some(format!(
                "still running after --timeout {}s",
                timeout.as_secs()
            ))
        } else if let Some((failed, at)) =
            first_failure.filter(|(_, at)| at.elapsed() >= GRACE_AFTER_FAILURE)
        {
            Some(format!(
                "still running {}s after rank {failed} failed",
                at.elapsed().as_secs()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            for (rank, slot) in children.iter_mut().enumerate() {
                if let Some(mut child) = slot.take() {
                    eprintln!(
                        "commstack-selftest: killing rank {rank} (pid {}): {why}",
                        child.id()
                    );
                    let _ = child.kill();
                    let _ = child.wait();
                    outcomes[rank] = Some(Outcome::Killed(why.clone()));
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    outcomes
        .into_iter()
        .map(|o| o.expect("every child has an outcome"))
        .collect()
}

fn kill_all(children: &mut [Option<Child>]) {
    for mut child in children.iter_mut().filter_map(Option::take) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A loopback address with a port that was free a moment ago (rank 0 binds it).
fn free_loopback_addr() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port on 127.0.0.1")?;
    Ok(listener
        .local_addr()
        .context("reading the port")?
        .to_string())
}

/// `FILE` for one report, `FILE.rank<R>` for rank R's part under an outside launcher.
pub fn rank_json_path(json: &Path, rank: usize, world: usize) -> PathBuf {
    if world == 1 {
        json.to_path_buf()
    } else {
        let mut s = json.as_os_str().to_owned();
        s.push(format!(".rank{rank}"));
        PathBuf::from(s)
    }
}
