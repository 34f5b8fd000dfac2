//! The image's steps of the graph: the base from the locked .debs (fetch cache), the
//! self-test and verify tools, the image step (`commstack_image`), `docker load`, what runs
//! in the loaded image with no network (`import torch`; verify's GPU levels), and on
//! request the OCI layout and the `docker build` context. Nothing here opens a network
//! connection.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_doctor::preflight::{Expectations, FABRIC_TRANSPORTS, IMAGE_EXPECTATIONS};
use commstack_image::{DataFile, EarlyLoad, Image, ImageInputs, Tool};
use commstack_store::Store;

use crate::ctx::Ctx;
use crate::settings::Settings;
use crate::util::human;

/// Where the image's own files are (see docs/image.md).
pub(crate) const IMAGE_BIN: &str = "/opt/commstack/bin";
pub(crate) const IMAGE_VENV: &str = "/opt/commstack/venv";

/// The base from the locked .debs in the download cache (mmdebstrap, in the store).
pub fn base_step(
    ctx: &Ctx,
    settings: &Settings,
    force: bool,
    say: &dyn Fn(&str),
) -> Result<commstack_base::BaseOutput> {
    let lock = &settings.lock;
    let base_lock = lock.base.clone().with_context(|| {
        format!(
            "{}: no [base] section although the stack has [image]: run `cargo xtask{} lock`",
            ctx.lock_path().display(),
            ctx.stack_flag()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut debs = Vec::new();
    let mut missing = Vec::new();
    for deb in &lock.debs {
        let file = deb.filename.rsplit('/').next().unwrap_or(&deb.filename);
        match cache.get(&deb.sha256, file)? {
            Some(path) => debs.push((deb, path)),
            None => missing.push(format!("{} {}", deb.name, deb.version)),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} of the base's {} .deb files are not in the cache ({}): run `cargo xtask{} fetch --only debs`",
            missing.len(),
            lock.debs.len(),
            missing.join(", "),
            ctx.stack_flag()
        );
    }
    let base = commstack_base::build_base(
        &store,
        &commstack_base::BaseInputs {
            base: &base_lock,
            debs,
        },
        force,
        |line| say(&format!("base: {line}")),
    )?;
    say(&format!(
        "base: {} ({} packages, {}){}",
        base.dir.display(),
        base.manifest.packages.len(),
        human(base.manifest.layer.size),
        if base.outcome.was_cached() {
            ", cached"
        } else {
            ""
        }
    ));
    Ok(base)
}

/// The self-test built against the NVSHMEM install at `nvshmem_prefix`, reproducibly and
/// stripped, in the store for the image; built again even when the store has it when
/// `force` (the graph's `--force`, and `build --check`, whose store links to the first
/// build's steps). Its RUNPATH finds NVSHMEM where the image has it: the drop-in wheel in
/// the venv's site-packages.
pub fn selftest_tool(
    ctx: &Ctx,
    settings: &Settings,
    toolchain: &crate::options::ToolchainChoice,
    nvshmem_prefix: PathBuf,
    force: bool,
    say: &dyn Fn(&str),
) -> Result<Tool> {
    let tc = crate::flow::toolchain::resolve(ctx, toolchain, false, say)?;
    let built = commstack_tools::selftest_step(
        &Store::open(ctx.store_dir())?,
        (!ctx.quiet).then_some(say),
        &commstack_tools::SelftestBuild {
            root: &commstack_tools::workspace_root(),
            nvcc: &tc.nvcc,
            nvshmem: &commstack_tools::NvshmemForKernels {
                describe: format!("the stack's NVSHMEM at {}", nvshmem_prefix.display()),
                prefix: nvshmem_prefix,
            },
            archs: &settings.cuda_archs,
            runpath: vec![image_nvshmem_runpath(settings.stack.target.python)],
            force,
        },
    )?;
    Ok(image_tool(&built))
}

/// The RUNPATH entry from the image's tools to its NVSHMEM, the drop-in wheel's
/// `nvidia/nvshmem/lib` in the venv (`$ORIGIN/../venv/lib/python3.11/...`), so that the
/// self-test needs no LD_LIBRARY_PATH there.
pub fn image_nvshmem_runpath(python: (u64, u64)) -> String {
    let lib = format!(
        "{IMAGE_VENV}/lib/python{}.{}/site-packages/nvidia/nvshmem/lib",
        python.0, python.1
    );
    format!(
        "$ORIGIN/{}",
        relative_to(Path::new(IMAGE_BIN), Path::new(&lib))
    )
}

/// `to` relative to the directory `from`, both absolute and without `..`.
fn relative_to(from: &Path, to: &Path) -> String {
    let (a, b): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = vec!["..".to_string(); a.len() - common];
    parts.extend(
        b[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// The verify tool, built reproducibly and stripped into the store for the image; built
/// again even when the store has it when `force` (as [`selftest_tool`]).
pub fn verify_tool(ctx: &Ctx, force: bool, say: &dyn Fn(&str)) -> Result<Tool> {
    let store = Store::open(ctx.store_dir())?;
    let root = commstack_tools::workspace_root();
    Ok(image_tool(&commstack_tools::build_verify_tool(
        &store,
        (!ctx.quiet).then_some(say),
        &root,
        force,
    )?))
}

/// The doctor (the image's preflight), built reproducibly and stripped into the store for
/// the image; built again even when the store has it when `force` (as [`selftest_tool`]).
pub fn doctor_tool(ctx: &Ctx, force: bool, say: &dyn Fn(&str)) -> Result<Tool> {
    let store = Store::open(ctx.store_dir())?;
    let root = commstack_tools::workspace_root();
    Ok(image_tool(&commstack_tools::build_doctor_tool(
        &store,
        (!ctx.quiet).then_some(say),
        &root,
        force,
    )?))
}

/// What the image needs of a node, from the lock and the build settings: the lock's CUDA,
/// the archs built (`--cuda-archs` included), NVSHMEM's fabric transports that are on
/// (`--no-ibgda` included) and DeepEP's API. The image carries it as preflight.json.
pub fn preflight_expectations(settings: &Settings) -> Result<Expectations> {
    let on: Vec<&str> = FABRIC_TRANSPORTS
        .iter()
        .copied()
        .filter(|t| settings.nvshmem.switches.is_on(t))
        .collect();
    Expectations::new(
        &settings.lock.resolved.cuda,
        &settings.cuda_archs,
        &on,
        settings.lock.resolved.deepep_api,
    )
    .with_context(|| {
        format!(
            "the lock's CUDA version {:?} is not major.minor[.patch]: run `cargo xtask lock --force`",
            settings.lock.resolved.cuda
        )
    })
}

/// preflight.json as the image step writes it.
fn preflight_file(settings: &Settings) -> Result<DataFile> {
    Ok(DataFile {
        image_path: IMAGE_EXPECTATIONS.to_string(),
        bytes: preflight_expectations(settings)?.to_json().into_bytes(),
        source: "the lock's CUDA and DeepEP API, the build's cuda-archs and NVSHMEM transports"
            .to_string(),
    })
}

/// One of our binaries as the image step takes it, at [`IMAGE_BIN`].
fn image_tool(built: &commstack_tools::OwnTool) -> Tool {
    tool_at(
        &built.name,
        env!("CARGO_PKG_VERSION"),
        built.path.clone(),
        built.made_by(),
    )
}

/// The image step (its layers reused when their inputs are unchanged), printed.
pub fn image_step(
    ctx: &Ctx,
    settings: &Settings,
    say: &dyn Fn(&str),
    base_dir: &Path,
    wheelhouse_dir: &Path,
    tools: Vec<Tool>,
    force: bool,
) -> Result<Image> {
    let image_settings = settings.stack.image.clone().with_context(|| {
        format!(
            "{}: no [image] section, so this stack is not made into an image (the default \
             stack.toml has one: `cargo xtask build image` with no --stack). Add an [image] \
             section (docs/image.md) and run `cargo xtask lock`",
            settings.stack.path().display()
        )
    })?;
    let store = Store::open(ctx.store_dir())?;
    let (source_url, revision) = commstack_tools::git_identity();
    let image = commstack_image::assemble_image_reporting(
        &store,
        &ImageInputs {
            lock: settings.lock.clone(),
            lock_path: ctx.lock_path(),
            lock_sha256: settings.lock_sha256.clone(),
            base_dir: base_dir.to_path_buf(),
            wheelhouse_dir: wheelhouse_dir.to_path_buf(),
            tools,
            data: vec![preflight_file(settings)?],
            name: image_settings.name.clone(),
            user: image_settings.user.clone(),
            source_url,
            revision,
            large_wheel_bytes: commstack_image::LARGE_WHEEL_BYTES,
            jit: jit_toolchain(ctx, settings)?,
        },
        force,
        say,
    )?;
    print_image(&image, say);
    Ok(image)
}

/// The image in Docker under its tag (loaded unless Docker has it), finishing the load
/// `early` started while the image was pulled, where there is one.
pub fn load_step(image: &Image, early: Option<EarlyLoad>, say: &dyn Fn(&str)) -> Result<String> {
    let t = Instant::now();
    let loaded = commstack_image::docker_load_with(image, early)?;
    if let Some(why) = &loaded.fallback {
        say(&format!(
            "the load begun during the pull failed ({why}); loaded again from the store"
        ));
    }
    let early = match loaded.early {
        0 => String::new(),
        n => format!(", {n} of them during the pull"),
    };
    let sent = match (loaded.sent, loaded.kept) {
        (0, 0) => "Docker had it".to_string(),
        (sent, 0) => format!("{sent} layers sent{early}"),
        (sent, kept) => format!("{sent} layers sent{early}, {kept} Docker had"),
    };
    say(&format!(
        "loaded: {} as {} ({sent}; {:.1} s)",
        loaded.id,
        image.tag(),
        t.elapsed().as_secs_f64()
    ));
    Ok(loaded.id)
}

/// The image's layer tars, as the binary cache lands them, into a `docker load` started
/// then ([`EarlyLoad`]): Docker unpacks them while the rest of the image downloads, and
/// the load step finishes that load instead of starting one after the pull. Armed only
/// for a run that pulls the image step and then loads it.
#[derive(Default)]
pub struct EarlyLoadFeed {
    armed: std::sync::atomic::AtomicBool,
    load: std::sync::Mutex<Option<EarlyLoad>>,
}

impl EarlyLoadFeed {
    pub fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The layer tar of `diff_id` is whole at `path`: into the load (started by the first
    /// one). A load that cannot start or take it is dropped, said, and the load step loads
    /// the usual way.
    pub fn landed(&self, diff_id: &str, path: &Path, say: &dyn Fn(&str)) {
        if !self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let sent = match &*load {
            Some(early) => early.layer(diff_id, path),
            None => EarlyLoad::start().and_then(|early| {
                say("docker load started: the layers go into it as they arrive");
                early.layer(diff_id, path)?;
                *load = Some(early);
                Ok(())
            }),
        };
        if let Err(err) = sent {
            say(&format!(
                "the early docker load stopped ({err:#}): the load step loads the image after the pull"
            ));
            *load = None;
            self.armed.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// The load started, for the load step to finish.
    pub fn take(&self) -> Option<EarlyLoad> {
        self.load.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Whether Docker has the image `id` under `tag` (`docker image inspect`).
pub fn docker_has(id: &str, tag: &str) -> bool {
    Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{json .RepoTags}}",
            id,
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let text = String::from_utf8_lossy(&o.stdout);
            text.starts_with(id) && text.contains(&format!("\"{tag}\""))
        })
}

/// DeepEP V2: the toolchain its JIT runs at run time, the lock's CUDA toolchain wheels (not
/// cmake, ninja or the cuda-toolkit meta package) from the download cache. None for V1.
pub fn jit_toolchain(
    ctx: &Ctx,
    settings: &Settings,
) -> Result<Option<commstack_image::JitToolchain>> {
    if settings.stack.deepep.api != commstack_stack::manifest::DeepEpApi::V2 {
        return Ok(None);
    }
    let cache = commstack_fetch::Cache::new(ctx.cache_dir());
    let mut wheels = Vec::new();
    for w in settings
        .lock
        .toolchain
        .iter()
        .filter(|w| commstack_image::jit::is_jit_wheel(&w.name))
    {
        let path = cache.get(&w.sha256, &w.filename)?.with_context(|| {
            format!(
                "the toolchain wheel {} (DeepEP V2's JIT needs it in the image) is not in the download cache: run `cargo xtask{} fetch --only toolchain`",
                w.filename,
                ctx.stack_flag()
            )
        })?;
        wheels.push(commstack_deepep::LockedWheel {
            name: w.name.clone(),
            version: w.version.clone(),
            filename: w.filename.clone(),
            sha256: w.sha256.clone(),
            path,
        });
    }
    Ok(Some(commstack_image::JitToolchain { wheels }))
}

/// `--oci DIR` and `--context DIR`: the image as an OCI layout, and docker/Dockerfile's
/// build context.
pub fn export(
    store: &commstack_store::Store,
    image: &Image,
    oci: Option<&Path>,
    context: Option<&Path>,
) -> Result<()> {
    if let Some(dir) = oci {
        let oci = commstack_image::export_oci(image, dir, Some(store))?;
        crate::out!(
            "OCI layout: {} (manifest {})",
            dir.display(),
            oci.manifest_digest
        );
    }
    if let Some(dir) = context {
        let context = commstack_image::write_docker_context(image, dir)?;
        crate::out!(
            "docker build context: {} (base {}): DOCKER_BUILDKIT=0 docker build -f docker/Dockerfile $(cat {}/build-args) -t NAME {}",
            dir.display(),
            context.base_tag,
            dir.display(),
            dir.display()
        );
    }
    Ok(())
}

/// One of our stripped binaries in the store, as the image step takes it.
pub fn tool_at(name: &str, version: &str, host_path: PathBuf, source: String) -> Tool {
    Tool {
        name: name.to_string(),
        version: version.to_string(),
        image_path: format!("{IMAGE_BIN}/{name}"),
        host_path,
        source,
    }
}

fn print_image(image: &Image, say: &dyn Fn(&str)) {
    let m = &image.manifest;
    let total: u64 = m.layers.iter().map(|l| l.size).sum();
    say(&format!(
        "image: {}{}",
        image.id(),
        if image.cached { " (cached)" } else { "" }
    ));
    say(&format!("tag:   {}", image.tag()));
    say(&format!(
        "size:  {} in {} layers",
        human(total),
        m.layers.len()
    ));
    for (i, l) in m.layers.iter().enumerate() {
        say(&format!("  {i:>2} {:>10}  {}", human(l.size), l.holds));
    }
    say(&format!(
        "files: {} (image.json, config.json, sbom.spdx.json, provenance.json)",
        image.dir.display()
    ));
}
