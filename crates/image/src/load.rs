//! Shipping an image step: [`docker_load`] streams the docker-archive into `docker load`
//! (no archive file is written), checks that Docker's ID is the config digest, and only
//! then tags it; an image Docker already has is only tagged (the no-op). [`export_oci`]
//! writes the OCI layout beside the target and renames it into place when complete.

use std::io::BufWriter;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::assemble::Image;
use crate::docker_archive::ImageSpec;
use crate::docker_archive::write_docker_archive_to;
use crate::layer::Layer;
use crate::oci_layout::{OciImage, write_oci_layout};

pub(crate) fn docker(args: &[&str]) -> Result<std::process::Output> {
    Command::new("docker").args(args).output().with_context(|| {
        format!(
            "cannot run `docker {}`: is Docker installed?",
            args.join(" ")
        )
    })
}

/// Loads `image` into Docker and tags it; returns the image ID.
pub fn docker_load(image: &Image) -> Result<String> {
    let id = image.id();
    let have = docker(&["image", "inspect", "--format", "{{.Id}}", id])?;
    if !(have.status.success() && String::from_utf8_lossy(&have.stdout).trim() == id) {
        load(&image.manifest.spec, &image.layers(), id, &image.dir)?;
    }
    let tagged = docker(&["tag", id, image.tag()])?;
    if !tagged.status.success() {
        bail!(
            "docker tag {id} {}: {}",
            image.tag(),
            String::from_utf8_lossy(&tagged.stderr).trim()
        );
    }
    Ok(id.to_string())
}

/// Streams the archive of `spec` and `layers` (with no tag: the tag comes after the check)
/// into `docker load`; `id` is the ID it must get, `what` names the step in errors.
pub(crate) fn load(spec: &ImageSpec, layers: &[Layer], id: &str, what: &Path) -> Result<()> {
    let mut spec = spec.clone();
    spec.tag.clear();
    let mut child = Command::new("docker")
        .args(["load"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run `docker load`: is Docker installed and its daemon running?")?;
    let stdin = child.stdin.take().expect("piped");
    let written = write_docker_archive_to(&spec, layers, BufWriter::with_capacity(1 << 20, stdin));
    let out = child.wait_with_output().context("docker load")?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "docker load of {} failed: {}{}",
            what.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            written
                .err()
                .map(|e| format!(" (writing: {e:#})"))
                .unwrap_or_default()
        );
    }
    let written =
        written.with_context(|| format!("streaming {} into docker load", what.display()))?;
    if written.image_id != id {
        bail!(
            "{}: the config's digest is {}, image.json says {id}: the image step is damaged; remove it and run `cargo xtask build image` again",
            what.display(),
            written.image_id
        );
    }
    let loaded = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("Loaded image ID: "))
        .map(str::to_string);
    if loaded.as_deref() != Some(id) {
        // Untagged, so nothing names it: remove what was loaded.
        if let Some(other) = &loaded {
            let _ = docker(&["rmi", other]);
        }
        bail!("docker load reported {said:?}, expected the image ID {id}");
    }
    Ok(())
}

/// Writes `image` as an OCI layout at `dir` (which must not exist): written into a
/// sibling directory, renamed when complete.
pub fn export_oci(image: &Image, dir: &Path) -> Result<OciImage> {
    if dir.exists() {
        bail!(
            "{} exists: remove it or give another --oci directory",
            dir.display()
        );
    }
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no file name", dir.display()))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let temp = tempfile::Builder::new()
        .prefix(&format!(".{}.", name.to_string_lossy()))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
    let layout = temp.path().join("oci");
    let oci = write_oci_layout(&image.manifest.spec, &image.layers(), &layout)?;
    if oci.config_digest != image.id() {
        bail!(
            "the OCI config digest {} is not the image ID {}: the image step {} is damaged",
            oci.config_digest,
            image.id(),
            image.dir.display()
        );
    }
    std::fs::rename(&layout, dir)
        .with_context(|| format!("cannot move the OCI layout into {}", dir.display()))?;
    Ok(oci)
}
