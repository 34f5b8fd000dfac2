//! Documents that travel with a pushed manifest: the image's verify report, an OCI
//! artifact whose `subject` is that manifest, always tagged `sha256-<hex>.verify` (a
//! deploy finds it by that name on any registry; where the referrers API is, its subject
//! lists it there too), signed like any output. Signatures and attestations go through
//! [`crate::referrer::push_referrer`] instead.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ed25519_dalek::SigningKey;

use crate::artifact::{Artifact, write_artifact_layout};
use crate::push::{PushOptions, push_layout};
use crate::signed::push_signed;
use crate::target::attachment_tag;

/// A document set to attach to `subject`.
pub struct Attachment {
    /// The tag's suffix: `verify` gives `sha256-<hex>.verify`.
    pub kind: String,
    pub artifact_type: String,
    pub config_media_type: String,
    /// The config's bytes (what the files are about: the image, the builder).
    pub config: Vec<u8>,
    /// The files, each a layer: media type and path.
    pub files: Vec<(String, PathBuf)>,
}

/// Where an attachment went.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Attached {
    /// `host/repo:sha256-<hex>.<kind>`.
    pub reference: String,
    pub manifest_digest: String,
    /// Where the signature of the attachment's own manifest went, when signed.
    pub signature: Option<String>,
}

/// Pushes `attachment` with the manifest `subject` (digest and size, already in the
/// registry) as its subject, tagged `sha256-<hex>.<kind>`, signed with `key` when given.
pub fn push_attached(
    subject: (&str, u64),
    attachment: &Attachment,
    key: Option<&SigningKey>,
    options: &PushOptions,
) -> Result<Attached> {
    let tag = attachment_tag(subject.0, &attachment.kind)?;
    let work = tempfile::tempdir().context("cannot create a temporary directory")?;
    let layout = work.path().join("oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: attachment.artifact_type.clone(),
            config_media_type: attachment.config_media_type.clone(),
            config: attachment.config.clone(),
            layers: attachment.files.clone(),
            annotations: Default::default(),
            subject: Some((subject.0.to_string(), subject.1)),
        },
        &layout,
    )?;
    let mut options = options.clone();
    options.tag = Some(tag.clone());
    let what = || {
        format!(
            "pushing the {} of {}@{}",
            attachment.kind,
            options.target.name(),
            subject.0
        )
    };
    let (pushed, signature) = match key {
        Some(key) => {
            let signed = push_signed(&layout, key, &options).with_context(what)?;
            (signed.pushed, Some(signed.signature))
        }
        None => (push_layout(&layout, &options).with_context(what)?, None),
    };
    Ok(Attached {
        reference: format!("{}:{tag}", options.target.name()),
        manifest_digest: pushed.manifest_digest,
        signature,
    })
}

/// The size of the manifest of the layout at `dir` (a subject's descriptor needs it).
pub fn manifest_size(dir: &Path) -> Result<u64> {
    Ok(crate::layout::Layout::open(dir)?.manifest.len() as u64)
}
