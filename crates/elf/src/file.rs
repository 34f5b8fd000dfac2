//! One ELF file, memory-mapped: torch's libraries reach a gigabyte, and most checks read
//! only the headers, so the file is mapped rather than read.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use goblin::elf::Elf;
use goblin::elf::section_header::SHT_NOBITS;
use memmap2::Mmap;

use super::ElfError;

pub struct ElfFile {
    path: PathBuf,
    map: Bytes,
}

/// A file's bytes: mapped on its own, or a range of a mapping shared with other files (a
/// member of an image layer's tar, read without copying it out).
enum Bytes {
    Own(Mmap),
    Shared(Arc<Mmap>, Range<usize>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Own(m) => m,
            Bytes::Shared(m, r) => &m[r.clone()],
        }
    }
}

/// A named byte range of the file: a section or a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    pub name: String,
    pub offset: u64,
    pub size: u64,
}

impl ElfFile {
    /// Maps `path` and checks that it parses as ELF.
    pub fn open(path: &Path) -> Result<ElfFile, ElfError> {
        let map = map_file(path)?;
        let elf = ElfFile {
            path: path.to_path_buf(),
            map: Bytes::Own(map),
        };
        elf.parse()?;
        Ok(elf)
    }

    /// The file whose bytes are `range` of `map` (shown as `path` in errors), checked to
    /// parse as ELF. Fails when the range is outside the mapping.
    pub fn from_shared(
        path: &Path,
        map: Arc<Mmap>,
        range: Range<usize>,
    ) -> Result<ElfFile, ElfError> {
        if map.get(range.clone()).is_none() {
            return Err(ElfError::Content {
                path: path.to_path_buf(),
                why: format!(
                    "bytes {}..{} are outside the {}-byte mapping",
                    range.start,
                    range.end,
                    map.len()
                ),
            });
        }
        let elf = ElfFile {
            path: path.to_path_buf(),
            map: Bytes::Shared(map, range),
        };
        elf.parse()?;
        Ok(elf)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Parses the headers again (cheap: goblin reads symbol tables lazily).
    pub fn parse(&self) -> Result<Elf<'_>, ElfError> {
        Elf::parse(&self.map).map_err(|source| ElfError::Parse {
            path: self.path.clone(),
            what: "ELF headers".into(),
            source,
        })
    }

    /// Every section that occupies bytes in the file, with its name.
    pub fn sections(&self) -> Result<Vec<FileRange>, ElfError> {
        let elf = self.parse()?;
        Ok(file_sections(&elf))
    }

    /// Every loadable or otherwise file-backed segment, named `PT_LOAD[3]` and so on.
    pub fn segments(&self) -> Result<Vec<FileRange>, ElfError> {
        let elf = self.parse()?;
        Ok(elf
            .program_headers
            .iter()
            .enumerate()
            .filter(|(_, ph)| ph.p_filesz > 0)
            .map(|(i, ph)| FileRange {
                name: format!("{}[{i}]", goblin::elf::program_header::pt_to_str(ph.p_type)),
                offset: ph.p_offset,
                size: ph.p_filesz,
            })
            .collect())
    }
}

/// Maps any file read-only.
pub(crate) fn map_file(path: &Path) -> Result<Mmap, ElfError> {
    let io = |source| ElfError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    // Safety: the mapping is read-only; a file truncated under us could fault, which is
    // the same risk every tool that maps libraries (ld.so included) takes.
    unsafe { Mmap::map(&file) }.map_err(io)
}

pub(crate) fn file_sections(elf: &Elf<'_>) -> Vec<FileRange> {
    elf.section_headers
        .iter()
        .filter(|sh| sh.sh_type != SHT_NOBITS && sh.sh_size > 0)
        .map(|sh| FileRange {
            name: elf
                .shdr_strtab
                .get_at(sh.sh_name)
                .unwrap_or("?")
                .to_string(),
            offset: sh.sh_offset,
            size: sh.sh_size,
        })
        .collect()
}

/// The bytes of a named section, if the file has it; for data held in memory (archive
/// members), not only mapped files.
pub(crate) fn section_bytes<'a>(elf: &Elf<'_>, bytes: &'a [u8], name: &str) -> Vec<&'a [u8]> {
    elf.section_headers
        .iter()
        .filter(|sh| sh.sh_type != SHT_NOBITS)
        .filter(|sh| elf.shdr_strtab.get_at(sh.sh_name) == Some(name))
        .filter_map(|sh| {
            let start = usize::try_from(sh.sh_offset).ok()?;
            let end = start.checked_add(usize::try_from(sh.sh_size).ok()?)?;
            bytes.get(start..end)
        })
        .collect()
}
