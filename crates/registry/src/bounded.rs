//! Reading from a registry within bounds (docs/bounds.md, "Registry"). A registry is not
//! trusted for sizes: what it sends is read in pieces and refused as soon as it passes its
//! bound, and a length it announces is checked before anything is read.
//!
//! oci-client reads a manifest's body whole (`Client::pull_manifest_raw` calls
//! `Response::bytes`), and the body of every error answer too, and has no size-limited
//! API; so the GETs of a pull ([`crate::pull::Puller`]) are made on reqwest (the HTTP
//! client under oci-client, set up as [`crate::push`] sets up oci-client's: the same TLS
//! roots, timeouts, user agent, plain HTTP where asked), after oci-client's log-in.

use std::time::Duration;

use anyhow::{Context, Result};
use oci_client::errors::{OciDistributionError, OciEnvelope};

use crate::deadline::human;
use crate::push::PushOptions;

/// What is read from a registry whole, into memory, and the most bytes each may have.
/// Layers are not documents: they stream to files, bounded by their descriptor's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Document {
    /// An image or artifact manifest: 4 MiB, as the distribution spec suggests (and
    /// docker-registry enforces on push).
    Manifest,
    /// An artifact's config (a step's provenance, a verify report's description).
    Config,
    /// A signature's payload (cosign's simple signing: a few hundred bytes).
    Signature,
    /// A file of an attached verify report (`verify-static.json`, ...).
    Report,
    /// A DSSE envelope of an attestation (the SBOM's holds one entry per package).
    Attestation,
}

impl Document {
    /// The most bytes it may have.
    pub const fn limit(self) -> u64 {
        match self {
            Document::Manifest => 4 << 20,
            Document::Config => 1 << 20,
            Document::Signature => 64 << 10,
            Document::Report => 16 << 20,
            Document::Attestation => 16 << 20,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Document::Manifest => "manifest",
            Document::Config => "config",
            Document::Signature => "signature payload",
            Document::Report => "verify report file",
            Document::Attestation => "attestation",
        }
    }

    /// "a manifest may be (4 MiB, docs/bounds.md)": the bound, for messages.
    pub fn bound(self) -> String {
        format!(
            "the most a {} may be ({}, docs/bounds.md)",
            self.name(),
            human(self.limit())
        )
    }
}

/// The most bytes of an error answer read, for its message, and the longest it may take.
const ERROR_BODY_LIMIT: u64 = 16 << 10;
const ERROR_BODY_TIME: Duration = Duration::from_secs(30);

/// The reqwest client for `options`' registry: what oci-client's would be.
pub(crate) fn http_client(options: &PushOptions) -> Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(15))
        .read_timeout(Duration::from_secs(300))
        .user_agent(concat!("commstack/", env!("CARGO_PKG_VERSION")));
    if let Some(file) = &options.ca_file {
        let certs = crate::push::ca_certificates(file)?
            .iter()
            .map(reqwest::Certificate::try_from)
            .collect::<std::result::Result<Vec<_>, _>>()
            .with_context(|| format!("the CA file {}", file.display()))?;
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .context("cannot set up the registry client (TLS roots?)")
}

/// `https://HOST/v2/REPO` (`http://` for a plain-HTTP target).
pub(crate) fn base_url(options: &PushOptions) -> String {
    let target = &options.target;
    let scheme = match target.plain_http {
        true => "http",
        false => "https",
    };
    format!("{scheme}://{}/v2/{}", target.registry, target.repository)
}

/// A body read within its bound.
pub(crate) enum Body {
    Whole(Vec<u8>),
    /// It passed the bound: announced that long (`Content-Length`), or that many bytes
    /// had come when it did.
    Over {
        bytes: u64,
        announced: bool,
    },
    /// It did not end within its deadline ([`Slowest`]).
    Late,
}

/// The body of `response`, at most `limit` bytes: [`Body::Over`] as soon as a piece passes
/// it (nothing more is read), or before any is read when the announced length does.
pub(crate) async fn read_bounded(
    mut response: reqwest::Response,
    limit: u64,
) -> std::result::Result<Body, OciDistributionError> {
    if let Some(len) = response.content_length().filter(|&l| l > limit) {
        return Ok(Body::Over {
            bytes: len,
            announced: true,
        });
    }
    let mut body = Vec::new();
    while let Some(piece) = response.chunk().await? {
        if body.len() as u64 + piece.len() as u64 > limit {
            return Ok(Body::Over {
                bytes: body.len() as u64 + piece.len() as u64,
                announced: false,
            });
        }
        body.extend_from_slice(&piece);
    }
    Ok(Body::Whole(body))
}

/// The error a registry's non-success answer means (as oci-client reads one: an OCI
/// error envelope for a 4xx when it is one, else the status and the body's text), from
/// the first [`ERROR_BODY_LIMIT`] bytes of its body.
pub(crate) async fn error_answer(response: reqwest::Response) -> OciDistributionError {
    let status = response.status();
    let url = response.url().to_string();
    let read = tokio::time::timeout(ERROR_BODY_TIME, read_bounded(response, ERROR_BODY_LIMIT));
    let body = match read.await.unwrap_or(Ok(Body::Late)) {
        Ok(Body::Whole(body)) => body,
        Ok(Body::Late) => b"(an error body not read whole within 30 s)".to_vec(),
        Ok(Body::Over { bytes, .. }) => {
            format!("(an error body of {bytes} bytes or more, not read)").into_bytes()
        }
        Err(e) => format!("(its body could not be read: {e})").into_bytes(),
    };
    match status.as_u16() {
        401 => OciDistributionError::UnauthorizedError { url },
        code @ 400..500 => match serde_json::from_slice::<OciEnvelope>(&body) {
            Ok(envelope) => OciDistributionError::RegistryError { envelope, url },
            Err(_) => OciDistributionError::ServerError {
                code,
                url,
                message: commstack_digest::terminal_safe(&String::from_utf8_lossy(&body))
                    .into_owned(),
            },
        },
        code => OciDistributionError::ServerError {
            code,
            url,
            message: commstack_digest::terminal_safe(&String::from_utf8_lossy(&body)).into_owned(),
        },
    }
}

/// Untrusted text (a registry's, an artifact's) for a message: control characters
/// escaped, cut after 200 characters.
pub(crate) fn shown(text: &str) -> String {
    const MAX: usize = 200;
    let cut: String = text.chars().take(MAX).collect();
    let more = match text.chars().count() > MAX {
        true => "...",
        false => "",
    };
    format!("{}{more}", commstack_digest::terminal_safe(&cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_said_in_their_units() {
        assert_eq!(
            Document::Manifest.bound(),
            "the most a manifest may be (4 MiB, docs/bounds.md)"
        );
        assert_eq!(human(Document::Signature.limit()), "64 KiB");
        assert_eq!(human(300), "300 bytes");
        assert_eq!(shown("a\nb"), "a\\nb");
        assert_eq!(shown(&"x".repeat(300)).len(), 203);
    }
}
