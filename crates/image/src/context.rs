//! The build context of `docker/Dockerfile`: the same files as the image step, for those
//! who prefer `docker build`. The base is loaded into Docker as an image of its own (the
//! Dockerfile starts FROM it: there is no registry to pull from), every layer above it is
//! unpacked in order into `rootfs/` (a later layer's file replaces an earlier one's), the
//! user's home directory's contents go to `home/` (the Dockerfile copies them with
//! `--chown`), and `build-args`
//! holds the `--build-arg` flags for the labels. Written beside the target and renamed
//! into place when complete.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_archive::{Options, unpack};

use crate::assemble::Image;
use crate::docker_archive::{ImageSpec, image_config};
use crate::load::{docker, load};

/// What the context holds besides its files.
#[derive(Debug)]
pub struct DockerContext {
    pub dir: PathBuf,
    /// The base image's tag (`<name>-base:<12 hex of its ID>`), the Dockerfile's BASE.
    pub base_tag: String,
    pub base_id: String,
}

/// docker/Dockerfile does not carry DeepEP V2's JIT environment yet: such an image is
/// refused rather than rebuilt wrong.
fn refuse_v2(image: &Image) -> Result<()> {
    if image
        .manifest
        .layers
        .iter()
        .any(|l| matches!(l.kind, crate::plan::LayerKind::CudaToolchain { .. }))
    {
        bail!(
            "{}: a DeepEP V2 image; docker/Dockerfile does not carry its JIT's environment yet (CUDA_HOME, EP_JIT_CACHE_DIR and the user's /{}). Use the image `cargo xtask build image` loads, or its OCI layout (`--oci DIR`)",
            image.dir.display(),
            crate::jit::JIT_CACHE_DIR
        );
    }
    Ok(())
}

/// Loads the base as its own image and writes the context into `dir` (must not exist).
pub fn write_docker_context(image: &Image, dir: &Path) -> Result<DockerContext> {
    if dir.symlink_metadata().is_ok() {
        bail!(
            "{} exists: remove it or give another --context directory",
            dir.display()
        );
    }
    refuse_v2(image)?;
    let layers = image.layers();
    let (base_layer, above) = layers
        .split_first()
        .with_context(|| format!("{}: an image with no layers", image.dir.display()))?;
    let spec = &image.manifest.spec;
    let base_spec = ImageSpec {
        tag: String::new(),
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
        cmd: vec!["/bin/bash".to_string()],
        user: None,
        working_dir: None,
        labels: Default::default(),
        epoch: spec.epoch,
        layer_comments: spec.layer_comments.iter().take(1).cloned().collect(),
    };
    let base_layers = std::slice::from_ref(base_layer);
    let base_id = format!(
        "sha256:{}",
        commstack_digest::sha256_hex(image_config(&base_spec, base_layers)?.as_bytes())
    );
    let have = docker(&["image", "inspect", "--format", "{{.Id}}", &base_id])?;
    if !(have.status.success() && String::from_utf8_lossy(&have.stdout).trim() == base_id) {
        load(&base_spec, base_layers, &base_id, &image.dir)?;
    }
    let name = spec
        .tag
        .rsplit_once(':')
        .map_or(spec.tag.as_str(), |(n, _)| n);
    let base_tag = format!("{name}-base:{}", &base_id["sha256:".len()..][..12]);

    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent)?;
    let temp = tempfile::Builder::new()
        .prefix(".context.")
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
    let rootfs = temp.path().join("rootfs");
    fs::create_dir(&rootfs)?;
    let keep = Options {
        keep_absolute_symlinks: true,
        ..Options::default()
    };
    for (i, layer) in above.iter().enumerate() {
        let unpacked = temp.path().join(format!("layer-{i}"));
        unpack(&layer.path, &unpacked, &keep)
            .with_context(|| format!("unpacking the layer {}", layer.path.display()))?;
        overlay(&unpacked, &rootfs)?;
        fs::remove_dir_all(&unpacked)?;
    }
    // The user's home is the user's: the Dockerfile copies it with --chown.
    let home_dir = spec.working_dir.clone().with_context(|| {
        format!(
            "{}: the image has no working directory (the user's home)",
            image.dir.display()
        )
    })?;
    let home = temp.path().join("home");
    let in_rootfs = rootfs.join(home_dir.trim_start_matches('/'));
    if in_rootfs.is_dir() {
        fs::rename(&in_rootfs, &home)?;
    } else {
        fs::create_dir(&home)?;
    }
    let mut args = vec![
        format!("--build-arg BASE={base_tag}"),
        format!("--build-arg HOME_DIR={home_dir}"),
    ];
    let labels = &spec.labels;
    for (arg, label) in [
        ("LOCK_SHA256", "dev.commstack.lock.sha256"),
        ("SOURCE", "org.opencontainers.image.source"),
        ("REVISION", "org.opencontainers.image.revision"),
        ("CREATED", "org.opencontainers.image.created"),
        ("TITLE", "org.opencontainers.image.title"),
        ("TORCH", "dev.commstack.torch"),
        ("NCCL", "dev.commstack.nccl"),
        ("NVSHMEM", "dev.commstack.nvshmem"),
        ("DEEPEP", "dev.commstack.deepep"),
        ("CUDA", "dev.commstack.cuda"),
    ] {
        let value = labels.get(label).map(String::as_str).unwrap_or("");
        if value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '"')
        {
            bail!("label {label} = {value:?} cannot travel as a --build-arg word");
        }
        args.push(format!("--build-arg {arg}={value}"));
    }
    fs::write(temp.path().join("build-args"), args.join(" ") + "\n")?;
    fs::write(temp.path().join("base.tag"), format!("{base_tag}\n"))?;
    fs::rename(temp.path(), dir)
        .with_context(|| format!("cannot move the context into {}", dir.display()))?;
    // Renamed away: nothing left for the guard to remove.
    let _ = temp.keep();
    // Tagged last, so a failure above leaves no name behind.
    crate::load::docker_ok("docker tag", &["tag", &base_id, &base_tag])?;
    Ok(DockerContext {
        dir: dir.to_path_buf(),
        base_tag,
        base_id,
    })
}

/// Moves the tree `from` over `onto`: directories merge, anything else replaces what is
/// there (as a later image layer does).
fn overlay(from: &Path, onto: &Path) -> Result<()> {
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let src = entry.path();
        let dst = onto.join(entry.file_name());
        let is_dir = entry.file_type()?.is_dir();
        match dst.symlink_metadata() {
            Ok(m) if is_dir && m.is_dir() => {
                overlay(&src, &dst)?;
                continue;
            }
            Ok(m) if m.is_dir() => fs::remove_dir_all(&dst)?,
            Ok(_) => fs::remove_file(&dst)?,
            Err(_) => {}
        }
        fs::rename(&src, &dst)
            .with_context(|| format!("cannot move {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}
