//! Signed pushes in cosign's format, and the check a puller makes.
//!
//! A signed push sends the layout by digest, then its signature artifact (one layer, the
//! simple-signing payload of [`crate::sign`], its signature in the layer's
//! `dev.cosignproject.cosign/signature` annotation; the `subject` the signed manifest;
//! `artifactType` `application/vnd.dev.cosign.artifact.sig.v1+json` as cosign's OCI 1.1
//! mode writes it) through [`crate::referrer::push_referrer`]: as a referrer where the
//! registry has the referrers API, else under cosign's tag `sha256-<hex>.sig`. Then the
//! layout's tags: a puller never finds a tagged output without its signature.
//!
//! A puller looks for signatures through the referrers API first, then the tag; a
//! signature in commstack's own format from before (`application/vnd.dev.commstack.
//! signature.v1+json`) is refused with what to do.

use std::collections::BTreeMap;
use std::path::Path;

use crate::artifact::{Artifact, write_artifact_layout_annotated};
use crate::bounded::{Document, shown};
use crate::layout::Layout;
use crate::pull::Puller;
use crate::push::{PushOptions, Pushed, push_layout};
use crate::referrer::{FoundThrough, push_referrer};
use crate::sign::{
    CosignSignature, LEGACY_SIGNATURE_MEDIA_TYPE, SIGNATURE_ANNOTATION, SIGNATURE_ARTIFACT_TYPE,
    SIMPLE_SIGNING_MEDIA_TYPE, public_key_text, sign, signature_tag, verify,
};
use anyhow::{Context, Result, bail};
use ed25519_dalek::{SigningKey, VerifyingKey};

/// A pushed layout and its pushed signature.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PushedSigned {
    #[serde(flatten)]
    pub pushed: Pushed,
    /// Where the signature went: `host/repo@sha256:...` (a referrer) or
    /// `host/repo:sha256-<hex>.sig` (the tag scheme).
    pub signature: String,
    /// `referrers` or `tag`.
    pub signature_found_through: FoundThrough,
    /// `ed25519:<base64>` of the key that signed.
    pub signed_by: String,
}

/// Pushes the layout at `dir` by digest, its signature by `key`, then the layout's tags.
pub fn push_signed(dir: &Path, key: &SigningKey, options: &PushOptions) -> Result<PushedSigned> {
    let layout = Layout::open(dir)?;
    let mut untagged = options.clone();
    untagged.untagged = true;
    let first = push_layout(dir, &untagged)?;
    let digest = first.manifest_digest.clone();
    let signature = sign(key, &options.target.name(), &digest);
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let artifact = signature_layout(
        &signature,
        (&digest, layout.manifest.len() as u64),
        work.path(),
    )?;
    let mut sig_options = options.clone();
    sig_options.tag = None;
    sig_options.untagged = false;
    let placed = push_referrer(&artifact, &digest, "sig", &sig_options).with_context(|| {
        format!(
            "pushing the signature of {}@{digest}",
            options.target.name()
        )
    })?;
    // The tags last: HEADs of blobs the first push sent, the manifest again, its tags.
    let pushed = push_layout(dir, options)?;
    if pushed.manifest_digest != digest {
        bail!(
            "{}: pushed as {}, signed as {digest}: the layout changed during the push; push it again",
            dir.display(),
            pushed.manifest_digest
        );
    }
    Ok(PushedSigned {
        pushed: Pushed {
            bytes_uploaded: first.bytes_uploaded,
            uploaded: first.uploaded,
            present: first.present,
            ..pushed
        },
        signature: placed.reference,
        signature_found_through: placed.through,
        signed_by: public_key_text(&key.verifying_key()),
    })
}

/// The signature artifact of `signature` over `subject` (digest and size), as an
/// OCI layout under `work`: what cosign's OCI 1.1 mode pushes (the artifact type, as the
/// config's media type too; the simple-signing layer with the signature in its
/// annotation), the config `{}`.
pub fn signature_layout(
    signature: &CosignSignature,
    subject: (&str, u64),
    work: &Path,
) -> Result<std::path::PathBuf> {
    let payload = work.join("payload.json");
    std::fs::write(&payload, &signature.payload)
        .with_context(|| format!("cannot write {}", payload.display()))?;
    let dir = work.join("signature-oci");
    write_artifact_layout_annotated(
        &Artifact {
            artifact_type: SIGNATURE_ARTIFACT_TYPE.to_string(),
            // The artifact type as the config's media type too, as cosign writes it:
            // registries that derive a referrer's artifactType from its config (ggcr's)
            // list it under the type cosign asks for.
            config_media_type: SIGNATURE_ARTIFACT_TYPE.to_string(),
            config: b"{}".to_vec(),
            layers: vec![(SIMPLE_SIGNING_MEDIA_TYPE.to_string(), payload)],
            annotations: Default::default(),
            subject: Some((subject.0.to_string(), subject.1)),
        },
        &[BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_string(),
            signature.signature.clone(),
        )])],
        &dir,
    )?;
    Ok(dir)
}

/// What the registry holds as the signatures of a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signatures {
    /// None: where it was looked for.
    Unsigned { looked: String },
    /// Signatures in cosign's format, and the artifact they were found in.
    Cosign {
        place: String,
        signatures: Vec<CosignSignature>,
    },
    /// A signature in commstack's own format from before cosign's.
    Legacy { place: String },
}

impl Signatures {
    /// Where they were found (or looked for).
    pub fn place(&self) -> &str {
        match self {
            Signatures::Unsigned { looked } => looked,
            Signatures::Cosign { place, .. } | Signatures::Legacy { place } => place,
        }
    }

    /// Whether one of them names a key of `trusted` as its signer: one that then does not
    /// verify was altered, not merely signed by someone else.
    pub fn claims_trusted(&self, trusted: &[VerifyingKey]) -> bool {
        match self {
            Signatures::Cosign { signatures, .. } => signatures
                .iter()
                .any(|s| s.signer().is_some_and(|k| trusted.contains(&k))),
            _ => false,
        }
    }

    /// The key of `trusted` that signed `digest`; the error says why none did, and for an
    /// old signature how to sign again.
    pub fn verify(&self, digest: &str, trusted: &[VerifyingKey]) -> Result<VerifyingKey> {
        match self {
            Signatures::Unsigned { looked } => bail!("it is not signed (no {looked})"),
            Signatures::Legacy { place } => bail!(
                "its signature {place} is in commstack's own format from before the cosign format, which is no longer read: sign it again in cosign's (`cargo xtask cache push --registry HOST/REPO --key KEY.pem` for a step output, `cargo xtask push ... --key KEY.pem` for an image)"
            ),
            Signatures::Cosign { place, signatures } => {
                let mut errors = Vec::new();
                for signature in signatures {
                    match verify(signature, digest, trusted) {
                        Ok(key) => return Ok(key),
                        Err(e) => errors.push(e),
                    }
                }
                // The most telling: a trusted key's signature that does not verify.
                let pick = signatures
                    .iter()
                    .position(|s| s.signer().is_some_and(|k| trusted.contains(&k)))
                    .unwrap_or(0);
                Err(errors
                    .swap_remove(pick)
                    .context(format!("the signature {place}")))
            }
        }
    }
}

/// Fetches the signatures of `digest` and verifies them under `trusted`: the key that
/// signed. An unsigned manifest is an error too: a puller that accepts one says so itself.
pub fn verify_signed(
    options: &PushOptions,
    digest: &str,
    trusted: &[VerifyingKey],
) -> Result<VerifyingKey> {
    let found = fetch_signatures(options, digest)?;
    found
        .verify(digest, trusted)
        .with_context(|| format!("{}@{digest}", options.target.name()))
}

/// The signatures of `digest`, not verified yet. Errors are the registry's (unreachable,
/// credentials, a damaged signature blob), never a verdict on a signature.
pub fn fetch_signatures(options: &PushOptions, digest: &str) -> Result<Signatures> {
    Puller::new(options)?.fetch_signatures(digest)
}

/// At most this many signature referrers of one manifest are read (a registry could list
/// thousands).
const MOST_REFERRERS: usize = 16;

impl Puller {
    /// [`fetch_signatures`] in this session.
    pub fn fetch_signatures(&self, digest: &str) -> Result<Signatures> {
        self.block_on(fetch_signatures_async(self, digest))
    }
}

async fn fetch_signatures_async(puller: &Puller, digest: &str) -> Result<Signatures> {
    let repo = puller.options.target.name();
    let mut signatures = Vec::new();
    let referrers = puller
        .referrers_async(digest, Some(SIGNATURE_ARTIFACT_TYPE))
        .await?;
    let mut place = None;
    // An old-format signature is said only when no cosign signature is found.
    let mut legacy_place = None;
    for referrer in referrers.iter().flatten().take(MOST_REFERRERS) {
        let at = format!("{repo}@{}", shown(&referrer.digest));
        let what = format!("reading the signature {at}");
        let Some(manifest) = puller.manifest_by_digest(&referrer.digest, &what).await? else {
            continue;
        };
        let (found, legacy) = signature_layers(puller, &manifest, &at).await?;
        if legacy {
            legacy_place.get_or_insert(at);
            continue;
        }
        if !found.is_empty() && place.is_none() {
            place = Some(at);
        }
        signatures.extend(found);
    }
    if let Some(place) = place {
        return Ok(Signatures::Cosign { place, signatures });
    }
    // The tag scheme: registries without the referrers API, and signatures cosign pushed
    // in its default mode to one with it.
    let tag = signature_tag(digest)?;
    let at = puller.place(&tag);
    let what = format!("reading the signature {at}");
    let Some(manifest) = puller.tagged_manifest(&tag, &what).await? else {
        if let Some(place) = legacy_place {
            return Ok(Signatures::Legacy { place });
        }
        let looked = match referrers {
            Some(_) => format!("signature referrer of {repo}@{digest} and no {at}"),
            None => at,
        };
        return Ok(Signatures::Unsigned { looked });
    };
    let (signatures, legacy) = signature_layers(puller, &manifest, &at).await?;
    if legacy {
        return Ok(Signatures::Legacy { place: at });
    }
    if signatures.is_empty() {
        bail!(
            "{at} holds no {SIMPLE_SIGNING_MEDIA_TYPE} layer with a signature: not a cosign signature"
        );
    }
    Ok(Signatures::Cosign {
        place: at,
        signatures,
    })
}

/// The cosign signatures of a signature manifest (its simple-signing layers with their
/// annotation, each payload read within a signature's bound), and whether it is in
/// commstack's old format instead.
async fn signature_layers(
    puller: &Puller,
    manifest: &[u8],
    place: &str,
) -> Result<(Vec<CosignSignature>, bool)> {
    let manifest: serde_json::Value = serde_json::from_slice(manifest)
        .with_context(|| format!("{place} is not a JSON manifest"))?;
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    if layers
        .iter()
        .any(|l| l["mediaType"] == LEGACY_SIGNATURE_MEDIA_TYPE)
    {
        return Ok((Vec::new(), true));
    }
    let mut found = Vec::new();
    for layer in layers
        .iter()
        .filter(|l| l["mediaType"] == SIMPLE_SIGNING_MEDIA_TYPE)
        .take(MOST_REFERRERS)
    {
        let Some(signature) = layer["annotations"][SIGNATURE_ANNOTATION].as_str() else {
            continue;
        };
        let blob = layer["digest"]
            .as_str()
            .with_context(|| format!("{place}: its signature layer has no digest"))?;
        let size = layer["size"]
            .as_u64()
            .with_context(|| format!("{place}: its signature layer has no size"))?;
        // A payload is a few hundred bytes: read within its descriptor's size and the
        // bound of a signature, never whole.
        let payload = puller
            .document(blob, size, Document::Signature)
            .await
            .with_context(|| format!("the signature {place}"))?;
        found.push(CosignSignature {
            payload,
            signature: signature.to_string(),
        });
    }
    Ok((found, false))
}
