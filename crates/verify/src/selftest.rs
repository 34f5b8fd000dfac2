//! The selftest level: the kernel crate's `commstack-selftest`, run against the NVSHMEM of
//! the environment being verified (its lib directory first on the library path), checked
//! for its verdict and for which libnvshmem_host it really loaded. With several PEs per
//! GPU it runs under a CUDA MPS daemon started for it and stopped after ([`MpsDaemon`]):
//! the bootstrap and the cross-process paths checked where one GPU is all there is.

use std::path::Path;
use std::process::Command;

use crate::check::Check;
use crate::expect::Expectations;
use crate::mps::MpsDaemon;
use crate::report::{Level, LevelReport};

pub fn run(
    bin: &Path,
    expect: &Expectations,
    log_dir: Option<&Path>,
    pes_per_gpu: u32,
) -> LevelReport {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return LevelReport::failed(Level::Selftest, &e.into()),
    };
    let json = dir.path().join("selftest.json");
    let mut cmd = Command::new(bin);
    cmd.args(["--gpus", "1", "--json"]).arg(&json);
    let mps = match pes_per_gpu > 1 {
        false => None,
        true => match MpsDaemon::start() {
            Ok(d) => Some(d),
            Err(e) => return LevelReport::failed(Level::Selftest, &e),
        },
    };
    if let Some(daemon) = &mps {
        cmd.arg("--pes-per-gpu")
            .arg(pes_per_gpu.to_string())
            .envs(daemon.env());
    }
    if let Some(prefix) = &expect.nvshmem_prefix {
        let lib = prefix.join("lib");
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        cmd.env(
            "LD_LIBRARY_PATH",
            if old.is_empty() {
                lib.display().to_string()
            } else {
                format!("{}:{old}", lib.display())
            },
        );
    }
    let out = cmd.output();
    let mps_log = mps.as_ref().map(MpsDaemon::log);
    drop(mps);
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            return LevelReport::failed(
                Level::Selftest,
                &anyhow::anyhow!("cannot run {}: {e}", bin.display()),
            );
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(d) = log_dir {
        let _ = std::fs::create_dir_all(d);
        let _ = std::fs::write(d.join("selftest.log"), &text);
        if let Some(log) = &mps_log {
            let _ = std::fs::write(d.join("selftest-mps-control.log"), log);
        }
    }
    let tail: String = text
        .lines()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ");
    let code = out.status.code();
    let report: Option<serde_json::Value> = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let mut checks = Vec::new();
    match code {
        Some(0) => checks.push(Check::pass(
            "selftest.verdict",
            format!("every byte right; {tail}"),
        )),
        Some(1) => checks.push(Check::fail(
            "selftest.verdict",
            format!("wrong bytes or a crashed rank: {tail}"),
            "read the self-test log: a wrong byte with the stack's NVSHMEM is a stack defect",
        )),
        Some(3) => checks.push(Check::fail(
            "selftest.verdict",
            format!("put bandwidth below the required share of the copy: {tail}"),
            "check the GPU clocks and other load; see docs/benchmarks.md for expected numbers",
        )),
        _ if text.contains("no CUDA driver") => {
            return LevelReport::not_run(
                Level::Selftest,
                format!("no CUDA driver on this host: {tail}"),
            );
        }
        _ => checks.push(Check::fail(
            "selftest.verdict",
            format!("the self-test could not run (exit {code:?}): {tail}"),
            "read the self-test log in the report directory",
        )),
    }
    if let (Some(prefix), Some(r)) = (&expect.nvshmem_prefix, &report) {
        for rank in r["ranks"].as_array().into_iter().flatten() {
            let loaded = rank["nvshmem"]["loaded_library"].as_str().unwrap_or("");
            let name = format!("selftest.nvshmem-loaded.rank{}", rank["rank"]);
            checks.push(if Path::new(loaded).starts_with(prefix) {
                Check::pass(&name, loaded.to_string())
            } else {
                Check::fail(
                    &name,
                    format!("rank loaded {loaded:?}, not the library under {}", prefix.display()),
                    "another libnvshmem_host comes first on the library path (RUNPATH or LD_LIBRARY_PATH)",
                )
            });
        }
    }
    LevelReport::ran(Level::Selftest, checks, report.unwrap_or_default())
}
