//! The GPU code inside a library: CUDA fatbin containers in `.nv_fatbin` (linked
//! device code) and `__nv_relfatbin` (relocatable device code, `-rdc`) sections, of a
//! shared object or of each object in a static archive (libnvshmem_device.a).
//!
//! Only headers are read, never payloads (which are compressed): the container header is
//! `u32 magic = 0xBA55ED50, u16 version, u16 header_size, u64 size`, followed by `size`
//! bytes of entries, each `u16 kind (1 = PTX, 2 = ELF cubin), u16 version, u32
//! header_size, u64 payload_size, u32 compressed_size, u32 options_offset, u16 minor, u16
//! major, u32 arch (90 = sm_90), u32 name_offset, u32 name_len, u64 flags, u64 zero, u64
//! uncompressed_size` (64 bytes; PTX and newer cubins have longer headers) and its
//! payload. A section holds one or more containers back to back, zero-padded.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use goblin::archive::Archive;
use goblin::elf::Elf;
use serde::{Deserialize, Serialize};

use super::ElfError;
use super::file::{map_file, section_bytes};

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Sections that hold fatbin containers.
pub const FATBIN_SECTIONS: [&str; 2] = [".nv_fatbin", "__nv_relfatbin"];
const CONTAINER_HEADER: usize = 16;
const ENTRY_HEADER_MIN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FatbinKind {
    Ptx,
    Cubin,
    Other(u16),
}

/// One entry of a container: a cubin (SASS) or PTX for one architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FatbinEntry {
    pub kind: FatbinKind,
    /// `90` for sm_90 / compute_90.
    pub arch: u32,
    pub flags: u64,
    pub payload_size: u64,
}

/// One container and where it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FatbinContainer {
    /// The archive member holding it, for static archives.
    pub member: Option<String>,
    pub section: String,
    pub entries: Vec<FatbinEntry>,
}

/// Parses every container of one fatbin section's bytes.
pub fn parse_fatbin_section(bytes: &[u8]) -> Result<Vec<Vec<FatbinEntry>>, String> {
    let mut containers = Vec::new();
    let mut p = 0;
    loop {
        // Containers are aligned; the gaps are zeros.
        while p < bytes.len() && bytes[p] == 0 {
            p += 1;
        }
        if p >= bytes.len() {
            return Ok(containers);
        }
        let header = bytes
            .get(p..p + CONTAINER_HEADER)
            .ok_or_else(|| format!("truncated fatbin header at offset {p:#x}"))?;
        let magic = u32_at(header, 0);
        if magic != FATBIN_MAGIC {
            return Err(format!(
                "no fatbin magic at offset {p:#x} (found {magic:#010x}, expected {FATBIN_MAGIC:#010x})"
            ));
        }
        let header_size = u16_at(header, 6) as usize;
        let size = usize::try_from(u64_at(header, 8))
            .map_err(|_| format!("fatbin size overflows at {p:#x}"))?;
        let start = p
            .checked_add(header_size.max(CONTAINER_HEADER))
            .ok_or("fatbin offset overflow")?;
        let end = start
            .checked_add(size)
            .filter(|&e| e <= bytes.len())
            .ok_or_else(|| {
                format!(
                    "fatbin at {p:#x} claims {size} bytes, past the end of its section ({} bytes)",
                    bytes.len()
                )
            })?;
        containers.push(parse_entries(&bytes[start..end], start)?);
        p = end;
    }
}

fn parse_entries(bytes: &[u8], base: usize) -> Result<Vec<FatbinEntry>, String> {
    let mut entries = Vec::new();
    let mut q = 0;
    while q < bytes.len() {
        let at = base + q;
        let h = bytes
            .get(q..q + ENTRY_HEADER_MIN)
            .ok_or_else(|| format!("truncated fatbin entry header at offset {at:#x}"))?;
        let header_size = u32_at(h, 4) as usize;
        let payload_size = u64_at(h, 8);
        if header_size < ENTRY_HEADER_MIN {
            return Err(format!(
                "fatbin entry at {at:#x} has a {header_size}-byte header (at least 64 expected)"
            ));
        }
        let next = usize::try_from(payload_size)
            .ok()
            .and_then(|s| q.checked_add(header_size)?.checked_add(s))
            .filter(|&n| n <= bytes.len())
            .ok_or_else(|| format!("fatbin entry at {at:#x} runs past its container"))?;
        let kind = match u16_at(h, 0) {
            1 => FatbinKind::Ptx,
            2 => FatbinKind::Cubin,
            k => FatbinKind::Other(k),
        };
        entries.push(FatbinEntry {
            kind,
            arch: u32_at(h, 28),
            flags: u64_at(h, 40),
            payload_size,
        });
        q = next;
    }
    Ok(entries)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceCodeFormat {
    /// A shared object or object file.
    Elf,
    /// A static archive of objects (`ar`).
    Archive,
    /// LLVM bitcode (libnvshmem_device.bc): device IR, no SASS by construction.
    LlvmBitcode,
}

/// The GPU code of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCode {
    pub path: PathBuf,
    pub format: DeviceCodeFormat,
    pub containers: Vec<FatbinContainer>,
    /// For bitcode: whether it targets `nvptx64-nvidia-cuda`.
    pub nvptx_bitcode: bool,
}

impl DeviceCode {
    /// The SASS (cubin) architectures, `90` for sm_90.
    pub fn sass_archs(&self) -> BTreeSet<u32> {
        self.archs(FatbinKind::Cubin)
    }

    /// The PTX architectures, `120` for compute_120.
    pub fn ptx_archs(&self) -> BTreeSet<u32> {
        self.archs(FatbinKind::Ptx)
    }

    fn archs(&self, kind: FatbinKind) -> BTreeSet<u32> {
        self.containers
            .iter()
            .flat_map(|c| &c.entries)
            .filter(|e| e.kind == kind)
            .map(|e| e.arch)
            .collect()
    }
}

/// Reads the fatbin containers of a shared object, object file or static archive, or
/// recognises LLVM bitcode.
pub fn read_device_code(path: &Path) -> Result<DeviceCode, ElfError> {
    let map = map_file(path)?;
    device_code_of(path, &map)
}

/// [`read_device_code`] of bytes already in memory (`path` names them in errors).
pub fn device_code_of(path: &Path, bytes: &[u8]) -> Result<DeviceCode, ElfError> {
    let content = |why: String| ElfError::Content {
        path: path.to_path_buf(),
        why,
    };
    let code = |format, containers, nvptx_bitcode| DeviceCode {
        path: path.to_path_buf(),
        format,
        containers,
        nvptx_bitcode,
    };
    if bytes.starts_with(b"\x7fELF") {
        let elf = Elf::parse(bytes).map_err(|source| ElfError::Parse {
            path: path.to_path_buf(),
            what: "ELF headers".into(),
            source,
        })?;
        let containers = containers_of(&elf, bytes, None).map_err(content)?;
        Ok(code(DeviceCodeFormat::Elf, containers, false))
    } else if bytes.starts_with(b"!<arch>\n") {
        let archive = Archive::parse(bytes).map_err(|source| ElfError::Parse {
            path: path.to_path_buf(),
            what: "ar archive".into(),
            source,
        })?;
        let mut containers = Vec::new();
        for name in archive.members() {
            let data = archive
                .extract(name, bytes)
                .map_err(|source| ElfError::Parse {
                    path: path.to_path_buf(),
                    what: format!("archive member {name}"),
                    source,
                })?;
            if !data.starts_with(b"\x7fELF") {
                continue;
            }
            let elf = Elf::parse(data).map_err(|source| ElfError::Parse {
                path: path.to_path_buf(),
                what: format!("archive member {name}"),
                source,
            })?;
            containers.extend(containers_of(&elf, data, Some(name)).map_err(content)?);
        }
        Ok(code(DeviceCodeFormat::Archive, containers, false))
    } else if bytes.starts_with(b"BC\xc0\xde") || bytes.starts_with(&0x0B17_C0DEu32.to_le_bytes()) {
        let nvptx = memchr::memmem::find(bytes, b"nvptx64-nvidia-cuda").is_some();
        Ok(code(DeviceCodeFormat::LlvmBitcode, Vec::new(), nvptx))
    } else {
        Err(content(
            "neither ELF, an ar archive nor LLVM bitcode: no device code to read".into(),
        ))
    }
}

fn containers_of(
    elf: &Elf<'_>,
    bytes: &[u8],
    member: Option<&str>,
) -> Result<Vec<FatbinContainer>, String> {
    let mut out = Vec::new();
    for section in FATBIN_SECTIONS {
        for data in section_bytes(elf, bytes, section) {
            let parsed = parse_fatbin_section(data).map_err(|e| match member {
                Some(m) => format!("{m}: {section}: {e}"),
                None => format!("{section}: {e}"),
            })?;
            out.extend(parsed.into_iter().map(|entries| FatbinContainer {
                member: member.map(str::to_string),
                section: section.to_string(),
                entries,
            }));
        }
    }
    Ok(out)
}
