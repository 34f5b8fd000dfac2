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
/// where the registry has the referrers API, else tagged `sha256-<hex>.<kind>` (`sig` for
/// a signature, `att` for an attestation).
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
