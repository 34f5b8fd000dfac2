//! A writer that hashes what passes through it: blobs get their digest in one pass.

use std::io::Write;

use sha2::{Digest, Sha256};

/// Hashes what it writes, so a layer's diff_id or a blob's digest costs no second read.
pub(crate) struct HashingWriter<W: Write> {
    pub(crate) inner: W,
    pub(crate) hasher: Sha256,
    pub(crate) size: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
