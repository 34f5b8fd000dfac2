//! commstack-digest: the bottom of the flow. How every other crate names bytes: the
//! sha256 of a file, canonical JSON (the input of every step key and fingerprint), and
//! untrusted text made safe to print on a terminal ([`terminal_safe`]).
//! It depends on no other commstack crate, so any stage may use it.

mod canonical;
pub mod manifest;

use std::fs::File;
use std::io;
use std::path::Path;

use sha2::{Digest, Sha256};

pub use canonical::canonical_json;

/// The lowercase hex sha256 of a file's bytes, read in a stream. An error names the file.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let mut file = File::open(path).map_err(named)?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(named)?;
    Ok(hex::encode(hasher.finalize()))
}

/// The lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex::encode(Sha256::digest(bytes.as_ref()))
}

/// `text` with every control character escaped (`\x1b`, `\r`, `\u{9b}`), tabs kept:
/// a log line, an archive entry name or a server's message may carry ANSI/OSC sequences
/// that set the window title, move the cursor or clear the screen when echoed raw.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    std::borrow::Cow::Owned(out)
}

/// How many characters of an untrusted name (an archive entry, a link target, a file name
/// from a server) a message shows: [`terminal_safe_capped`]'s usual cap.
pub const SHOWN_NAME_MAX: usize = 256;

/// [`terminal_safe`], cut after `max_chars` characters of the escaped text, the cut said
/// with the original length: a name from untrusted input may be megabytes long, and a
/// message must stay one readable line. Reads no further than the cut.
pub fn terminal_safe_capped(text: &str, max_chars: usize) -> String {
    capped(text, max_chars, text.len())
}

/// [`terminal_safe_capped`] for bytes that should be text (an archive's entry names): read
/// as UTF-8 (invalid sequences replaced), no more of them than can be shown.
pub fn terminal_safe_capped_bytes(raw: &[u8], max_chars: usize) -> String {
    // A character is at most 4 bytes: no more is converted than can be shown.
    let head = &raw[..raw.len().min(max_chars.saturating_mul(4))];
    let mut out = capped(&String::from_utf8_lossy(head), max_chars, raw.len());
    if head.len() < raw.len() && !out.ends_with(" bytes in all)") {
        out.push_str(&format!("... ({} bytes in all)", raw.len()));
    }
    out
}

fn capped(text: &str, max_chars: usize, total_bytes: usize) -> String {
    let mut out = String::new();
    let mut shown = 0;
    for c in text.chars() {
        if shown >= max_chars {
            out.push_str(&format!("... ({total_bytes} bytes in all)"));
            return out;
        }
        let before = out.len();
        push_escaped(&mut out, c);
        shown += out[before..].chars().count();
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\t' => out.push(c),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x80 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
        c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        c => out.push(c),
    }
}

/// A writer that hashes and counts what passes through it, so a layer's diff_id or a
/// blob's digest costs no second read (the base's layer, the image's layers, OCI blobs).
pub struct HashingWriter<W: io::Write> {
    pub inner: W,
    pub hasher: Sha256,
    pub size: u64,
}

impl<W: io::Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }
}

impl<W: io::Write> io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_hash_matches_bytes_hash_and_names_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(sha256_file(&path).unwrap(), want);
        assert_eq!(sha256_hex(b"abc"), want);
        let err = sha256_file(&dir.path().join("missing")).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            terminal_safe("NCCL WARN\tplain ünïcode"),
            std::borrow::Cow::Borrowed(_)
        ));
        let hostile = "x\x1b]0;pwned\x07\x1b[2J\r\u{9b}31m";
        let safe = terminal_safe(hostile);
        assert_eq!(safe, "x\\x1b]0;pwned\\x07\\x1b[2J\\r\\u{9b}31m");
        assert!(!safe.chars().any(char::is_control));
    }

    #[test]
    fn capped_names_stay_one_short_line() {
        assert_eq!(terminal_safe_capped("a\nb", 10), "a\\nb");
        let long = format!("{}\n{}", "x".repeat(300), "y".repeat(1 << 20));
        let shown = terminal_safe_capped(&long, SHOWN_NAME_MAX);
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.len() < SHOWN_NAME_MAX + 40, "{}", shown.len());
        assert!(
            shown.ends_with(&format!("... ({} bytes in all)", long.len())),
            "{shown}"
        );
    }
}
