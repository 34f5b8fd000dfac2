//! What the static level reads of one file, computed once from its bytes: the same facts
//! whether the bytes are a file of this machine or a member of an image layer's tar, where
//! they are kept per layer ([`crate::layers`]) so that a layer read once is not read again.
//! The checks ([`crate::static_level`]) judge these facts and never open a file.

use std::path::Path;
use std::sync::Arc;

use commstack_elf::{
    ByteHit, DeviceCode, DottedVersion, DynamicInfo, ElfFile, NvshmemHostInfo, device_code_of,
    looks_like_shared_object, newest_glibc, newest_glibcxx,
};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

/// Bump when what [`file_facts`] records changes: kept facts of another schema are read
/// again, not trusted.
pub const FACTS_SCHEMA: u32 = 2;

/// The file name DeepEP's build writes into its wheel's `.dist-info`.
pub const BUILD_RECORD: &str = "commstack-build.json";

/// Everything the checks need of one file; each part only for the files it applies to.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FileFacts {
    /// A file named like a shared object that starts with the ELF magic: its dynamic
    /// linking facts, or why they cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<Result<LibraryFacts, String>>,
    /// libnvshmem_host*: its build variables and version, and every `libnccl` in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvshmem_host: Option<HostFacts>,
    /// libnccl.so* (by file name or SONAME): the release its version string says
    /// (`NCCL version 2.28.9+cuda13.0`), None when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclFacts>,
    /// libnvshmem_device*: its GPU code and sha256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceFacts>,
    /// `<dist>.dist-info/commstack-build.json`: its text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_record: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LibraryFacts {
    /// DT_SONAME, or the file name when the library has none.
    pub name: String,
    pub dynamic: DynamicInfo,
    /// The newest GLIBC_ and GLIBCXX_ versions it needs; None both when its version
    /// section cannot be read (reported as needing none, as before).
    pub glibc: Option<DottedVersion>,
    pub glibcxx: Option<DottedVersion>,
    #[serde(default)]
    pub versions_readable: bool,
    /// DeepEP's extension only: the libstdc++ internals it defines (a linked-in copy of
    /// libstdc++), or why its symbols cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libstdcxx_internals: Option<Result<Vec<String>, String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostFacts {
    pub info: Result<NvshmemHostInfo, String>,
    pub libnccl: Result<Vec<ByteHit>, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NcclFacts {
    /// `2.28.9`, from the library's own bytes (see `ElfFile::nccl_version`).
    pub version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceFacts {
    pub code: Result<DeviceCode, String>,
    pub sha256: String,
}

/// Whether [`file_facts`] reads anything of a file at `path` (by its name alone, so a
/// walk can skip the rest without reading them).
pub fn wanted(path: &Path) -> bool {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
        return false;
    };
    looks_like_shared_object(&name)
        || name.starts_with("libnvshmem_device")
        || (name == BUILD_RECORD && in_dist_info(path))
}

fn in_dist_info(path: &Path) -> bool {
    path.parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d.to_string_lossy().ends_with(".dist-info"))
}

/// The bytes of one file: `range` of a shared mapping (a layer tar, or the file itself).
pub struct FileBytes {
    pub map: Arc<Mmap>,
    pub range: std::ops::Range<usize>,
}

impl FileBytes {
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// The facts of the file at `path` (as the environment sees it: in the image, or here),
/// from its bytes. None when nothing of it matters to the checks. The bytes come from
/// whoever built the image: a parser that panics on them makes the file unreadable (a
/// failed check naming it), not the build's end.
pub fn file_facts(path: &Path, data: &FileBytes) -> Option<FileFacts> {
    if !wanted(path) {
        return None;
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_facts(path, data)))
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Some(FileFacts {
                library: Some(Err(format!("the ELF reader failed on it: {why}"))),
                ..FileFacts::default()
            })
        })
}

fn read_facts(path: &Path, data: &FileBytes) -> Option<FileFacts> {
    let name = path.file_name()?.to_string_lossy().into_owned();
    let bytes = data.bytes();
    let mut facts = FileFacts::default();
    if looks_like_shared_object(&name) && bytes.starts_with(b"\x7fELF") {
        let elf = ElfFile::from_shared(path, data.map.clone(), data.range.clone());
        facts.library = Some(
            elf.as_ref()
                .map_err(|e| e.to_string())
                .and_then(|elf| library_facts(elf, path, &name)),
        );
        let soname = facts
            .library
            .as_ref()
            .and_then(|l| l.as_ref().ok())
            .map(|l| l.name.as_str());
        if let Ok(elf) = &elf
            && (name.starts_with("libnccl.so")
                || soname.is_some_and(|s| s.starts_with("libnccl.so")))
        {
            facts.nccl = Some(NcclFacts {
                version: elf.nccl_version().map(|(a, b, c)| format!("{a}.{b}.{c}")),
            });
        }
        if name.starts_with("libnvshmem_host")
            || soname.is_some_and(|s| s.starts_with("libnvshmem_host"))
        {
            facts.nvshmem_host = Some(match &elf {
                Ok(elf) => HostFacts {
                    info: elf.nvshmem_host_info().map_err(|e| e.to_string()),
                    libnccl: elf.find_libnccl().map_err(|e| e.to_string()),
                },
                Err(e) => HostFacts {
                    info: Err(e.to_string()),
                    libnccl: Err(e.to_string()),
                },
            });
        }
    }
    if name.starts_with("libnvshmem_device") {
        facts.device = Some(DeviceFacts {
            code: device_code_of(path, bytes).map_err(|e| e.to_string()),
            sha256: commstack_digest::sha256_hex(bytes),
        });
    }
    if name == BUILD_RECORD && in_dist_info(path) {
        facts.build_record = Some(String::from_utf8_lossy(bytes).into_owned());
    }
    Some(facts)
}

/// DeepEP's extension: V1's `deep_ep_cpp*.so` at site-packages' top, V2's `deep_ep/_C*.so`.
pub fn is_deepep_extension(path: &Path) -> bool {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy()) else {
        return false;
    };
    let in_deep_ep = path
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|d| d == "deep_ep");
    name.starts_with("deep_ep_cpp")
        || (in_deep_ep && name.starts_with("_C.") && name.ends_with(".so"))
}

fn library_facts(elf: &ElfFile, path: &Path, file_name: &str) -> Result<LibraryFacts, String> {
    let dynamic = elf.dynamic_info().map_err(|e| e.to_string())?;
    let versions = elf.needed_versions().ok();
    let libstdcxx_internals =
        is_deepep_extension(path).then(|| elf.libstdcxx_internals().map_err(|e| e.to_string()));
    Ok(LibraryFacts {
        libstdcxx_internals,
        name: dynamic
            .soname
            .clone()
            .unwrap_or_else(|| file_name.to_string()),
        glibc: versions.as_deref().and_then(newest_glibc),
        glibcxx: versions.as_deref().and_then(newest_glibcxx),
        versions_readable: versions.is_some(),
        dynamic,
    })
}

/// A file of this machine, mapped whole.
pub fn map_whole(path: &Path) -> std::io::Result<FileBytes> {
    let file = std::fs::File::open(path)?;
    // Safety: read-only; a file truncated under us could fault, the risk every tool that
    // maps libraries (ld.so included) takes.
    let map = unsafe { Mmap::map(&file) }?;
    let len = map.len();
    Ok(FileBytes {
        map: Arc::new(map),
        range: 0..len,
    })
}
