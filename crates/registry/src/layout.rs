//! An OCI image layout read for pushing (`oci-layout`, `index.json`, `blobs/sha256/`):
//! what `cargo xtask build image --oci DIR` writes. The manifest is pushed as the bytes
//! the layout holds (its digest is the image's name in the registry), and every blob is
//! checked against its digest and size before anything is uploaded.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use sha2::Digest as _;

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// One blob the manifest names: config or layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    pub path: PathBuf,
    /// "config", "layer 3 of 18": for messages.
    pub role: String,
}

/// An opened layout: the manifest's bytes and digest, and its blobs.
#[derive(Clone, Debug)]
pub struct Layout {
    pub dir: PathBuf,
    pub manifest: Vec<u8>,
    pub manifest_digest: String,
    pub media_type: String,
    /// Config first, then the layers bottom first.
    pub blobs: Vec<Blob>,
    /// index.json's `org.opencontainers.image.ref.name` of the manifest, if any.
    pub ref_name: Option<String>,
    /// The image config's labels.
    pub labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize, Default)]
struct ImageConfig {
    #[serde(default)]
    config: Option<ConfigSection>,
}

#[derive(Deserialize, Default)]
struct ConfigSection {
    #[serde(rename = "Labels", default)]
    labels: Option<BTreeMap<String, String>>,
}

impl Layout {
    /// Reads `dir`'s index and manifest; the manifest must be the one image manifest of
    /// the index and hash to the digest the index gives it.
    pub fn open(dir: &Path) -> Result<Layout> {
        let marker = dir.join("oci-layout");
        let text = std::fs::read_to_string(&marker).with_context(|| {
            format!(
                "{} is not an OCI image layout (no readable oci-layout file): give the directory `cargo xtask build image --oci DIR` wrote",
                dir.display()
            )
        })?;
        let version: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", marker.display()))?;
        if version["imageLayoutVersion"] != "1.0.0" {
            bail!(
                "{}: imageLayoutVersion {} (expected \"1.0.0\")",
                marker.display(),
                version["imageLayoutVersion"]
            );
        }
        let index_file = dir.join("index.json");
        let index: Index = serde_json::from_slice(
            &std::fs::read(&index_file)
                .with_context(|| format!("cannot read {}", index_file.display()))?,
        )
        .with_context(|| format!("{} is not an OCI image index", index_file.display()))?;
        let [entry] = index.manifests.as_slice() else {
            bail!(
                "{} lists {} manifests: push takes a layout of one image manifest",
                index_file.display(),
                index.manifests.len()
            );
        };
        if entry.media_type != MANIFEST_MEDIA_TYPE {
            bail!(
                "{}: the manifest's media type is {:?}, not {MANIFEST_MEDIA_TYPE}",
                index_file.display(),
                entry.media_type
            );
        }
        let manifest_path = blob_path(dir, &entry.digest)?;
        let manifest = std::fs::read(&manifest_path).with_context(|| {
            format!(
                "cannot read the manifest {} of {}",
                entry.digest,
                dir.display()
            )
        })?;
        let actual = format!("sha256:{}", commstack_digest::sha256_hex(&manifest));
        if actual != entry.digest || manifest.len() as u64 != entry.size {
            bail!(
                "the manifest blob {} is damaged: index.json names {} ({} bytes), the file hashes to {actual} ({} bytes); write the layout again (`cargo xtask build image --oci DIR`)",
                manifest_path.display(),
                entry.digest,
                entry.size,
                manifest.len()
            );
        }
        let parsed: Manifest = serde_json::from_slice(&manifest)
            .with_context(|| format!("{} is not an OCI image manifest", manifest_path.display()))?;
        if parsed
            .media_type
            .as_deref()
            .is_some_and(|m| m != MANIFEST_MEDIA_TYPE)
        {
            bail!(
                "{}: mediaType {:?}, not {MANIFEST_MEDIA_TYPE}",
                manifest_path.display(),
                parsed.media_type
            );
        }
        let layers = parsed.layers.len();
        let mut blobs = vec![blob(dir, &parsed.config, "config".to_string())?];
        for (i, layer) in parsed.layers.iter().enumerate() {
            blobs.push(blob(dir, layer, format!("layer {} of {layers}", i + 1))?);
        }
        let config_bytes = std::fs::read(&blobs[0].path).with_context(|| {
            format!(
                "cannot read the config {} of {}",
                blobs[0].digest,
                dir.display()
            )
        })?;
        let config: ImageConfig = serde_json::from_slice(&config_bytes).unwrap_or_default();
        Ok(Layout {
            dir: dir.to_path_buf(),
            manifest,
            manifest_digest: entry.digest.clone(),
            media_type: entry.media_type.clone(),
            blobs,
            ref_name: entry
                .annotations
                .get("org.opencontainers.image.ref.name")
                .cloned(),
            labels: config.config.and_then(|c| c.labels).unwrap_or_default(),
        })
    }

    /// The total size of the blobs.
    pub fn size(&self) -> u64 {
        self.blobs.iter().map(|b| b.size).sum()
    }
}

fn blob(dir: &Path, d: &Descriptor, role: String) -> Result<Blob> {
    Ok(Blob {
        path: blob_path(dir, &d.digest)?,
        digest: d.digest.clone(),
        size: d.size,
        media_type: d.media_type.clone(),
        role,
    })
}

/// `blobs/sha256/<hex>` for a `sha256:<hex>` digest; anything else (another algorithm, a
/// path in disguise) is refused.
fn blob_path(dir: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .with_context(|| {
            format!(
                "{}: {digest:?} is not a sha256 digest (sha256:<64 lower-case hex>)",
                dir.display()
            )
        })?;
    Ok(dir.join("blobs/sha256").join(hex))
}

/// Hashes `blob`'s file; an error names the blob and says what to do when its bytes or
/// size are not those the manifest names (the layout was damaged or edited).
pub fn verify_blob(blob: &Blob, on_bytes: &dyn Fn(u64)) -> Result<()> {
    let mut file = std::fs::File::open(&blob.path).with_context(|| {
        format!(
            "the {} blob {} is missing from the layout ({})",
            blob.role,
            blob.digest,
            blob.path.display()
        )
    })?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", blob.path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
        on_bytes(n as u64);
    }
    let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
    if actual != blob.digest || size != blob.size {
        bail!(
            "the {} blob {} of the layout is damaged: the file {} hashes to {actual} ({size} bytes), not to its name ({} bytes); nothing was uploaded. Write the layout again (`cargo xtask build image --oci DIR`)",
            blob.role,
            blob.digest,
            blob.path.display(),
            blob.size
        );
    }
    Ok(())
}
