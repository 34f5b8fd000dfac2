//! ed25519 signatures over manifest digests. A pulled build output is code that will run
//! on GPUs: what `cache push` stores is signed, and a puller accepts it only under a key
//! it trusts (the public keys listed in stack.toml, next).
//!
//! What is signed is `commstack-signature-v1 <manifest digest>`: the manifest names every
//! blob by digest, so the signature covers every byte; the prefix keeps a signature made
//! here from meaning anything elsewhere. Keys are PKCS#8 PEM files (`openssl genpkey
//! -algorithm ed25519 -out key.pem`); public keys are written `ed25519:<base64>`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use ed25519_dalek::pkcs8::DecodePrivateKey;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::bounded::shown;

/// The media type of a signature document (one layer of a signature artifact).
pub const SIGNATURE_MEDIA_TYPE: &str = "application/vnd.dev.commstack.signature.v1+json";
/// The artifact type of a signature artifact.
pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.dev.commstack.signature.v1";

const DOMAIN: &str = "commstack-signature-v1";

/// A signature of one manifest digest, as stored in the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureDoc {
    /// `sha256:<hex>` of the signed manifest.
    pub digest: String,
    /// `ed25519:<base64>` of the public key.
    pub key: String,
    /// base64 of the 64-byte signature.
    pub signature: String,
}

/// Reads a PKCS#8 PEM ed25519 private key.
pub fn read_signing_key(file: &Path) -> Result<SigningKey> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the signing key {}", file.display()))?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        anyhow::anyhow!(
            "{} is not an ed25519 private key in PKCS#8 PEM ({e}): make one with `openssl genpkey -algorithm ed25519 -out {}`",
            file.display(),
            file.display()
        )
    })
}

/// `ed25519:<base64>`.
pub fn public_key_text(key: &VerifyingKey) -> String {
    format!(
        "ed25519:{}",
        base64::engine::general_purpose::STANDARD.encode(key.to_bytes())
    )
}

/// Parses `ed25519:<base64 of 32 bytes>`.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey> {
    let shown = || format!("\"{}\"", shown(text));
    let encoded = text
        .strip_prefix("ed25519:")
        .with_context(|| format!("{}: a public key is written ed25519:<base64>", shown()))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .with_context(|| format!("{}: not base64 of 32 bytes", shown()))?;
    VerifyingKey::from_bytes(&bytes).with_context(|| format!("{}: not an ed25519 key", shown()))
}

fn payload(digest: &str) -> Vec<u8> {
    format!("{DOMAIN} {digest}").into_bytes()
}

/// Signs `digest` (`sha256:<hex>`).
pub fn sign(key: &SigningKey, digest: &str) -> SignatureDoc {
    let signature: Signature = key.sign(&payload(digest));
    SignatureDoc {
        digest: digest.to_string(),
        key: public_key_text(&key.verifying_key()),
        signature: base64::engine::general_purpose::STANDARD.encode(signature.to_bytes()),
    }
}

/// Checks that `doc` signs `digest` under one of `trusted`; the error says which of the
/// three it is: another digest, an untrusted key, a signature that does not verify.
pub fn verify(doc: &SignatureDoc, digest: &str, trusted: &[VerifyingKey]) -> Result<()> {
    // The document's fields are the registry's word: shown escaped and cut.
    if doc.digest != digest {
        bail!(
            "the signature is for {}, not for {digest}: refusing it",
            shown(&doc.digest)
        );
    }
    let key = parse_public_key(&doc.key)?;
    if !trusted.contains(&key) {
        bail!(
            "{digest} is signed by {}, which is not a trusted key (trusted: {})",
            shown(&doc.key),
            match trusted.len() {
                0 => "none".to_string(),
                _ => trusted
                    .iter()
                    .map(public_key_text)
                    .collect::<Vec<_>>()
                    .join(", "),
            }
        );
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&doc.signature)
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .context("the signature is not base64 of 64 bytes")?;
    key.verify_strict(&payload(digest), &Signature::from_bytes(&bytes))
        .map_err(|_| {
            anyhow::anyhow!(
                "the signature of {digest} by {} does not verify: the signature or the manifest was altered",
                shown(&doc.key)
            )
        })
}

/// The tag a signature artifact is pushed under: `sha256-<hex>.sig` (the tag scheme
/// cosign uses, which registries without the referrers API serve too).
pub fn signature_tag(digest: &str) -> Result<String> {
    crate::target::attachment_tag(digest, "sig")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_digest_and_a_trusted_key() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[9u8; 32]);
        let digest = format!("sha256:{}", "ab".repeat(32));
        let doc = sign(&key, &digest);
        let trusted = [key.verifying_key()];
        verify(&doc, &digest, &trusted).unwrap();

        let err = verify(&doc, &digest, &[other.verifying_key()]).unwrap_err();
        assert!(err.to_string().contains("not a trusted key"), "{err}");
        let err = verify(&doc, &format!("sha256:{}", "cd".repeat(32)), &trusted).unwrap_err();
        assert!(err.to_string().contains("not for"), "{err}");
        // The same document pointed at another digest: the signature does not verify.
        let mut moved = doc.clone();
        moved.digest = format!("sha256:{}", "cd".repeat(32));
        let err = verify(&moved, &moved.digest.clone(), &trusted).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");

        assert_eq!(
            parse_public_key(&public_key_text(&key.verifying_key())).unwrap(),
            key.verifying_key()
        );
        assert!(parse_public_key("ed25519:AAAA").is_err());
        assert_eq!(
            signature_tag(&digest).unwrap(),
            format!("sha256-{}.sig", "ab".repeat(32))
        );
    }
}
