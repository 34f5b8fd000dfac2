//! What can go wrong with one GET, each refusal naming the bound it hit.

use std::time::Duration;

/// The longest URL a message prints; a longer one is cut (it came from an index or a
/// mirror, so it may be anything).
const SHOWN_MAX: usize = 300;

/// `url` as a message prints it: control characters escaped, at most 300 characters.
pub fn shown(url: &str) -> String {
    let safe = commstack_digest::terminal_safe(url);
    match safe.char_indices().nth(SHOWN_MAX) {
        Some((cut, _)) => format!("{}...", &safe[..cut]),
        None => safe.into_owned(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot build the HTTP client: {0}")]
    Setup(String),
    /// The body is (or announced itself) larger than the bound.
    #[error("{}", too_large(.url, .what, *.limit, *.size, *.announced))]
    TooLarge {
        url: String,
        what: String,
        limit: u64,
        /// What `Content-Length` announced, or how many bytes had arrived when it was cut.
        size: u64,
        announced: bool,
    },
    /// The whole download (every attempt and wait) took longer than the bound.
    #[error("{}", too_slow(.url, .what, *.limit, *.received, .last.as_deref()))]
    TooSlow {
        url: String,
        what: String,
        limit: Duration,
        /// Body bytes that had arrived, over every attempt.
        received: u64,
        /// The last transient failure, when an attempt failed before the time ran out.
        last: Option<String>,
    },
    /// Transient failures (5xx, 429, resets, timeouts) until the policy's retries ran out.
    #[error("{} (gave up after {attempts} attempts)", .message)]
    GaveUp { message: String, attempts: u32 },
    /// A failure that another try would not mend (a bad URL, a redirect loop).
    #[error("{}: {message}", shown(.url))]
    Failed { url: String, message: String },
}

fn too_large(url: &str, what: &str, limit: u64, size: u64, announced: bool) -> String {
    let url = shown(url);
    match announced {
        true => format!(
            "{url}: {what} announces {} (Content-Length), more than its bound of {}: refused before reading it",
            bytes(size),
            bytes(limit)
        ),
        false => format!(
            "{url}: {what} is larger than its bound of {}: refused at {} read, before reading more",
            bytes(limit),
            bytes(size)
        ),
    }
}

fn too_slow(url: &str, what: &str, limit: Duration, received: u64, last: Option<&str>) -> String {
    let last = last
        .map(|l| format!("; last failure: {l}"))
        .unwrap_or_default();
    format!(
        "{}: {what} did not arrive within its bound of {} (the whole download, retries included; {} had \
         arrived{last}): the server is too slow or stalls",
        shown(url),
        seconds(limit),
        bytes(received)
    )
}

/// `4 MiB (4194304 bytes)`: what a reader compares with docs/bounds.md, and the exact count.
pub fn bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    match n {
        n if n >= MIB && n % MIB == 0 => format!("{} MiB ({n} bytes)", n / MIB),
        n if n >= MIB => format!("{:.1} MiB ({n} bytes)", n as f64 / MIB as f64),
        n if n >= KIB => format!("{:.1} KiB ({n} bytes)", n as f64 / KIB as f64),
        n => format!("{n} bytes"),
    }
}

fn seconds(d: Duration) -> String {
    match d.subsec_millis() {
        0 => format!("{} s", d.as_secs()),
        _ => format!("{:.1} s", d.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_escaped_and_cut() {
        assert_eq!(shown("http://a/\x1b[2Jb"), "http://a/\\x1b[2Jb");
        let long = format!("http://a/{}", "x".repeat(1000));
        let cut = shown(&long);
        assert_eq!(cut.chars().count(), SHOWN_MAX + 3);
        assert!(cut.ends_with("..."));
    }

    #[test]
    fn sizes_read_as_the_docs_write_them() {
        assert_eq!(bytes(4 << 20), "4 MiB (4194304 bytes)");
        assert_eq!(bytes(1536), "1.5 KiB (1536 bytes)");
        assert_eq!(bytes(12), "12 bytes");
    }
}
