//! A writer that hashes what passes through it: the layer's diff_id costs no second read.
//! (The same few lines as commstack-image's: that crate is a later layer.)

use std::io::Write;

use sha2::{Digest, Sha256};

/// Hashes and counts what it writes.
pub(crate) struct HashingWriter<W: Write> {
    pub(crate) inner: W,
    pub(crate) hasher: Sha256,
    pub(crate) size: u64,
}

impl<W: Write> HashingWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }
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
