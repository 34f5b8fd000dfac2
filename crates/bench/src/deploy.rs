//! `bench deploy`: `deploy render` timed for each target (NVSHMEM's variables read from its
//! source, the render, envlint, the files written); target under 1 s each.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use commstack_steps::ctx::Ctx;

/// What `bench deploy` is asked for.
pub struct Request {
    /// Renders per target.
    pub runs: usize,
    /// The image reference rendered (it is not pulled).
    pub image: String,
    /// The NVSHMEM source, instead of the locked one in the cache.
    pub nvshmem_source: Option<PathBuf>,
}

/// Renders each target `runs` times and prints one line per target for docs/benchmarks.md.
pub fn bench_deploy(ctx: &Ctx, req: &Request) -> Result<ExitCode> {
    let render = commstack_deploy::RenderRequest {
        stack_path: ctx.stack_path.clone(),
        lock_path: ctx.lock_path(),
        cache_dir: ctx.cache_dir(),
        target: commstack_deploy::Target::K8s,
        image: commstack_deploy::ImageSource::Reference(req.image.clone()),
        out: None,
        nvshmem_source: req.nvshmem_source.clone(),
        stack_flag: ctx.stack_flag(),
    };
    for t in commstack_deploy::bench::render_timings(&render, req.runs)? {
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
