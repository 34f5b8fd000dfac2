//! Attestations attached to a manifest as `cosign attest` stores them: one image manifest,
//! one layer per DSSE envelope (`application/vnd.dsse.envelope.v1+json`, annotated with its
//! `predicateType` and cosign's empty `dev.cosignproject.cosign/signature`), its config an
//! image config whose diff_ids are the layers' digests (the layers are not compressed), as
//! cosign writes it; here also with the attested manifest as `subject` and cosign's OCI 1.1
//! attestation `artifactType`. It is pushed through [`crate::referrer::push_referrer`]:
//! a referrer of the image where the registry has the referrers API, and always under
//! `sha256-<hex>.att` too, since `cosign verify-attestation` reads that tag without any
//! flag. The envelopes carry their own signatures: the manifest around them is not signed.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::bounded::{Document, shown};
use crate::layout::MANIFEST_MEDIA_TYPE;
use crate::pull::Puller;
use crate::push::PushOptions;
use crate::referrer::{Referred, find_attached, push_referrer};

/// A layer's media type: one DSSE envelope.
pub const ENVELOPE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";
/// The layer annotation naming the statement's predicate type.
pub const PREDICATE_ANNOTATION: &str = "predicateType";
/// The annotation cosign puts on every layer of a signature or attestation image (empty
/// for attestations: the signature is in the envelope).
const COSIGN_SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// The `artifactType` cosign's OCI 1.1 mode gives an attestation.
pub const ATTESTATION_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.att.v1+json";
/// How many attestation manifests of one image are read at most (a registry's referrers
/// list is the registry's word).
const MOST_ATTACHED: usize = 16;

/// One attestation: its predicate type and the envelope's JSON bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attestation {
    pub predicate_type: String,
    pub envelope: Vec<u8>,
}

/// An attestation read back, with the digest of the layer it came in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchedAttestation {
    pub predicate_type: String,
    pub layer: String,
    pub envelope: Vec<u8>,
}

/// Pushes `attestations` about the manifest `subject` (digest and size, already in the
/// registry): a referrer of it where the registry has the referrers API, and tagged
/// `sha256-<hex>.att` (the tag's earlier content replaced) everywhere.
pub fn push_attestations(
    subject: (&str, u64),
    attestations: &[Attestation],
    options: &PushOptions,
) -> Result<Referred> {
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let layout = work.path().join("oci");
    write_layout(subject, attestations, &layout)?;
    let mut options = options.clone();
    options.tag_referrers = true;
    push_referrer(&layout, subject.0, "att", &options).with_context(|| {
        format!(
            "pushing the attestations of {}@{}",
            options.target.name(),
            subject.0
        )
    })
}

/// The attestation image as an OCI layout in `dir`.
fn write_layout(subject: (&str, u64), attestations: &[Attestation], dir: &Path) -> Result<()> {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)
        .with_context(|| format!("cannot create {}", blobs.display()))?;
    let put = |bytes: &[u8]| -> Result<String> {
        let hex = commstack_digest::sha256_hex(bytes);
        std::fs::write(blobs.join(&hex), bytes)
            .with_context(|| format!("cannot write into {}", blobs.display()))?;
        Ok(format!("sha256:{hex}"))
    };
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for a in attestations {
        let digest = put(&a.envelope)?;
        diff_ids.push(digest.clone());
        layers.push(json!({
            "mediaType": ENVELOPE_MEDIA_TYPE,
            "digest": digest,
            "size": a.envelope.len(),
            "annotations": {
                COSIGN_SIGNATURE_ANNOTATION: "",
                PREDICATE_ANNOTATION: a.predicate_type,
            },
        }));
    }
    let config = commstack_digest::canonical_json(&json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }));
    let manifest = commstack_digest::canonical_json(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ATTESTATION_ARTIFACT_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": put(config.as_bytes())?, "size": config.len()},
        "layers": layers,
        "subject": {"mediaType": MANIFEST_MEDIA_TYPE, "digest": subject.0, "size": subject.1},
    }));
    let manifest_digest = put(manifest.as_bytes())?;
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": MANIFEST_MEDIA_TYPE, "digest": manifest_digest, "size": manifest.len()}],
    });
    std::fs::write(
        dir.join("index.json"),
        commstack_digest::canonical_json(&index),
    )?;
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(())
}

/// The attestations attached to the manifest `digest`: those of every attestation manifest
/// its referrers list (the first [`MOST_ATTACHED`]), else of its `sha256-<hex>.att`; each
/// envelope read within its descriptor's size and [`Document::Attestation`]'s bound and
/// checked against its digest; not verified. None when the registry has none.
pub fn fetch_attestations(
    options: &PushOptions,
    digest: &str,
) -> Result<Option<Vec<FetchedAttestation>>> {
    let puller = Puller::new(options)?;
    let attached = find_attached(
        &puller,
        digest,
        ATTESTATION_ARTIFACT_TYPE,
        "att",
        MOST_ATTACHED,
    )?;
    if attached.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for found in attached {
        out.extend(envelopes(&puller, &found.place, &found.manifest)?);
    }
    Ok(Some(out))
}

/// The envelopes one attestation manifest (at `place`) holds.
fn envelopes(puller: &Puller, place: &str, manifest: &[u8]) -> Result<Vec<FetchedAttestation>> {
    let manifest: Value = serde_json::from_slice(manifest)
        .with_context(|| format!("{place} is not a JSON manifest"))?;
    let mut out = Vec::new();
    for (i, layer) in manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if layer["mediaType"] != ENVELOPE_MEDIA_TYPE {
            continue;
        }
        let (Some(layer_digest), Some(size)) = (layer["digest"].as_str(), layer["size"].as_u64())
        else {
            anyhow::bail!("{place}: its layer {i} has no digest or size");
        };
        let envelope = puller
            .pull_document(layer_digest, size, Document::Attestation)
            .with_context(|| format!("the attestation in layer {i} of {place}"))?;
        out.push(FetchedAttestation {
            predicate_type: layer["annotations"][PREDICATE_ANNOTATION]
                .as_str()
                .unwrap_or("")
                .to_string(),
            layer: shown(layer_digest),
            envelope,
        });
    }
    Ok(out)
}
