//! `cargo xtask bench deploy`: how long `deploy render` takes, each target, from reading
//! stack.toml and the NVSHMEM source to the files written (the target: under 1 s).

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::{RenderRequest, Target, run};

/// One target's timings.
pub struct Timing {
    pub target: Target,
    pub runs: Vec<Duration>,
}

impl Timing {
    pub fn median(&self) -> Duration {
        let mut v = self.runs.clone();
        v.sort();
        v[v.len() / 2]
    }
}

/// Runs `req` `trials` times for each target, into a fresh temporary directory.
pub fn render_timings(req: &RenderRequest, trials: usize) -> Result<Vec<Timing>> {
    let dir = tempfile::tempdir()?;
    let mut out = Vec::new();
    for target in [Target::K8s, Target::Slurm] {
        let mut runs = Vec::new();
        for i in 0..trials.max(1) {
            let r = RenderRequest {
                stack_path: req.stack_path.clone(),
                lock_path: req.lock_path.clone(),
                cache_dir: req.cache_dir.clone(),
                target,
                image: req.image.clone(),
                out: Some(dir.path().join(format!("{}-{i}", target.as_str()))),
                nvshmem_source: req.nvshmem_source.clone(),
                stack_flag: req.stack_flag.clone(),
            };
            let start = Instant::now();
            run(&r)?;
            runs.push(start.elapsed());
        }
        out.push(Timing { target, runs });
    }
    Ok(out)
}
