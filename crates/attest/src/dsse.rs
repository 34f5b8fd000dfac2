//! DSSE envelopes (https://github.com/secure-systems-lab/dsse, v1.0): a payload, its type,
//! and ed25519 signatures over the pre-authentication encoding
//! `PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, so that a
//! signature binds the type as well as the bytes. The keys are the ones commstack signs
//! with everywhere (PKCS#8 PEM, `openssl genpkey -algorithm ed25519`); a verifier takes
//! them as cosign does (SubjectPublicKeyInfo PEM, `openssl pkey -pubout`) or as
//! stack.toml's `ed25519:<base64>`.

use std::path::Path;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

/// A DSSE envelope as JSON carries it (the payload in standard base64).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<EnvelopeSignature>,
}

/// One signature of an envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    /// `ed25519:<base64>` of the signing key (DSSE leaves keyid's meaning to the parties;
    /// this is the form stack.toml's trusted keys take, and cosign ignores it).
    #[serde(default)]
    pub keyid: String,
    pub sig: String,
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// DSSE's pre-authentication encoding of `body` of type `payload_type`.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// `ed25519:<base64 of the 32-byte key>`.
pub fn key_text(key: &VerifyingKey) -> String {
    format!("ed25519:{}", B64.encode(key.to_bytes()))
}

/// Signs `body` as `payload_type` with `key`.
pub fn sign(payload_type: &str, body: &[u8], key: &SigningKey) -> Envelope {
    let signature: Signature = key.sign(&pae(payload_type, body));
    Envelope {
        payload_type: payload_type.to_string(),
        payload: B64.encode(body),
        signatures: vec![EnvelopeSignature {
            keyid: key_text(&key.verifying_key()),
            sig: B64.encode(signature.to_bytes()),
        }],
    }
}

impl Envelope {
    /// The payload's bytes, not verified.
    pub fn body(&self) -> Result<Vec<u8>> {
        B64.decode(&self.payload)
            .context("the envelope's payload is not base64")
    }

    /// The payload's bytes once a signature by one of `trusted` verifies over them (DSSE:
    /// any one trusted signature is enough); the error says why none did.
    pub fn open(&self, trusted: &[VerifyingKey]) -> Result<(Vec<u8>, VerifyingKey)> {
        let body = self.body()?;
        let message = pae(&self.payload_type, &body);
        let mut tried = Vec::new();
        for s in &self.signatures {
            let Some(bytes) = B64
                .decode(&s.sig)
                .ok()
                .and_then(|b| <[u8; 64]>::try_from(b).ok())
            else {
                tried.push(format!("{}: not base64 of 64 bytes", shown(&s.sig)));
                continue;
            };
            let signature = Signature::from_bytes(&bytes);
            // The keyid is a hint only: every trusted key is tried, as cosign does.
            match trusted
                .iter()
                .find(|k| k.verify_strict(&message, &signature).is_ok())
            {
                Some(key) => return Ok((body, *key)),
                None => tried.push(format!(
                    "the signature by {} does not verify under a trusted key",
                    match s.keyid.is_empty() {
                        true => "an unnamed key".to_string(),
                        false => shown(&s.keyid),
                    }
                )),
            }
        }
        if self.signatures.is_empty() {
            bail!("the envelope has no signature");
        }
        bail!(
            "{} (trusted: {}): the payload, its type or the signature was altered, or another key signed it",
            tried.join("; "),
            match trusted.len() {
                0 => "none".to_string(),
                _ => trusted.iter().map(key_text).collect::<Vec<_>>().join(", "),
            }
        )
    }
}

/// At most 80 characters of `text`, safe for a terminal: envelope fields are the
/// registry's word.
fn shown(text: &str) -> String {
    commstack_digest::terminal_safe(&text.chars().take(80).collect::<String>()).into_owned()
}

/// Reads a PKCS#8 PEM ed25519 private key (what `push --key` takes).
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

/// A trusted public key from its text: a SubjectPublicKeyInfo PEM (cosign's `cosign.pub`,
/// `openssl pkey -in key.pem -pubout`) or `ed25519:<base64>` (stack.toml's form).
pub fn parse_public_key(text: &str) -> Result<VerifyingKey> {
    let text = text.trim();
    if text.starts_with("-----BEGIN PUBLIC KEY-----") {
        return VerifyingKey::from_public_key_pem(text).map_err(|e| {
            anyhow::anyhow!("not an ed25519 public key in SubjectPublicKeyInfo PEM ({e})")
        });
    }
    let encoded = text.strip_prefix("ed25519:").with_context(|| {
        format!(
            "{:?}: a public key is a PEM file (`openssl pkey -in key.pem -pubout`) or ed25519:<base64>",
            shown(text)
        )
    })?;
    let bytes = B64
        .decode(encoded)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .with_context(|| format!("{:?}: not base64 of 32 bytes", shown(text)))?;
    VerifyingKey::from_bytes(&bytes)
        .with_context(|| format!("{:?}: not an ed25519 key", shown(text)))
}

/// [`parse_public_key`] of a file's text, the error naming the file.
pub fn read_public_key(file: &Path) -> Result<VerifyingKey> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the public key {}", file.display()))?;
    parse_public_key(&text).with_context(|| {
        format!(
            "{}: make it from the private key with `openssl pkey -in key.pem -pubout -out {}`",
            file.display(),
            file.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_the_spec_s_encoding() {
        // The DSSE spec's own example (protocol.md, "Test vectors" style).
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
        assert_eq!(pae("", b""), b"DSSEv1 0  0 ".to_vec());
    }

    #[test]
    fn an_envelope_opens_under_its_key_only_and_not_once_altered() {
        let key = SigningKey::from_bytes(&[3u8; 32]);
        let other = SigningKey::from_bytes(&[4u8; 32]);
        let env = sign("application/vnd.in-toto+json", b"{\"a\":1}", &key);
        assert_eq!(env.signatures[0].keyid, key_text(&key.verifying_key()));
        let (body, by) = env
            .open(&[other.verifying_key(), key.verifying_key()])
            .unwrap();
        assert_eq!(body, b"{\"a\":1}");
        assert_eq!(by, key.verifying_key());

        let err = env.open(&[other.verifying_key()]).unwrap_err();
        assert!(err.to_string().contains("does not verify"), "{err}");
        let mut payload = env.clone();
        payload.payload = B64.encode(b"{\"a\":2}");
        assert!(payload.open(&[key.verifying_key()]).is_err());
        // The type is signed too.
        let mut typed = env.clone();
        typed.payload_type = "text/plain".into();
        assert!(typed.open(&[key.verifying_key()]).is_err());
        let mut sig = env.clone();
        let mut raw = B64.decode(&sig.signatures[0].sig).unwrap();
        raw[0] ^= 1;
        sig.signatures[0].sig = B64.encode(raw);
        assert!(sig.open(&[key.verifying_key()]).is_err());
        let mut none = env;
        none.signatures.clear();
        let err = none.open(&[key.verifying_key()]).unwrap_err();
        assert!(err.to_string().contains("no signature"), "{err}");
    }

    #[test]
    fn public_keys_are_read_as_cosign_s_pem_and_as_stack_toml_s_text() {
        let key = SigningKey::from_bytes(&[5u8; 32]).verifying_key();
        assert_eq!(parse_public_key(&key_text(&key)).unwrap(), key);
        // SubjectPublicKeyInfo of that key, as `openssl pkey -pubout` writes it.
        use ed25519_dalek::pkcs8::EncodePublicKey;
        let pem = key
            .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .unwrap();
        assert_eq!(parse_public_key(&pem).unwrap(), key);
        assert!(parse_public_key("ed25519:AAAA").is_err());
        assert!(parse_public_key("rsa:xyz").is_err());
    }
}
