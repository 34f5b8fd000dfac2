//! OCI artifacts (image-spec 1.1: an image manifest with an `artifactType`, a config of
//! the artifact's own media type, layers of any media type, an optional `subject`),
//! written as an OCI image layout so that [`crate::push_layout`] pushes them like images.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use crate::layout::MANIFEST_MEDIA_TYPE;

/// The empty config artifacts without one of their own use (image-spec 1.1).
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// What an artifact holds.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub artifact_type: String,
    pub config_media_type: String,
    pub config: Vec<u8>,
    /// Files, each a layer: its media type and path.
    pub layers: Vec<(String, PathBuf)>,
    pub annotations: BTreeMap<String, String>,
    /// The manifest this one refers to (a signature's image): digest and size.
    pub subject: Option<(String, u64)>,
}

/// Writes `artifact` as an OCI layout in `dir` (created; must not exist). Layer files are
/// hard-linked into the layout where they can be (copied otherwise). Returns the manifest
/// digest.
pub fn write_artifact_layout(artifact: &Artifact, dir: &Path) -> Result<String> {
    write_layout(artifact, &[], dir)
}

/// [`write_artifact_layout`] with the annotations of each layer given (in the order of
/// `artifact.layers`; a layer past the end of `layer_annotations` gets its file name as
/// its title, as there): a cosign signature's layer carries exactly its signature.
pub fn write_artifact_layout_annotated(
    artifact: &Artifact,
    layer_annotations: &[BTreeMap<String, String>],
    dir: &Path,
) -> Result<String> {
    write_layout(artifact, layer_annotations, dir)
}

fn write_layout(
    artifact: &Artifact,
    layer_annotations: &[BTreeMap<String, String>],
    dir: &Path,
) -> Result<String> {
    if dir.exists() {
        anyhow::bail!("{} exists", dir.display());
    }
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)
        .with_context(|| format!("cannot create {}", blobs.display()))?;
    let mut layers = Vec::new();
    for (i, (media_type, path)) in artifact.layers.iter().enumerate() {
        let hex = commstack_digest::sha256_file(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let size = std::fs::metadata(path)?.len();
        let blob = blobs.join(&hex);
        if !blob.exists() && std::fs::hard_link(path, &blob).is_err() {
            std::fs::copy(path, &blob).with_context(|| {
                format!("cannot copy {} into {}", path.display(), dir.display())
            })?;
        }
        let title = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let mut layer =
            json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": size});
        match (layer_annotations.get(i), title) {
            (Some(given), _) if given.is_empty() => {}
            (Some(given), _) => layer["annotations"] = json!(given),
            (None, Some(title)) => {
                layer["annotations"] = json!({"org.opencontainers.image.title": title});
            }
            (None, None) => {}
        }
        layers.push(layer);
    }
    let config_digest = put(&blobs, &artifact.config)?;
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": artifact.artifact_type,
        "config": {
            "mediaType": artifact.config_media_type,
            "digest": config_digest,
            "size": artifact.config.len(),
        },
        "layers": layers,
    });
    if !artifact.annotations.is_empty() {
        manifest["annotations"] = json!(artifact.annotations);
    }
    if let Some((digest, size)) = &artifact.subject {
        manifest["subject"] =
            json!({"mediaType": MANIFEST_MEDIA_TYPE, "digest": digest, "size": size});
    }
    let manifest = commstack_digest::canonical_json(&manifest);
    let manifest_digest = put(&blobs, manifest.as_bytes())?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": artifact.artifact_type,
            "digest": manifest_digest,
            "size": manifest.len(),
        }],
    });
    std::fs::write(
        dir.join("index.json"),
        commstack_digest::canonical_json(&index),
    )?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(manifest_digest)
}

/// Stores `bytes` as a blob; returns `sha256:<hex>`.
fn put(blobs: &Path, bytes: &[u8]) -> Result<String> {
    let hex = commstack_digest::sha256_hex(bytes);
    std::fs::write(blobs.join(&hex), bytes)?;
    Ok(format!("sha256:{hex}"))
}
