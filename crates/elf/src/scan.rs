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
