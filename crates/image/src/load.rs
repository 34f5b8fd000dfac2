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
use crate::docker_archive::write_docker_archive_above;
use crate::layer::Layer;
use crate::oci_layout::{OciImage, write_oci_layout_with};
use commstack_store::Store;

pub(crate) fn docker(args: &[&str]) -> Result<std::process::Output> {
    Command::new("docker").args(args).output().with_context(|| {
        format!(
            "cannot run `docker {}`: is Docker installed?",
            args.join(" ")
        )
    })
}

/// What a load sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// `sha256:<hex>`: the image ID.
    pub id: String,
    /// Layers whose tars went into `docker load`.
    pub sent: usize,
    /// Bottom layers Docker had already (another image starts with them): not sent.
    pub kept: usize,
}

/// Loads `image` into Docker and tags it; returns the image ID and what was sent (nothing
/// when Docker has the image).
pub fn docker_load(image: &Image) -> Result<Loaded> {
    let id = image.id();
    let have = docker(&["image", "inspect", "--format", "{{.Id}}", id])?;
    let mut loaded = Loaded {
        id: id.to_string(),
        ..Loaded::default()
    };
    if !(have.status.success() && String::from_utf8_lossy(&have.stdout).trim() == id) {
        (loaded.sent, loaded.kept) = load(&image.manifest.spec, &image.layers(), id, &image.dir)?;
    }
    let tagged = docker(&["tag", id, image.tag()])?;
    if !tagged.status.success() {
        bail!(
            "docker tag {id} {}: {}",
            image.tag(),
            String::from_utf8_lossy(&tagged.stderr).trim()
        );
    }
    Ok(loaded)
}

/// How many of `layers`, from the bottom, Docker has as a chain already: the longest
/// prefix of their diff_ids that some image it holds starts with (a layer's identity in
/// Docker is its chain, the diff_ids up to it). 0 when Docker cannot say.
fn chain_docker_has(layers: &[Layer]) -> usize {
    let Ok(ids) = docker(&["image", "ls", "--all", "--quiet", "--no-trunc"]) else {
        return 0;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&ids.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return 0;
    }
    let mut args = vec!["image", "inspect", "--format", "{{json .RootFS.Layers}}"];
    args.extend(ids.iter().map(String::as_str));
    let Ok(out) = docker(&args) else { return 0 };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Vec<String>>(line).ok())
        .map(|held| {
            held.iter()
                .zip(layers)
                .take_while(|(h, l)| **h == l.diff_id)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// Streams the archive of `spec` and `layers` (with no tag: the tag comes after the check)
/// into `docker load`, leaving out the layers Docker has already; `id` is the ID it must
/// get, `what` names the step in errors. Returns the layers sent and those kept.
pub(crate) fn load(
    spec: &ImageSpec,
    layers: &[Layer],
    id: &str,
    what: &Path,
) -> Result<(usize, usize)> {
    let kept = chain_docker_has(layers);
    match load_above(spec, layers, kept, id, what) {
        Ok(()) => Ok((layers.len() - kept, kept)),
        // The image that held them was removed since we looked: send everything.
        Err(err) if kept > 0 => {
            eprintln!(
                "docker load without the {kept} layer(s) Docker had failed ({err:#}); loading every layer"
            );
            load_above(spec, layers, 0, id, what)?;
            Ok((layers.len(), 0))
        }
        Err(err) => Err(err),
    }
}

fn load_above(
    spec: &ImageSpec,
    layers: &[Layer],
    kept: usize,
    id: &str,
    what: &Path,
) -> Result<()> {
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
    let written = write_docker_archive_above(
        &spec,
        layers,
        kept,
        BufWriter::with_capacity(1 << 20, stdin),
    );
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
/// sibling directory, renamed when complete. With a `store`, the compressed layers are kept
/// there as steps of their own and reused (see [`write_oci_layout_with`]).
pub fn export_oci(image: &Image, dir: &Path, store: Option<&Store>) -> Result<OciImage> {
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
    let oci = write_oci_layout_with(&image.manifest.spec, &image.layers(), &layout, store)?;
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
