//! commstack-fetch: every locked artifact downloaded once, verified, resumable, cached,
//! mirrorable.
//!
//! - [`fetch_all`] brings a list of [`Artifact`]s into a [`Cache`] keyed by sha256: mirrors
//!   first, then upstream; bounded parallel downloads; retries with backoff on 5xx, 429
//!   (honouring `Retry-After`), resets and timeouts; `Range` resume of partial files
//!   (restarting when the server ignores `Range`); sha256 computed while streaming; a file
//!   appears in the cache only after its hash matched (temp file + rename); a file lock
//!   per digest so that concurrent processes download each file once.
//! - `offline` opens no socket and reports everything missing ([`FetchError::Offline`]).
//! - [`fetch_for_lock`] brings the sources `lock` has not seen and hashes them (sha256
//!   and tree), trusting on first use what nothing pins yet.
//! - [`export_mirror`] writes the air-gap bundle that `Mirror::Dir` reads.
//! - [`tree`] defines the tree hash used to accept a re-packed source archive (only with
//!   `accept_tree_match`) and to describe `--source NAME=PATH` overrides; both show up in
//!   [`Fetched::provenance`] so later outputs can say so ([`Fetched::deviation`]).

mod artifact;
mod cache;
mod download;
mod error;
mod fetch;
mod first_use;
mod mirror_export;
mod progress;
mod source;
pub mod tree;

pub use artifact::{Artifact, filename_of_url, normalize_sha256};
pub use cache::{
    Cache, CacheEntry, CorruptEntry, DigestLock, GcReport, TreeMatchRecord, TreeRecord,
    check_cached_file,
};
pub use error::{ArtifactFailure, FetchError, SourceError, SourceFailure, TreeCheck};
pub use fetch::{
    FetchOptions, Fetched, Origin, Provenance, SourceOverride, Summary, fetch_all, fetch_all_async,
    not_cached, preflight,
};
pub use first_use::{Seen, fetch_for_lock};
pub use mirror_export::{
    ExportReport, MIRROR_MANIFEST, MirrorEntry, MirrorManifest, export_mirror, read_manifest,
};
pub use progress::Progress;
pub use source::Mirror;
