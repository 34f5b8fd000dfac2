//! Signed pushes: a layout pushed, then a signature artifact (its one layer the
//! [`SignatureDoc`] over the pushed manifest's digest, its `subject` that manifest) under
//! the tag `sha256-<hex>.sig`; and the check a puller makes: fetch that signature and
//! verify it under the trusted keys, before trusting what the manifest names.

use std::path::Path;

use crate::artifact::{Artifact, EMPTY_CONFIG_MEDIA_TYPE, write_artifact_layout};
use crate::bounded::{Document, shown};
use crate::layout::Layout;
use crate::pull::Puller;
use crate::push::{PushOptions, Pushed, push_layout};
use crate::sign::{
    SIGNATURE_ARTIFACT_TYPE, SIGNATURE_MEDIA_TYPE, SignatureDoc, sign, signature_tag, verify,
};
use anyhow::{Context, Result, bail};
use ed25519_dalek::{SigningKey, VerifyingKey};

/// A pushed layout and its pushed signature.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PushedSigned {
    #[serde(flatten)]
    pub pushed: Pushed,
    /// `host/repo:sha256-<hex>.sig`.
    pub signature: String,
    /// `ed25519:<base64>` of the key that signed.
    pub signed_by: String,
}

/// Pushes the signature by `key` of the layout at `dir`, then the layout: its tags appear
/// only once its signature is there, so a puller never sees a tagged, unsigned output
/// (a registry accepts a manifest whose subject it does not have yet).
pub fn push_signed(dir: &Path, key: &SigningKey, options: &PushOptions) -> Result<PushedSigned> {
    use sha2::Digest;
    let layout = Layout::open(dir)?;
    let manifest_digest = format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(&layout.manifest))
    );
    let doc = sign(key, &manifest_digest);
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let doc_file = work.path().join("signature.json");
    std::fs::write(&doc_file, serde_json::to_vec(&doc)?)?;
    let signature_layout = work.path().join("oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: SIGNATURE_ARTIFACT_TYPE.to_string(),
            config_media_type: EMPTY_CONFIG_MEDIA_TYPE.to_string(),
            config: b"{}".to_vec(),
            layers: vec![(SIGNATURE_MEDIA_TYPE.to_string(), doc_file)],
            annotations: Default::default(),
            subject: Some((manifest_digest.clone(), layout.manifest.len() as u64)),
        },
        &signature_layout,
    )?;
    let tag = signature_tag(&manifest_digest)?;
    let mut sig_options = options.clone();
    sig_options.tag = Some(tag.clone());
    push_layout(&signature_layout, &sig_options).with_context(|| {
        format!(
            "pushing the signature of {}@{manifest_digest}",
            options.target.name()
        )
    })?;
    let pushed = push_layout(dir, options)?;
    if pushed.manifest_digest != manifest_digest {
        bail!(
            "{}: pushed as {}, signed as {manifest_digest}: the layout changed during the push; push it again",
            dir.display(),
            pushed.manifest_digest
        );
    }
    Ok(PushedSigned {
        signature: format!("{}:{tag}", options.target.name()),
        signed_by: doc.key,
        pushed,
    })
}

/// Fetches the signature of `digest` from the registry and verifies it under `trusted`.
/// An unsigned manifest is an error too: a puller that accepts one says so itself.
pub fn verify_signed(
    options: &PushOptions,
    digest: &str,
    trusted: &[VerifyingKey],
) -> Result<SignatureDoc> {
    let target = &options.target;
    let Some(doc) = fetch_signature(options, digest)? else {
        bail!(
            "{}@{digest} is not signed (no {}:{}): refusing it",
            target.name(),
            target.name(),
            signature_tag(digest)?
        );
    };
    verify(&doc, digest, trusted).with_context(|| format!("{}@{digest}", target.name()))?;
    Ok(doc)
}

/// The signature document of `digest` (its `sha256-<hex>.sig` artifact), not verified
/// yet; None when the registry has none. Errors are the registry's (unreachable,
/// credentials, a damaged signature blob), never a verdict on the signature.
pub fn fetch_signature(options: &PushOptions, digest: &str) -> Result<Option<SignatureDoc>> {
    Puller::new(options)?.fetch_signature(digest)
}

impl Puller {
    /// [`fetch_signature`] in this session.
    pub fn fetch_signature(&self, digest: &str) -> Result<Option<SignatureDoc>> {
        self.block_on(fetch_signature_async(self, digest))
    }
}

async fn fetch_signature_async(puller: &Puller, digest: &str) -> Result<Option<SignatureDoc>> {
    let tag = signature_tag(digest)?;
    let place = puller.place(&tag);
    let what = format!("reading the signature {place}");
    let Some(manifest) = puller.tagged_manifest(&tag, &what).await? else {
        return Ok(None);
    };
    let manifest: serde_json::Value = serde_json::from_slice(&manifest)
        .with_context(|| format!("{place} is not a JSON manifest"))?;
    let descriptor = manifest["layers"]
        .as_array()
        .and_then(|layers| {
            layers
                .iter()
                .find(|l| l["mediaType"] == SIGNATURE_MEDIA_TYPE)
        })
        .with_context(|| format!("{place} holds no {SIGNATURE_MEDIA_TYPE} layer"))?;
    let layer = descriptor["digest"]
        .as_str()
        .with_context(|| format!("{place}: its signature layer has no digest"))?;
    let size = descriptor["size"]
        .as_u64()
        .with_context(|| format!("{place}: its signature layer has no size"))?;
    // A signature document is a few hundred bytes: read within its descriptor's size and
    // the bound of a signature, never whole.
    let bytes = puller
        .document(layer, size, Document::Signature)
        .await
        .with_context(|| format!("the signature {place}"))?;
    let doc: SignatureDoc = serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "the signature blob {} of {place} is not a signature",
            shown(layer)
        )
    })?;
    Ok(Some(doc))
}
