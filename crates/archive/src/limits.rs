//! What an archive may cost, fixed before the first byte is written (docs/bounds.md):
//! bytes of content (absolute, as a ratio to the archive's own size, and against the free
//! space of the destination's filesystem), bytes of the decompressed stream, entries,
//! name length and path depth. [`Meter`] enforces the stream bounds in the reader itself,
//! so no header (a GNU long name, a pax record) can be read whole into memory.

use std::cell::Cell;
use std::ffi::CString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result};

/// How much an archive may write and read before it is refused as a decompression bomb or
/// a denial of service. Every bound is checked before the work it bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of file content, whatever the archive's size.
    pub max_bytes: u64,
    /// Bytes the archive may expand to (its decompressed tar stream, headers included, or
    /// its zip entries' content) per byte of its own size...
    pub max_ratio: u64,
    /// ...but never fewer than this many: a small archive of text legitimately expands
    /// more than `max_ratio` times.
    pub min_expansion: u64,
    /// Paths: entries, and the directories their paths imply.
    pub max_entries: u64,
    /// Bytes in an entry's path or a link's target (Linux's PATH_MAX).
    pub max_name: usize,
    /// Components in an entry's path or a link's target.
    pub max_depth: usize,
    /// Bytes left free on the destination's filesystem once everything is written.
    pub min_free: u64,
}

impl Default for Limits {
    /// Far above anything commstack unpacks: the largest wheels are a few GiB and expand
    /// about 2x, source tarballs about 5x; git archives nest fewer than 30 directories.
    fn default() -> Limits {
        Limits {
            max_bytes: 16 << 30,
            max_ratio: 100,
            min_expansion: 64 << 20,
            max_entries: 1_000_000,
            max_name: 4096,
            max_depth: 128,
            min_free: 512 << 20,
        }
    }
}

/// The bytes one unpack may cost, from [`Limits`], the archive's size and the free space.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    /// Bytes of file content the archive may write...
    pub content: u64,
    /// ...and which bound set that number, in words, for the refusal.
    pub content_bound: String,
    /// Bytes the archive may expand to (tar: the decompressed stream).
    pub expansion: u64,
    pub expansion_bound: String,
}

impl Budget {
    /// For `archive` unpacked under `dir` (a directory on the destination's filesystem).
    pub fn new(limits: &Limits, archive: &Path, dir: &Path) -> Result<Budget> {
        let size = std::fs::metadata(archive)
            .with_context(|| format!("cannot read the size of {}", archive.display()))?
            .len();
        let by_ratio = size.saturating_mul(limits.max_ratio);
        let expansion = by_ratio.max(limits.min_expansion);
        let expansion_bound = format!(
            "{} times the archive's {size} bytes (Limits::max_ratio), at least {} bytes \
             (Limits::min_expansion)",
            limits.max_ratio, limits.min_expansion
        );
        let free = free_bytes(dir)?;
        let room = free.saturating_sub(limits.min_free);
        let (content, content_bound) = if room < expansion.min(limits.max_bytes) {
            let bound = format!(
                "the free space of {}: {free} bytes available, {} of them kept free \
                 (Limits::min_free); free disk space (`cargo xtask store gc`, `cargo xtask \
                 cache gc`) or point COMMSTACK_HOME at a larger disk",
                dir.display(),
                limits.min_free
            );
            (room, bound)
        } else if limits.max_bytes < expansion {
            let bound = format!("Limits::max_bytes ({} bytes)", limits.max_bytes);
            (limits.max_bytes, bound)
        } else {
            (expansion, expansion_bound.clone())
        };
        Ok(Budget {
            content,
            content_bound,
            expansion,
            expansion_bound,
        })
    }
}

/// Bytes available to an unprivileged writer on the filesystem holding `dir` (statvfs).
fn free_bytes(dir: &Path) -> Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .with_context(|| format!("{} has a NUL byte", dir.display()))?;
    // SAFETY: a zeroed statvfs is a valid value, and `c` is NUL-terminated.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut stat) } != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("cannot read the free space of {}", dir.display()));
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    Ok((stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64))
}

/// Bytes the tar reader may read for one entry's headers: its own and those before it
/// (a GNU long name and long link, each at most `max_name` bytes; a pax extended header;
/// GNU sparse maps), and the padding of the entry before.
pub(crate) fn header_allowance(limits: &Limits) -> u64 {
    let name_blocks = (limits.max_name as u64 + 1).div_ceil(512) * 512;
    8 * 512 + 2 * name_blocks + PAX_MAX + SPARSE_MAP_MAX
}

/// A pax extended header's records: paths and link targets (bounded by `max_name`), times,
/// owners and a few attributes; 64 KiB is many times what they take.
const PAX_MAX: u64 = 64 << 10;
/// GNU sparse maps: 21 regions per 512-byte block; 256 KiB holds about 10,000 regions.
const SPARSE_MAP_MAX: u64 = 256 << 10;

/// Which bound stopped a [`Meter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The whole decompressed stream.
    Stream,
    /// One entry's headers ([`header_allowance`]).
    Headers,
}

/// What a [`Meter`] and its unpacker share: bytes read so far, and where reading stops.
#[derive(Debug)]
pub(crate) struct MeterState {
    read: Cell<u64>,
    stream_max: u64,
    headers_end: Cell<u64>,
    stopped: Cell<Option<Stop>>,
}

impl MeterState {
    pub fn new(stream_max: u64) -> Rc<MeterState> {
        Rc::new(MeterState {
            read: Cell::new(0),
            stream_max,
            headers_end: Cell::new(u64::MAX),
            stopped: Cell::new(None),
        })
    }

    /// From here, at most `allowance` bytes until [`MeterState::content`].
    pub fn headers(&self, allowance: u64) {
        self.headers_end
            .set(self.read.get().saturating_add(allowance));
    }

    /// From here, the stream bound alone.
    pub fn content(&self) {
        self.headers_end.set(u64::MAX);
    }

    /// The bound that ended reading, if one did.
    pub fn stopped(&self) -> Option<Stop> {
        self.stopped.get()
    }
}

/// A reader that refuses to read past the bounds in its [`MeterState`]: an error, not an
/// end of file, so a bound reached is never taken for a short archive.
pub(crate) struct Meter<R> {
    pub inner: R,
    pub state: Rc<MeterState>,
}

impl<R: Read> Read for Meter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let s = &self.state;
        let end = s.headers_end.get().min(s.stream_max);
        let left = end.saturating_sub(s.read.get());
        if left == 0 && !buf.is_empty() {
            let stop = match s.headers_end.get() < s.stream_max {
                true => Stop::Headers,
                false => Stop::Stream,
            };
            s.stopped.set(Some(stop));
            return Err(io::Error::other(format!("a bound was reached: {stop:?}")));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        s.read.set(s.read.get() + n as u64);
        Ok(n)
    }
}

/// The directory whose filesystem a destination's bytes land on: its parent.
pub(crate) fn parent_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}
