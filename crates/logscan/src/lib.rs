//! commstack-logscan: tell harmless from harmful in NCCL, NVSHMEM, DeepEP and PyTorch logs.
//!
//! A knowledge base of known lines ([`Signature`]: id, phase, severity, cause, fix, reference)
//! lives in `signatures.toml`, compiled once. [`scan_reader`] / [`Scanner`] stream any log in
//! bounded memory; lines that look like warnings or errors but match no signature are reported
//! as unknown, never dropped.
//!
//! ```
//! let kb = commstack_logscan::KnowledgeBase::builtin();
//! let sig = kb
//!     .classify_line("h:1:2 [0] proxy.cc:1458 NCCL WARN [Service thread] Accept failed Resource temporarily unavailable")
//!     .unwrap();
//! assert_eq!(sig.id, "nccl-proxy-accept-failed");
//! ```

pub mod bench;
mod kb;
mod prefix;
mod render;
mod scan;
mod signature;
mod unknown;

pub use kb::{BUILTIN_TOML, KnowledgeBase, LineClass, MAX_MATCH_LINE};
pub use render::render_human;
pub use scan::{
    Location, REPORT_SCHEMA_VERSION, ScanReport, Scanner, SignatureHit, SourceSummary,
    UnknownGroup, counts_by_phase, scan_reader,
};
pub use signature::{Phase, Severity, Signature};
pub use unknown::UnknownLevel;
