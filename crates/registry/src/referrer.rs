//! Artifacts pushed where the readers of their subject look, as cosign does: a signature
//! (and an attestation, `sha256-<hex>.att`) goes up by digest alone where the registry has
//! the referrers API (`GET /v2/<repo>/referrers/<digest>` answers an index; a registry
//! need not send `OCI-Subject` on the push, so it is asked) and is found through that
//! API; elsewhere under the tag `sha256-<hex>.<kind>`.

use std::path::Path;

use anyhow::Result;

use crate::pull::Puller;
use crate::push::{PushOptions, push_layout};
use crate::target::attachment_tag;

/// An image config's media type: the config of cosign's attestation manifests.
const IMAGE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// How an attached artifact is found from its subject's digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FoundThrough {
    /// The registry's referrers API (OCI 1.1).
    Referrers,
    /// cosign's tag scheme, `sha256-<hex>.<kind>`.
    Tag,
}

/// Where a referrer went.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Referred {
    /// `host/repo@sha256:...` (through referrers) or `host/repo:sha256-<hex>.<kind>`.
    pub reference: String,
    pub manifest_digest: String,
    pub through: FoundThrough,
}

/// Whether the options' registry has the referrers API, asked about `subject` (a manifest
/// of the repository: a registry may answer 404 for a repository it does not have yet).
pub fn has_referrers_api(options: &PushOptions, subject: &str) -> Result<bool> {
    Ok(Puller::new(options)?.referrers(subject, None)?.is_some())
}

/// Pushes the artifact layout at `layout`, whose manifest's `subject` is the manifest
/// `subject` (already in the registry), where its subject's readers look: as a referrer
/// where the registry has the referrers API (tagged as well with
/// [`PushOptions::tag_referrers`]), else tagged `sha256-<hex>.<kind>` (`sig` for a
/// signature, `att` for an attestation).
pub fn push_referrer(
    layout: &Path,
    subject: &str,
    kind: &str,
    options: &PushOptions,
) -> Result<Referred> {
    let tag = attachment_tag(subject, kind)?;
    let mut options = options.clone();
    options.untagged = false;
    let through = match has_referrers_api(&options, subject)? {
        // By digest alone, as cosign's OCI 1.1 mode; tagged too when asked.
        true if options.tag_referrers => {
            options.tag = Some(tag.clone());
            FoundThrough::Referrers
        }
        true => {
            options.tag = None;
            options.untagged = true;
            FoundThrough::Referrers
        }
        false => {
            options.tag = Some(tag.clone());
            FoundThrough::Tag
        }
    };
    let pushed = push_layout(layout, &options)?;
    let reference = match through {
        FoundThrough::Referrers => pushed.reference.clone(),
        FoundThrough::Tag => format!("{}:{tag}", options.target.name()),
    };
    Ok(Referred {
        reference,
        manifest_digest: pushed.manifest_digest,
        through,
    })
}

/// An artifact found attached to a manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedFound {
    /// `host/repo@sha256:...` or `host/repo:sha256-<hex>.<kind>`.
    pub place: String,
    pub through: FoundThrough,
    /// `sha256:<hex>` of the manifest's bytes, checked here.
    pub digest: String,
    pub manifest: Vec<u8>,
}

/// The artifacts of `artifact_type` attached to the manifest `subject`, as
/// [`push_referrer`] puts them: its referrers of that type (of the first `most` that may
/// be) where the
/// registry has the referrers API, else, or when it lists none, the one tagged
/// `sha256-<hex>.<kind>`. Each manifest read within a manifest's bound, its digest checked;
/// what they hold is the caller's to check (an attestation's envelope, its signature).
pub fn find_attached(
    puller: &Puller,
    subject: &str,
    artifact_type: &str,
    kind: &str,
    most: usize,
) -> Result<Vec<AttachedFound>> {
    puller.block_on(async {
        let repo = puller.options.target.name();
        let mut found = Vec::new();
        let referrers = puller.referrers_async(subject, None).await?;
        // A registry may list an artifact under its config's media type rather than its
        // `artifactType` (go-containerregistry's does): such an entry (the empty config's
        // type, an image config's as cosign's attestations have, or none) is read and its
        // manifest's own `artifactType` decides.
        let maybe = |r: &&crate::pull::Referrer| match r.artifact_type.as_deref() {
            Some(t) => {
                t == artifact_type
                    || t == crate::artifact::EMPTY_CONFIG_MEDIA_TYPE
                    || t == IMAGE_CONFIG_MEDIA_TYPE
            }
            None => true,
        };
        for referrer in referrers.iter().flatten().filter(maybe).take(most) {
            let place = format!("{repo}@{}", crate::bounded::shown(&referrer.digest));
            let what = format!("reading {place}");
            let Some(manifest) = puller.manifest_by_digest(&referrer.digest, &what).await? else {
                continue;
            };
            let of_type = referrer.artifact_type.as_deref() == Some(artifact_type)
                || serde_json::from_slice::<serde_json::Value>(&manifest)
                    .is_ok_and(|m| m["artifactType"] == artifact_type);
            if of_type {
                found.push(AttachedFound {
                    place,
                    through: FoundThrough::Referrers,
                    digest: referrer.digest.clone(),
                    manifest,
                });
            }
        }
        if !found.is_empty() {
            return Ok(found);
        }
        let tag = attachment_tag(subject, kind)?;
        let place = puller.place(&tag);
        let what = format!("reading {place}");
        if let Some(manifest) = puller.tagged_manifest(&tag, &what).await? {
            use sha2::Digest as _;
            found.push(AttachedFound {
                place,
                through: FoundThrough::Tag,
                digest: format!("sha256:{}", hex::encode(sha2::Sha256::digest(&manifest))),
                manifest,
            });
        }
        Ok(found)
    })
}
