//! The OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`), for registries and
//! for tools that read OCI (skopeo, umoci; `docker load` only from Docker 25). Layers are
//! gzip-compressed here, so the compressor is part of the image's identity: flate2 with
//! its default backend (both pinned by Cargo.lock) at [`GZIP_LEVEL`], no file name and
//! mtime 0 in the gzip header. The config blob is the docker-archive's byte for byte.

use std::fs::{self, File};
use std::io::BufReader;
use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, Result};
use flate2::Compression;
use flate2::write::GzEncoder;
use oci_spec::image::{
    Descriptor, Digest, ImageIndexBuilder, ImageManifestBuilder, MediaType, SCHEMA_VERSION,
};
use sha2::Digest as _;

use crate::docker_archive::{ImageSpec, image_config};
use crate::layer::Layer;
use commstack_digest::HashingWriter;
use commstack_store::{StepKey, Store};

/// The gzip level of every layer blob: part of the recipe, since another level gives
/// other bytes and so other digests.
pub const GZIP_LEVEL: u32 = 6;

/// A written OCI layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciImage {
    /// `sha256:<hex>` of the manifest: what a registry serves the image by.
    pub manifest_digest: String,
    /// `sha256:<hex>` of the config: the image ID, as in the docker-archive.
    pub config_digest: String,
    /// The compressed layers' digests, bottom first.
    pub layer_digests: Vec<String>,
}

/// Writes `layers` and `spec` as an OCI layout in `dir` (created; must not exist), the
/// manifest tagged `spec.tag`'s tag part in index.json.
pub fn write_oci_layout(spec: &ImageSpec, layers: &[Layer], dir: &Path) -> Result<OciImage> {
    write_oci_layout_with(spec, layers, dir, None)
}

/// As [`write_oci_layout`]; with a `store`, each compressed layer is a store step of its own
/// (`oci-gzip-<hash>`, keyed by the layer's diff_id and the compressor), linked into the
/// layout: a second layout after a DeepEP change compresses only the layers that moved.
pub fn write_oci_layout_with(
    spec: &ImageSpec,
    layers: &[Layer],
    dir: &Path,
    store: Option<&Store>,
) -> Result<OciImage> {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).with_context(|| format!("cannot create {}", blobs.display()))?;
    let mut layer_descriptors = Vec::new();
    for layer in layers {
        let (digest, size) = match store {
            Some(store) => stored_gzip(store, layer, &blobs)?,
            None => compress_into(&layer.path, &blobs)?,
        };
        layer_descriptors.push(Descriptor::new(
            MediaType::ImageLayerGzip,
            size,
            Digest::from_str(&digest)?,
        ));
    }
    let config = image_config(spec, layers)?;
    let config_digest = put_blob(&blobs, config.as_bytes())?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(Descriptor::new(
            MediaType::ImageConfig,
            config.len() as u64,
            Digest::from_str(&config_digest)?,
        ))
        .layers(layer_descriptors.clone())
        .build()?;
    let manifest = canonical(&manifest)?;
    let manifest_digest = put_blob(&blobs, manifest.as_bytes())?;
    let tag = spec.tag.rsplit_once(':').map_or("latest", |(_, t)| t);
    let mut manifest_descriptor = Descriptor::new(
        MediaType::ImageManifest,
        manifest.len() as u64,
        Digest::from_str(&manifest_digest)?,
    );
    manifest_descriptor.set_annotations(Some(
        [(
            "org.opencontainers.image.ref.name".to_string(),
            tag.to_string(),
        )]
        .into(),
    ));
    let index = ImageIndexBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest_descriptor])
        .build()?;
    fs::write(dir.join("index.json"), canonical(&index)?)?;
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(OciImage {
        manifest_digest,
        config_digest,
        layer_digests: layer_descriptors
            .iter()
            .map(|d| d.digest().to_string())
            .collect(),
    })
}

fn canonical(value: &impl serde::Serialize) -> Result<String> {
    Ok(commstack_digest::canonical_json(&serde_json::to_value(
        value,
    )?))
}

/// Stores `bytes` as a blob; returns `sha256:<hex>`.
fn put_blob(blobs: &Path, bytes: &[u8]) -> Result<String> {
    let hex = commstack_digest::sha256_hex(bytes);
    fs::write(blobs.join(&hex), bytes)?;
    Ok(format!("sha256:{hex}"))
}

/// The store step name of a compressed layer.
pub const GZIP_STEP: &str = "oci-gzip";

/// The compressor's own fingerprint: the digest of a fixed input compressed as every layer
/// is. Part of a compressed layer's key, so a store filled by another flate2 (an older
/// checkout) is not taken for this one's bytes.
fn compressor_fingerprint() -> Result<String> {
    static FINGERPRINT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(f) = FINGERPRINT.get() {
        return Ok(f.clone());
    }
    // Text-like runs and noise, so both the matcher and the literal coder are exercised.
    let mut probe = Vec::with_capacity(1 << 20);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    while probe.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 4 {
            0 => probe.extend_from_slice(&x.to_le_bytes()),
            _ => probe.extend_from_slice(b"lib/python3.11/site-packages/torch/lib/"),
        }
    }
    let mut gz = GzEncoder::new(Vec::new(), Compression::new(GZIP_LEVEL));
    std::io::Write::write_all(&mut gz, &probe)?;
    let f = commstack_digest::sha256_hex(&gz.finish()?);
    Ok(FINGERPRINT.get_or_init(|| f).clone())
}

/// The compressed `layer` from its store step (made when missing), linked (or copied) into
/// `blobs`; returns its digest and size.
fn stored_gzip(store: &Store, layer: &Layer, blobs: &Path) -> Result<(String, u64)> {
    let inputs = serde_json::json!({
        "diff_id": layer.diff_id,
        "size": layer.size,
        "level": GZIP_LEVEL,
        "compressor": compressor_fingerprint()?,
    });
    let key = StepKey::new(GZIP_STEP, &inputs);
    let outcome = store.run(&key, &inputs, false, |out| {
        fs::create_dir_all(&out.out)?;
        let (digest, size) = compress_into(&layer.path, &out.out)?;
        let hex = digest.trim_start_matches("sha256:");
        fs::rename(out.out.join(hex), out.out.join("layer.tar.gz"))?;
        fs::write(
            out.out.join("blob.json"),
            serde_json::json!({ "digest": digest, "size": size }).to_string(),
        )?;
        Ok(())
    })?;
    let step = outcome.path();
    let blob: serde_json::Value = serde_json::from_slice(&fs::read(step.join("blob.json"))?)
        .with_context(|| format!("{}: blob.json", step.display()))?;
    let (Some(digest), Some(size)) = (blob["digest"].as_str(), blob["size"].as_u64()) else {
        anyhow::bail!(
            "{}: blob.json names no digest and size: remove the step",
            step.display()
        );
    };
    let from = step.join("layer.tar.gz");
    let to = blobs.join(digest.trim_start_matches("sha256:"));
    if fs::hard_link(&from, &to).is_err() {
        fs::copy(&from, &to)
            .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    }
    Ok((digest.to_string(), size))
}

/// gzip `tar` into a blob; returns its digest and size.
fn compress_into(tar: &Path, blobs: &Path) -> Result<(String, u64)> {
    let temp = tempfile::NamedTempFile::new_in(blobs)?;
    let mut hashing = HashingWriter::new(temp.as_file());
    {
        // GzBuilder's defaults: no name, no comment, mtime 0.
        let mut gz = GzEncoder::new(&mut hashing, Compression::new(GZIP_LEVEL));
        let mut input = BufReader::new(
            File::open(tar).with_context(|| format!("cannot read the layer {}", tar.display()))?,
        );
        std::io::copy(&mut input, &mut gz)?;
        gz.finish()?;
    }
    let hex = hex::encode(hashing.hasher.finalize());
    let size = hashing.size;
    temp.persist(blobs.join(&hex))?;
    Ok((format!("sha256:{hex}"), size))
}
