//! commstack-registry: talking to OCI distribution registries.
//!
//! - [`target`]: `HOST[:PORT]/REPO`, tags and their grammar.
//! - [`auth`]: credentials from the environment or Docker's config file.
//! - [`layout`]: an OCI image layout read for pushing, each blob checked against its digest.
//! - [`push`]: the push itself (oci-client): blobs the registry lacks, then the manifest by
//!   digest, then the tags; retries with backoff, bounded parallelism, progress.
//! - [`pull`]: manifests found by tag, documents read whole within their bounds, blobs
//!   downloaded with their sha256 checked as they stream, resumed after an interruption.
//! - [`bounded`]: the bound of each document read from a registry (manifest, config,
//!   signature, verify report), checked while it streams; [`deadline`]: how slowly a
//!   registry may send it.
//! - [`artifact`]: OCI artifacts (a step's output, a signature) written as layouts to push.
//! - [`sign`]: signatures in cosign's format (a simple-signing payload, ed25519) over
//!   manifest digests; [`signed`]: pushing them beside what they sign, and finding
//!   (referrers API, then cosign's tag) and verifying them.
//! - [`referrer`]: artifacts with a manifest as their `subject` (signatures,
//!   attestations) pushed through the referrers API or under cosign's tag.
//! - [`attach`]: documents pushed beside a manifest, tagged (the image's verify report).
//! - [`attestations`]: DSSE envelopes attached to a manifest as cosign stores them
//!   (a referrer of it, and `sha256-<hex>.att`), and read back.

pub mod artifact;
pub mod attach;
pub mod attestations;
pub mod auth;
pub mod bounded;
pub mod deadline;
pub mod layout;
mod progress;
pub mod pull;
pub mod push;
pub mod referrer;
pub mod sign;
pub mod signed;
pub mod target;

pub use auth::{Credentials, credentials};
pub use bounded::Document;
pub use layout::Layout;
pub use push::{
    LOCK_LABEL, PushOptions, Pushed, RetryPolicy, push_layout, push_layout_async, tags_for,
};
pub use referrer::{FoundThrough, Referred, push_referrer};
pub use signed::{PushedSigned, Signatures, fetch_signatures, push_signed, verify_signed};
pub use target::{Target, lock_tag, valid_tag};

// The public key type trusted keys parse into, so callers need no ed25519 crate of their own.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
// The credential type of [`Credentials`], so callers need no oci-client of their own.
pub use oci_client::secrets::RegistryAuth;
