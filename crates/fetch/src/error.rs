//! Errors that name the artifact, the URL, the expected and actual digest, and what to
//! do next.

use std::fmt;
use std::path::PathBuf;

use commstack_digest::terminal_safe_capped;

/// The longest line of a failure report (a URL and a server's message fit many times).
const LINE_MAX: usize = 4096;

/// Why a fetch failed. `Display` is written for the person at the terminal.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Some artifacts could not be had from any source (the others were fetched).
    #[error("{}", render_failures(.0))]
    Artifacts(Vec<ArtifactFailure>),
    /// `preflight`: some artifacts cannot be had from any source; nothing was downloaded.
    #[error("{}", render_unreachable(.0))]
    Unreachable(Vec<ArtifactFailure>),
    /// `--offline` and some artifacts are in neither the cache nor a local mirror.
    #[error("{}", render_offline(.0))]
    Offline(Vec<ArtifactFailure>),
    #[error(
        "--source {name}=...: the lock has no artifact named {name:?}; its artifacts are: {known}"
    )]
    UnknownOverride { name: String, known: String },
    #[error("--source {name}={}: {message}", .path.display())]
    BadOverride {
        name: String,
        path: PathBuf,
        message: String,
    },
    #[error("invalid artifact list: {0}")]
    InvalidArtifact(String),
    #[error("{0}")]
    Setup(String),
    #[error("cache {}: {source}", .dir.display())]
    Cache {
        dir: PathBuf,
        source: std::io::Error,
    },
}

/// Every source tried for one artifact, and why each failed.
#[derive(Debug, Clone)]
pub struct ArtifactFailure {
    pub name: String,
    pub filename: String,
    /// How the lock pins it: `sha256 <hex>` or `tree sha256:<hex>`.
    pub pin: String,
    pub attempts: Vec<SourceFailure>,
}

/// One source (mirror or upstream URL) that did not give the right bytes.
#[derive(Debug, Clone)]
pub struct SourceFailure {
    pub url: String,
    pub error: SourceError,
}

impl SourceFailure {
    /// The source answered with bytes that are not the lock's (not merely absent or down).
    pub fn is_damage(&self) -> bool {
        matches!(
            self.error,
            SourceError::HashMismatch { .. }
                | SourceError::TreeMismatch { .. }
                | SourceError::SizeMismatch { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeCheck {
    /// The artifact has no locked tree hash (not a source archive).
    NotLocked,
    /// The unpacked tree matches the locked tree hash.
    Matches,
    Differs {
        actual: String,
    },
    Unreadable {
        message: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// The whole file arrived but its sha256 differs from the lock.
    HashMismatch {
        expected: String,
        actual: String,
        size: u64,
        tree: TreeCheck,
    },
    /// An archive pinned by tree hash alone whose unpacked tree is another.
    TreeMismatch {
        expected: String,
        found: TreeCheck,
        sha256: String,
    },
    /// The server announced (or sent) another size than the lock's.
    SizeMismatch {
        expected: u64,
        actual: u64,
    },
    /// An HTTP status that is not worth retrying (404, 403, 410...) or still failing
    /// after the retries.
    Status {
        code: u16,
        attempts: u32,
    },
    /// Connection, timeout or body errors, still failing after the retries.
    Transport {
        message: String,
        attempts: u32,
    },
    /// A mirror directory without this file.
    NotInMirror {
        path: PathBuf,
    },
    /// Offline: an http(s) source was not tried.
    SkippedOffline,
    /// The lock gives neither a sha256 nor a tree hash: nothing to check a download with.
    Unpinned,
    Io {
        message: String,
    },
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceError::HashMismatch {
                expected,
                actual,
                size,
                tree,
            } => {
                write!(
                    f,
                    "sha256 mismatch: expected {expected}, got {actual} ({size} bytes)"
                )?;
                match tree {
                    TreeCheck::NotLocked => Ok(()),
                    TreeCheck::Matches => write!(
                        f,
                        "; its unpacked tree matches the locked tree hash (same contents, other archive): \
                         pass --accept-tree-match to use it (outputs will say so)"
                    ),
                    TreeCheck::Differs { actual } => {
                        write!(f, "; its unpacked tree differs too ({actual})")
                    }
                    TreeCheck::Unreadable { message } => write!(f, "; no tree hash: {message}"),
                }
            }
            SourceError::TreeMismatch {
                expected,
                found,
                sha256,
            } => {
                write!(f, "tree hash mismatch: expected {expected}, ")?;
                match found {
                    TreeCheck::Differs { actual } => write!(f, "got {actual}")?,
                    TreeCheck::Unreadable { message } => write!(f, "unreadable: {message}")?,
                    TreeCheck::NotLocked | TreeCheck::Matches => write!(f, "{found:?}")?,
                }
                write!(f, " (archive sha256 {sha256})")
            }
            SourceError::SizeMismatch { expected, actual } => {
                write!(
                    f,
                    "size mismatch: the lock says {expected} bytes, the server {actual}"
                )
            }
            SourceError::Status { code, attempts } => {
                write!(f, "HTTP {code} (after {attempts} attempt(s))")
            }
            SourceError::Transport { message, attempts } => {
                write!(f, "{message} (after {attempts} attempt(s))")
            }
            SourceError::NotInMirror { path } => {
                write!(f, "not in the mirror ({} does not exist)", path.display())
            }
            SourceError::SkippedOffline => write!(f, "not tried: offline"),
            SourceError::Unpinned => write!(
                f,
                "not fetched: the lock pins it by neither sha256 nor tree hash, so no download could be \
                 verified; add its tree hash (commstack_fetch::tree::tree_sha256 of the archive) to the lock"
            ),
            SourceError::Io { message } => write!(f, "{message}"),
        }
    }
}

impl ArtifactFailure {
    /// Each line escaped as a whole: names, URLs and server messages are text from the
    /// lock, the network or an archive, and must not start lines of their own.
    fn render(&self, out: &mut String) {
        let line = |text: String| terminal_safe_capped(&text, LINE_MAX) + "\n";
        out.push_str(&line(format!(
            "  {} ({}, {}):",
            self.name, self.filename, self.pin
        )));
        if self.attempts.is_empty() {
            out.push_str("    no source: the artifact has no URL and no mirror was given\n");
        }
        for attempt in &self.attempts {
            out.push_str(&line(format!("    {}: {}", attempt.url, attempt.error)));
        }
    }

    fn has(&self, pred: impl Fn(&SourceError) -> bool) -> bool {
        self.attempts.iter().any(|a| pred(&a.error))
    }
}

fn render_failures(failures: &[ArtifactFailure]) -> String {
    let mut out = format!("{} artifact(s) could not be fetched:\n", failures.len());
    for failure in failures {
        failure.render(&mut out);
    }
    let hash = failures.iter().any(|f| {
        f.has(|e| {
            matches!(
                e,
                SourceError::HashMismatch { .. } | SourceError::TreeMismatch { .. }
            )
        })
    });
    let tree = failures.iter().any(|f| {
        f.has(|e| {
            matches!(
                e,
                SourceError::HashMismatch {
                    tree: TreeCheck::Matches,
                    ..
                }
            )
        })
    });
    let gone = failures.iter().any(|f| {
        f.has(|e| {
            matches!(
                e,
                SourceError::Status {
                    code: 404 | 410,
                    ..
                }
            )
        })
    });
    let net = failures.iter().any(|f| {
        f.has(|e| {
            matches!(
                e,
                SourceError::Transport { .. }
                    | SourceError::Status {
                        code: 429 | 500..=599,
                        ..
                    }
            )
        })
    });
    out.push_str("what to do:\n");
    if hash {
        out.push_str(
            "  - a hash mismatch means the server sent other bytes than the lock names: nothing was \
             cached. `cargo xtask lock --check --online` compares every locked hash with what the index \
             publishes; if the lock was edited or upstream replaced the file, `cargo xtask lock --force` \
             rewrites the hashes from the index (review the change).\n",
        );
    }
    if tree {
        out.push_str("  - where the tree matches, `--accept-tree-match` accepts that archive (it is recorded).\n");
    }
    if gone {
        out.push_str(
            "  - a 404/410 means the file is gone from that URL: use a mirror (`--mirror DIR|URL`) or re-lock.\n",
        );
    }
    if net {
        out.push_str(
            "  - network errors and 5xx/429 were retried with backoff: run the fetch again later \
             (it resumes partial files), or use `--mirror`.\n",
        );
    }
    out.push_str(
        "  - what was fetched is in the cache; the next `cargo xtask fetch` only gets the rest.",
    );
    out
}

fn render_unreachable(failures: &[ArtifactFailure]) -> String {
    let mut out = format!(
        "{} artifact(s) cannot be had from the cache, a mirror or upstream (checked before downloading anything):\n",
        failures.len()
    );
    for failure in failures {
        failure.render(&mut out);
    }
    out.push_str(
        "what to do: nothing was downloaded. Give a mirror that holds them (`--mirror DIR`; \
         `cargo xtask mirror export DIR` on a machine that reaches upstream makes one), or run \
         again once upstream answers.",
    );
    out
}

fn render_offline(missing: &[ArtifactFailure]) -> String {
    // A mirror file with the wrong bytes is not "missing": say which is which.
    let damaged = |f: &ArtifactFailure| f.attempts.iter().any(SourceFailure::is_damage);
    let (bad, absent): (Vec<&ArtifactFailure>, Vec<&ArtifactFailure>) =
        missing.iter().partition(|f| damaged(f));
    let mut out = String::new();
    if !bad.is_empty() {
        out.push_str(&format!(
            "offline: {} artifact(s) are damaged in the mirror (the file is there, its bytes are not the lock's):\n",
            bad.len()
        ));
        for failure in &bad {
            failure.render(&mut out);
        }
    }
    if !absent.is_empty() {
        out.push_str(&format!(
            "offline: {} artifact(s) are in neither the cache nor a local mirror:\n",
            absent.len()
        ));
        for failure in &absent {
            failure.render(&mut out);
        }
    }
    out.push_str(
        "what to do: on a machine with network run `cargo xtask mirror export DIR`, carry DIR here and \
         run `cargo xtask fetch --offline --mirror DIR`; or fetch here without --offline.",
    );
    out
}
