//! Signatures in cosign's format over manifest digests. A pulled build output is code that
//! will run on GPUs: what `cache push` and `push` store is signed, and a puller accepts it
//! only under a key it trusts (the public keys listed in stack.toml, next).
//!
//! What is signed is cosign's simple-signing payload (`{"critical":{"identity":
//! {"docker-reference":"HOST/REPO"},"image":{"docker-manifest-digest":"sha256:..."},"type":
//! "cosign container image signature"},"optional":{...}}`): the manifest names every blob
//! by digest, so the signature covers every byte, and cosign, its policy controller,
//! Kyverno and sigstore-rs verify it with the same public key (`cosign verify --key
//! cosign.pub`). The signature is ed25519 over the payload's bytes (PureEdDSA, RFC 8032):
//! cosign's `verify --key` verifies an ed25519 key's signatures so (cosign 3.1.1's own
//! `sign` makes Ed25519ph ones for such a key, which its `verify --key` then refuses:
//! tried on 2026-12-04).
//!
//! The payload's `optional` names the key that signed (`dev.commstack.signer`,
//! `ed25519:<base64>`): covered by the signature, it lets a puller tell a signature by a
//! key it does not trust from one altered after a trusted key made it.
//!
//! Keys are PKCS#8 PEM files (`openssl genpkey -algorithm ed25519 -out key.pem`); public
//! keys are written `ed25519:<base64>` or as the PEM SubjectPublicKeyInfo cosign reads
//! (`openssl pkey -in key.pem -pubout -out cosign.pub`).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::bounded::shown;

/// The media type of cosign's simple-signing payload (the one layer of a signature).
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds the base64 signature of the payload.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The artifact type cosign's OCI 1.1 mode gives a signature pushed as a referrer
/// (cosign's `ociexperimental.ArtifactType("sig")`).
pub const SIGNATURE_ARTIFACT_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// The payload's `critical.type`.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";
/// The key in the payload's `optional` that names the signing key.
pub const SIGNER_ANNOTATION: &str = "dev.commstack.signer";
/// The layer media type of commstack's own signature documents before the cosign format:
/// recognised only to refuse them with what to do.
pub const LEGACY_SIGNATURE_MEDIA_TYPE: &str = "application/vnd.dev.commstack.signature.v1+json";

/// cosign's simple-signing payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimpleSigning {
    pub critical: Critical,
    /// Free annotations (cosign's `-a key=value`); covered by the signature.
    #[serde(default)]
    pub optional: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Critical {
    pub identity: Identity,
    pub image: Image,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// `HOST/REPO` the image was pushed to.
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// `sha256:<hex>` of the signed manifest.
    #[serde(rename = "docker-manifest-digest")]
    pub docker_manifest_digest: String,
}

/// One signature as the registry holds it: the payload layer's bytes and the base64
/// signature of its annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CosignSignature {
    pub payload: Vec<u8>,
    pub signature: String,
}

impl CosignSignature {
    /// The payload parsed; an error says it is not cosign's simple signing.
    pub fn simple_signing(&self) -> Result<SimpleSigning> {
        serde_json::from_slice(&self.payload)
            .context("its payload is not cosign's simple-signing JSON")
    }

    /// The key the payload names as its signer (`optional["dev.commstack.signer"]`), when
    /// it names one that parses.
    pub fn signer(&self) -> Option<VerifyingKey> {
        let payload = self.simple_signing().ok()?;
        let text = payload
            .optional?
            .get(SIGNER_ANNOTATION)?
            .as_str()?
            .to_string();
        parse_public_key(&text).ok()
    }
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

/// The PEM SubjectPublicKeyInfo of `key`: what `cosign verify --key cosign.pub` reads.
pub fn public_key_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(Default::default())
        .expect("an ed25519 public key encodes as PEM")
}

/// Parses `ed25519:<base64 of 32 bytes>` or a PEM SubjectPublicKeyInfo of an ed25519 key
/// (`-----BEGIN PUBLIC KEY-----`, as `openssl pkey -pubout` and cosign write it).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey> {
    let shown = || format!("\"{}\"", shown(text));
    let text = text.trim();
    if text.starts_with("-----BEGIN PUBLIC KEY-----") {
        return VerifyingKey::from_public_key_pem(text).map_err(|e| {
            anyhow::anyhow!(
                "{}: not an ed25519 public key in PEM ({e}): commstack signs and trusts ed25519 keys",
                shown()
            )
        });
    }
    let encoded = text.strip_prefix("ed25519:").with_context(|| {
        format!(
            "{}: a public key is written ed25519:<base64>, or as a PEM public key file",
            shown()
        )
    })?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .with_context(|| format!("{}: not base64 of 32 bytes", shown()))?;
    VerifyingKey::from_bytes(&bytes).with_context(|| format!("{}: not an ed25519 key", shown()))
}

/// Reads a public key file: PEM (`cosign.pub`) or one line `ed25519:<base64>`.
pub fn read_public_key(file: &Path) -> Result<VerifyingKey> {
    let how = || {
        format!(
            "make it from the private key with `openssl pkey -in KEY.pem -pubout -out {}`",
            file.display()
        )
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the public key {}: {}", file.display(), how()))?;
    parse_public_key(&text).with_context(|| format!("{}: {}", file.display(), how()))
}

/// The simple-signing payload of `digest` pushed to `reference` (`HOST/REPO`), naming
/// `signer` in its `optional`.
pub fn payload(reference: &str, digest: &str, signer: &VerifyingKey) -> Vec<u8> {
    let payload = SimpleSigning {
        critical: Critical {
            identity: Identity {
                docker_reference: reference.to_string(),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            kind: SIGNATURE_TYPE.to_string(),
        },
        optional: Some(BTreeMap::from([(
            SIGNER_ANNOTATION.to_string(),
            serde_json::Value::String(public_key_text(signer)),
        )])),
    };
    serde_json::to_vec(&payload).expect("a payload serialises")
}

/// Signs `digest` (`sha256:<hex>`) of the image pushed to `reference` (`HOST/REPO`).
pub fn sign(key: &SigningKey, reference: &str, digest: &str) -> CosignSignature {
    let payload = payload(reference, digest, &key.verifying_key());
    let signature: Signature = key.sign(&payload);
    CosignSignature {
        payload,
        signature: base64::engine::general_purpose::STANDARD.encode(signature.to_bytes()),
    }
}

/// Checks that `sig` signs `digest` under one of `trusted`; returns the key that verified.
/// The error says which it is: a payload for another digest or not cosign's, a signature
/// by a key not trusted, a signature that does not verify.
pub fn verify(
    sig: &CosignSignature,
    digest: &str,
    trusted: &[VerifyingKey],
) -> Result<VerifyingKey> {
    // The payload is the registry's word until verified: shown escaped and cut.
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(sig.signature.trim())
        .ok()
        .and_then(|b| <[u8; 64]>::try_from(b).ok())
        .context("the signature is not base64 of 64 bytes (an ed25519 signature)")?;
    let signature = Signature::from_bytes(&bytes);
    let verified = trusted
        .iter()
        .find(|key| key.verify_strict(&sig.payload, &signature).is_ok());
    let Some(key) = verified else {
        return Err(match sig.signer() {
            Some(signer) if trusted.contains(&signer) => anyhow::anyhow!(
                "the signature of {digest} by {} does not verify: the signature or its payload was altered",
                public_key_text(&signer)
            ),
            Some(signer) => anyhow::anyhow!(
                "{digest} is signed by {}, which is not a trusted key (trusted: {})",
                public_key_text(&signer),
                trusted_list(trusted)
            ),
            None => anyhow::anyhow!(
                "the signature of {digest} verifies under no trusted key (trusted: {})",
                trusted_list(trusted)
            ),
        });
    };
    // Verified: now the payload is the signer's word, and must be about this manifest.
    let payload = sig.simple_signing()?;
    if payload.critical.kind != SIGNATURE_TYPE {
        bail!(
            "the signature's payload is of type \"{}\", not \"{SIGNATURE_TYPE}\": refusing it",
            shown(&payload.critical.kind)
        );
    }
    let signed = &payload.critical.image.docker_manifest_digest;
    if signed != digest {
        bail!(
            "the signature is for {}, not for {digest}: refusing it",
            shown(signed)
        );
    }
    Ok(*key)
}

fn trusted_list(trusted: &[VerifyingKey]) -> String {
    match trusted.len() {
        0 => "none".to_string(),
        _ => trusted
            .iter()
            .map(public_key_text)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The tag a signature artifact is pushed under where the registry has no referrers API:
/// `sha256-<hex>.sig` (cosign's tag scheme).
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
        let sig = sign(&key, "registry.example.com/cache", &digest);
        let trusted = [key.verifying_key()];
        assert_eq!(
            verify(&sig, &digest, &trusted).unwrap(),
            key.verifying_key()
        );
        assert_eq!(sig.signer(), Some(key.verifying_key()));
        let payload: serde_json::Value = serde_json::from_slice(&sig.payload).unwrap();
        assert_eq!(
            payload["critical"]["image"]["docker-manifest-digest"],
            digest.as_str()
        );
        assert_eq!(payload["critical"]["type"], SIGNATURE_TYPE);
        assert_eq!(
            payload["critical"]["identity"]["docker-reference"],
            "registry.example.com/cache"
        );

        let err = verify(&sig, &digest, &[other.verifying_key()]).unwrap_err();
        assert!(err.to_string().contains("not a trusted key"), "{err}");
        let err = verify(&sig, &format!("sha256:{}", "cd".repeat(32)), &trusted).unwrap_err();
        assert!(err.to_string().contains("not for"), "{err}");
        // The payload pointed at another digest: the signature no longer verifies.
        let mut moved = sig.clone();
        moved.payload = String::from_utf8(sig.payload.clone())
            .unwrap()
            .replace(&"ab".repeat(32), &"cd".repeat(32))
            .into_bytes();
        let err = verify(&moved, &format!("sha256:{}", "cd".repeat(32)), &trusted).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");

        assert_eq!(
            parse_public_key(&public_key_text(&key.verifying_key())).unwrap(),
            key.verifying_key()
        );
        assert_eq!(
            parse_public_key(&public_key_pem(&key.verifying_key())).unwrap(),
            key.verifying_key()
        );
        assert!(parse_public_key("ed25519:AAAA").is_err());
        assert_eq!(
            signature_tag(&digest).unwrap(),
            format!("sha256-{}.sig", "ab".repeat(32))
        );
    }
}
