//! /proc/<pid>/maps: which files a process has mapped, and which of them are the
//! libraries the stack cares about.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// One file mapped into the process (however many ranges map it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MappedFile {
    pub path: PathBuf,
    /// `major:minor` of the device holding it.
    pub dev: String,
    pub inode: u64,
    /// The file was deleted or replaced after it was mapped (`(deleted)`).
    pub deleted: bool,
}

/// The distinct files of a maps listing, in order of first appearance. Two paths to one
/// inode (a hard link) are one file; anonymous and special mappings are left out.
pub fn mapped_files(maps: &str) -> Vec<MappedFile> {
    let mut files: Vec<MappedFile> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode [path]; the path may hold spaces.
        let mut rest = line;
        let mut fields = Vec::with_capacity(5);
        for _ in 0..5 {
            let trimmed = rest.trim_start();
            let end = trimmed.find(char::is_whitespace).unwrap_or(trimmed.len());
            fields.push(&trimmed[..end]);
            rest = &trimmed[end..];
        }
        let path = rest.trim_start();
        if !path.starts_with('/') {
            continue;
        }
        let (path, deleted) = match path.strip_suffix(" (deleted)") {
            Some(p) => (p, true),
            None => (path, false),
        };
        let inode: u64 = fields[4].parse().unwrap_or(0);
        let dev = fields[3].to_string();
        let same = |f: &MappedFile| {
            (inode != 0 && f.inode == inode && f.dev == dev) || f.path == Path::new(path)
        };
        if !files.iter().any(same) {
            files.push(MappedFile {
                path: PathBuf::from(path),
                dev,
                inode,
                deleted,
            });
        }
    }
    files
}

/// The libraries the runtime checks look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    NvshmemHost,
    NvshmemDevice,
    /// NVSHMEM's bootstrap and transport plugins (nvshmem_bootstrap_uid.so.3, ...).
    NvshmemPlugin,
    Nccl,
    Cudart,
}

/// The role of a mapped file, from its name. NCCL's net plugins (`libnccl-net*.so`) are
/// not NCCL.
pub fn role_of(path: &Path) -> Option<Role> {
    let name = path.file_name()?.to_str()?;
    let versioned =
        |stem: &str| name == stem || name.strip_prefix(stem).is_some_and(|r| r.starts_with('.'));
    if name.starts_with("libnvshmem_host") {
        Some(Role::NvshmemHost)
    } else if name.starts_with("libnvshmem_device") {
        Some(Role::NvshmemDevice)
    } else if name.starts_with("nvshmem_bootstrap_") || name.starts_with("nvshmem_transport_") {
        Some(Role::NvshmemPlugin)
    } else if versioned("libnccl.so") {
        Some(Role::Nccl)
    } else if versioned("libcudart.so") {
        Some(Role::Cudart)
    } else {
        None
    }
}
