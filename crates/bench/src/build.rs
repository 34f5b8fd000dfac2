//! `bench build`: the whole graph's no-op time (`cargo xtask build` with everything built,
//! as whole processes), and the image's size beside what it holds installed: the base's
//! files plus every wheel's files (what an installer would write), so bloat (a copied
//! wheel, build leftovers) shows as a ratio.

use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_deepep::wheelhouse::Wheelhouse;

use commstack_steps::ctx::Ctx;
use commstack_steps::graph::StepId;
use commstack_steps::options::{BuildOptions, GraphOptions, SourceFetch};
use commstack_steps::util::human;

/// What `bench build` measures.
pub struct Request {
    /// Repetitions of the no-op (at least 1).
    pub runs: usize,
    /// Where the locked sources come from (passed on to each no-op build).
    pub fetch: SourceFetch,
}

/// Builds everything (as `build --locked`), then times `req.runs` no-op builds of the
/// xtask binary `xtask` (the caller's `std::env::current_exe()`) as whole processes and
/// prints the image's size against what it holds installed; exit status 1 when a target
/// is missed.
pub fn bench_build(ctx: &Ctx, req: &Request, xtask: &Path) -> Result<ExitCode> {
    let (runs, fetch) = (req.runs, &req.fetch);
    let args = BuildOptions {
        fetch: fetch.clone(),
        ..Default::default()
    };
    let graph = GraphOptions {
        locked: true,
        ..Default::default()
    };
    let made = commstack_pipeline::command::build(ctx, &graph, &args)?;
    if made.exit != ExitCode::SUCCESS {
        bail!("the build failed: see {}", made.summary_file.display());
    }
    let output = |step: StepId| {
        made.rows
            .iter()
            .find(|r| r.step == step)
            .and_then(|r| r.output.clone())
            .with_context(|| format!("the build made no {step} (does the stack have [image]?)"))
    };
    let (image_dir, base_dir, wheelhouse_dir) = (
        output(StepId::Image)?,
        output(StepId::Base)?,
        output(StepId::Wheelhouse)?,
    );
    let image = commstack_image::Image::open(&image_dir)?;

    let mut noop = Vec::new();
    for _ in 0..runs {
        let mut cmd = Command::new(xtask);
        cmd.args(["--quiet", "--stack"])
            .arg(&ctx.stack_path)
            .args(["build", "--locked"]);
        for m in &fetch.mirror {
            cmd.args(["--mirror", m]);
        }
        if fetch.accept_tree_match {
            cmd.arg("--accept-tree-match");
        }
        let t = Instant::now();
        let out = cmd.output()?;
        if !out.status.success() {
            bail!(
                "no-op build failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        noop.push(t.elapsed().as_secs_f64());
    }
    let image = &image;
    let size: u64 = image.manifest.layers.iter().map(|l| l.size).sum();
    let base = tar_file_bytes(&base_dir.join("rootfs.tar"))?;
    let house = Wheelhouse::open(&wheelhouse_dir)?;
    let mut wheels = 0u64;
    for w in &house.manifest.wheels {
        let wheel = commstack_wheel::Wheel::open(&house.wheel_path(&w.filename))?;
        wheels += wheel
            .entries
            .iter()
            .filter(|e| !e.is_dir)
            .map(|e| e.size)
            .sum::<u64>();
    }
    let installed = base + wheels;
    println!("| image {} | {} |", image.id(), image.tag());
    println!(
        "| size | {} ({size} bytes) in {} layers; base files {} + wheel files {} = {}; ratio {:.3} (target <= 1.10) |",
        human(size),
        image.manifest.layers.len(),
        human(base),
        human(wheels),
        human(installed),
        size as f64 / installed as f64
    );
    noop.sort_by(f64::total_cmp);
    println!(
        "| `cargo xtask build --locked` no-op (whole process, every step done, image in Docker) | median {:.2} s of {} (min {:.2}, max {:.2}) (target < 1 s) |",
        noop[noop.len() / 2],
        noop.len(),
        noop[0],
        noop[noop.len() - 1]
    );
    for (i, l) in image.manifest.layers.iter().enumerate() {
        println!("| layer {i} | {} | {} |", human(l.size), l.holds);
    }
    Ok(
        if size as f64 <= 1.10 * installed as f64 && noop[noop.len() / 2] < 1.0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// Bytes of regular files in a tar (hard links counted once).
fn tar_file_bytes(path: &Path) -> Result<u64> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut archive = tar::Archive::new(file);
    let mut bytes = 0;
    for entry in archive.entries()? {
        let entry = entry?;
        if entry.header().entry_type().is_file() {
            bytes += entry.header().size()?;
        }
    }
    Ok(bytes)
}
