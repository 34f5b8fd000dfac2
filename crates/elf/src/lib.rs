//! commstack-elf: reading the stack's ELF files with goblin: the NVSHMEM build-variable
//! string and version, byte scans (`libnccl`), dynamic linking (DT_NEEDED, SONAME, RPATH
//! and RUNPATH, resolution), symbol versions and manylinux tags, a copy of libstdc++
//! linked in, and the CUDA fatbins in libraries and static archives. The NVSHMEM and DeepEP builds prove their outputs with
//! it, and verify checks whole environments with it; it sits below both in the flow.

mod cxx;
mod dynamic;
mod fatbin;
mod file;
mod nvshmem;
mod scan;
mod symver;
mod tree;

use std::path::PathBuf;

pub use cxx::{LIBSTDCXX_INTERNAL_PREFIXES, is_libstdcxx_internal};
pub use dynamic::{
    DynamicInfo, NeededResolution, expand_origin, resolve_needed, resolve_needed_with,
};
pub use fatbin::{
    DeviceCode, DeviceCodeFormat, FATBIN_MAGIC, FATBIN_SECTIONS, FatbinContainer, FatbinEntry,
    FatbinKind, device_code_of, parse_fatbin_section, read_device_code,
};
pub use file::{ElfFile, FileRange};
pub use nvshmem::{
    BuildVarMismatch, BuildVarsCheck, NvshmemBuildVars, NvshmemHostInfo, NvshmemVersion, USE_NCCL,
    cmake_bool, find_build_vars, find_vendor_version,
};
pub use scan::{ByteHit, nccl_version_in};
pub use symver::{
    DottedVersion, ManylinuxTag, NeededVersion, manylinux_tag, newest_glibc, newest_glibcxx,
    newest_version,
};
pub use tree::{
    LibraryTree, SonameCopies, TreeLibrary, Unresolved, looks_like_shared_object, scan_tree,
};

/// Why a file could not be read as the library it should be. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a readable {what}: {source}", path.display())]
    Parse {
        path: PathBuf,
        what: String,
        source: goblin::error::Error,
    },
    #[error("{}: {why}", path.display())]
    Content { path: PathBuf, why: String },
}
