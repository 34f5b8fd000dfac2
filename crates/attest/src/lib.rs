//! commstack-attest: attestations of a pushed image that the ecosystem verifies.
//!
//! - [`statement`]: the in-toto Statement v1 and the SLSA provenance v1 predicate.
//! - [`record`]: what the build recorded about the image (the image step's files, the
//!   lock, summary.json's run and each step's `.step.json`), read back.
//! - [`make`]: the SBOM statement (the image's SPDX 2.3 document as predicate) and the
//!   provenance statement, each about the image's manifest digest.
//! - [`dsse`]: DSSE envelopes signed with ed25519 over PAE, and their verification.
//! - [`check`]: attestations checked against a lock, each check named.
//!
//! Pushing them (cosign's `sha256-<hex>.att` format) is the registry crate's; `push` and
//! `verify attestations` (crates/pipeline) join the two.

pub mod check;
pub mod dsse;
pub mod make;
pub mod record;
pub mod statement;

pub use check::{Check, Expected, Fetched, check_all};
pub use dsse::{Envelope, parse_public_key, read_public_key, read_signing_key};
pub use make::{provenance_statement, sbom_statement};
pub use record::BuildRecord;
pub use statement::{PAYLOAD_TYPE, SLSA_PREDICATE, SPDX_PREDICATE, Statement};

/// The media type of a DSSE envelope in a registry (one layer per attestation).
pub const ENVELOPE_MEDIA_TYPE: &str = "application/vnd.dsse.envelope.v1+json";

/// `statement` signed with `key`: the envelope's JSON bytes, as a layer holds them.
pub fn envelope_bytes(statement: &Statement, key: &ed25519_dalek::SigningKey) -> Vec<u8> {
    let envelope = dsse::sign(PAYLOAD_TYPE, &statement.to_bytes(), key);
    serde_json::to_vec(&envelope).expect("an envelope is JSON")
}
