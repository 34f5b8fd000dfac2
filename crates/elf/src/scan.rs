//! Byte scans over the whole file. NVIDIA's NCCL-on libnvshmem_host has no DT_NEEDED on
//! NCCL: it dlopens `libnccl.so.2` by a string in .rodata, so only a scan of every byte
//! proves a library cannot load NCCL by name.

use memchr::memmem;
use serde::{Deserialize, Serialize};

use super::file::FileRange;
use super::{ElfError, ElfFile};

/// One place a needle was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteHit {
    /// File offset of the first byte of the needle.
    pub offset: u64,
    /// The section holding it (`.rodata`), if any section does.
    pub section: Option<String>,
    /// The segments holding it (`PT_LOAD[2]`); empty for data no segment maps.
    pub segments: Vec<String>,
    /// The printable C string around the hit (at most 200 bytes), to show what it is.
    pub context: String,
}

impl ElfFile {
    /// Every occurrence of `needle` anywhere in the file (all sections and segments, and
    /// bytes outside both), each located.
    pub fn find_bytes(&self, needle: &[u8]) -> Result<Vec<ByteHit>, ElfError> {
        let sections = self.sections()?;
        let segments = self.segments()?;
        let bytes = self.bytes();
        Ok(memmem::find_iter(bytes, needle)
            .map(|at| {
                let off = at as u64;
                let inside =
                    |r: &&FileRange| off >= r.offset && off < r.offset.saturating_add(r.size);
                ByteHit {
                    offset: off,
                    section: sections.iter().find(inside).map(|r| r.name.clone()),
                    segments: segments
                        .iter()
                        .filter(inside)
                        .map(|r| r.name.clone())
                        .collect(),
                    context: c_string_around(bytes, at, 200),
                }
            })
            .collect())
    }

    /// Every `libnccl` in the file: a library built with `NVSHMEM_USE_NCCL=OFF` has none.
    pub fn find_libnccl(&self) -> Result<Vec<ByteHit>, ElfError> {
        self.find_bytes(b"libnccl")
    }

    /// The release of an NCCL library, read from the version string NCCL compiles into
    /// its .rodata and prints at init (`NCCL version 2.28.9+cuda13.0`, the string beside
    /// `ncclGetVersion`'s code): the file's own word, whatever package put it there.
    /// None when the file has no such string (not an NCCL, or one built without it).
    pub fn nccl_version(&self) -> Option<(u32, u32, u32)> {
        nccl_version_in(self.bytes())
    }
}

/// The first `NCCL version X.Y.Z` in `bytes` followed by `+`, a space or NUL (NCCL's
/// `NCCL version 2.28.9+cuda13.0` and `NCCL version 2.28.9 compiled with CUDA 13.0`).
pub fn nccl_version_in(bytes: &[u8]) -> Option<(u32, u32, u32)> {
    const NEEDLE: &[u8] = b"NCCL version ";
    memmem::find_iter(bytes, NEEDLE).find_map(|at| {
        let rest = &bytes[at + NEEDLE.len()..];
        let end = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(rest.len());
        if !matches!(rest.get(end), Some(b'+' | b' ' | 0)) {
            return None;
        }
        let text = std::str::from_utf8(&rest[..end]).ok()?;
        let mut parts = text.split('.').map(|p| p.parse::<u32>().ok());
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Some(a)), Some(Some(b)), Some(Some(c)), None) => Some((a, b, c)),
            _ => None,
        }
    })
}

/// The NUL-delimited run of bytes around `at`, lossily decoded, cut to `max` bytes
/// around the hit.
pub(crate) fn c_string_around(bytes: &[u8], at: usize, max: usize) -> String {
    let start = bytes[..at]
        .iter()
        .rposition(|&b| b == 0)
        .map_or(0, |p| p + 1)
        .max(at.saturating_sub(max / 2));
    let end = bytes[at..]
        .iter()
        .position(|&b| b == 0)
        .map_or(bytes.len(), |p| at + p)
        .min(at + max / 2);
    String::from_utf8_lossy(&bytes[start..end])
        .chars()
        .map(|c| if c.is_control() { '.' } else { c })
        .collect()
}

#[cfg(test)]
mod nccl_version_tests {
    use super::nccl_version_in;

    #[test]
    fn reads_the_version_string_nccl_prints() {
        // As in nvidia-nccl-cu13 2.28.9's libnccl.so.2 (.rodata, offset 2116665), after
        // a format string that mentions the version without one.
        let rodata = b"NCCL version detected : rank %d version %d\0workFifoBytes %d\0NCCL version 2.28.9+cuda13.0\0";
        assert_eq!(nccl_version_in(rodata), Some((2, 28, 9)));
        assert_eq!(
            nccl_version_in(b"\0NCCL version 2.30.7 compiled with CUDA 13.0\n"),
            Some((2, 30, 7))
        );
        assert_eq!(nccl_version_in(b"NCCL version %s\0"), None);
        assert_eq!(nccl_version_in(b"no nccl here"), None);
    }
}
