//! `bench build`: the whole graph's no-op time (`cargo xtask build` with everything built,
//! as whole processes), and the image's size beside what it holds installed: the base's
//! files plus every wheel's files (what an installer would write; for DeepEP V2 also the
//! JIT toolchain's CUDA wheels), so bloat (a copied wheel, build leftovers) shows as a
//! ratio, in all and per layer (each layer's tar read from the store: its size, its
//! files' bytes, its entries, against its payload).

use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_deepep::wheelhouse::Wheelhouse;
use commstack_image::plan::LayerKind;

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
    let house = Wheelhouse::open(&wheelhouse_dir)?;
    // DeepEP V2's JIT toolchain layer is the lock's CUDA compiler wheels, not wheelhouse
    // wheels: its payload is their files.
    let settings = commstack_steps::settings::Settings::resolve(ctx, &args)?;
    let jit = commstack_steps::flow::image::jit_toolchain(ctx, &settings)?;
    let parts = payload_by_layer(image, &base_dir, &house, jit.as_ref())?;
    let installed: u64 = parts.iter().map(|p| p.payload).sum();
    println!("| image {} | {} |", image.id(), image.tag());
    if let Some(docker) = docker_size(image.id()) {
        println!(
            "| `docker image inspect` Size | {} ({docker} bytes) |",
            human(docker)
        );
    }
    println!(
        "| size | {} ({size} bytes) in {} layers; payload (base files + wheel files{}) {}; ratio {:.3} (target <= 1.10) |",
        human(size),
        image.manifest.layers.len(),
        if jit.is_some() {
            " + the JIT toolchain wheels' files"
        } else {
            ""
        },
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
    println!();
    println!("| # | holds | layer tar | files in it | entries | payload | tar / payload |");
    println!("|---|---|---|---|---|---|---|");
    for (i, p) in parts.iter().enumerate() {
        println!(
            "| {i} | {} | {} | {} | {} | {} | {:.3} |",
            p.holds,
            human(p.tar),
            human(p.files),
            p.entries,
            human(p.payload),
            p.tar as f64 / p.payload.max(1) as f64
        );
    }
    Ok(
        if size as f64 <= 1.10 * installed as f64 && noop[noop.len() / 2] < 1.0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

/// One layer against what it installs.
struct LayerPayload {
    holds: String,
    /// The layer tar's size (what Docker stores and `docker image inspect` adds up).
    tar: u64,
    /// Bytes of the regular files in the tar (hard links once).
    files: u64,
    /// Tar entries (files, directories, links): each costs a 512-byte header and its
    /// data's padding to 512.
    entries: u64,
    /// What the layer is there to install: its wheels' files (as an installer writes
    /// them), the base's root filesystem files; for the layers commstack writes itself
    /// (the venv skeleton, its own files), their files.
    payload: u64,
}

/// Each layer of `image`, read from its tar in the store, beside its payload.
fn payload_by_layer(
    image: &commstack_image::Image,
    base_dir: &Path,
    house: &Wheelhouse,
    jit: Option<&commstack_image::JitToolchain>,
) -> Result<Vec<LayerPayload>> {
    let wheel_files = |path: &Path| -> Result<u64> {
        let wheel = commstack_wheel::Wheel::open(path)?;
        Ok(wheel
            .entries
            .iter()
            .filter(|e| !e.is_dir)
            .map(|e| e.size)
            .sum())
    };
    let mut parts = Vec::new();
    for (meta, layer) in image.manifest.layers.iter().zip(image.layers()) {
        let (files, entries) = tar_file_bytes(&layer.path)?;
        let payload = match &meta.kind {
            LayerKind::Base => tar_file_bytes(&base_dir.join("rootfs.tar"))?.0,
            LayerKind::Wheels { wheels } => {
                let mut sum = 0;
                for w in wheels {
                    sum += wheel_files(&house.wheel_path(w))?;
                }
                sum
            }
            LayerKind::CudaToolchain { wheels } => {
                let jit = jit.context(
                    "the image has a CUDA toolchain layer but the stack is not DeepEP V2",
                )?;
                let mut sum = 0;
                for w in wheels {
                    let locked = jit
                        .wheels
                        .iter()
                        .find(|j| &j.filename == w)
                        .with_context(|| format!("{w} is not among the lock's toolchain wheels"))?;
                    sum += wheel_files(&locked.path)?;
                }
                sum
            }
            LayerKind::Skeleton | LayerKind::Own => files,
        };
        parts.push(LayerPayload {
            holds: meta.holds.clone(),
            tar: meta.size,
            files,
            entries,
            payload,
        });
    }
    Ok(parts)
}

/// `docker image inspect`'s Size of `id`, if Docker has it.
fn docker_size(id: &str) -> Option<u64> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Size}}", id])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// Bytes of regular files in a tar (hard links counted once), and its entries.
fn tar_file_bytes(path: &Path) -> Result<(u64, u64)> {
    let file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut archive = tar::Archive::new(file);
    let (mut bytes, mut entries) = (0, 0);
    // Seeks over each entry's data: the headers of a 6 GB image are read, not its bytes.
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        entries += 1;
        if entry.header().entry_type().is_file() {
            bytes += entry.header().size()?;
        }
    }
    Ok((bytes, entries))
}
