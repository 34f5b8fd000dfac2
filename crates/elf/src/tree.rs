//! Every shared object under a directory (a venv's site-packages, an install prefix):
//! how many copies of each soname it holds, and which DT_NEEDED entries ld.so would not
//! find.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use walkdir::WalkDir;

use super::dynamic::{DynamicInfo, resolve_needed_with};
use super::{ElfError, ElfFile};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TreeLibrary {
    pub path: PathBuf,
    /// DT_SONAME, or the file name when the library has none.
    pub name: String,
    pub dynamic: DynamicInfo,
}

#[derive(Debug, Clone, Serialize)]
pub struct LibraryTree {
    pub root: PathBuf,
    /// One entry per file: symbolic links and hard links to a file already seen are not
    /// copies and are left out.
    pub libraries: Vec<TreeLibrary>,
    /// Files named like shared objects that start with the ELF magic but do not parse.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// How many files in the tree carry one soname, when that is not exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SonameCopies {
    pub soname: String,
    pub paths: Vec<PathBuf>,
}

/// A DT_NEEDED entry ld.so would not find from this library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unresolved {
    pub library: PathBuf,
    pub needed: String,
    /// Files of that name elsewhere in the tree: used only if something loaded them first.
    pub elsewhere_in_tree: Vec<PathBuf>,
}

/// `libfoo.so`, `libfoo.so.3`, `libfoo.so.3.4.5`, `nvshmem_bootstrap_uid.so.3`.
pub fn looks_like_shared_object(name: &str) -> bool {
    name.ends_with(".so") || name.contains(".so.")
}

/// Walks `root` (not following symbolic links) and reads every shared object in it.
pub fn scan_tree(root: &Path) -> Result<LibraryTree, ElfError> {
    let mut seen_inodes = std::collections::HashSet::new();
    let mut libraries = Vec::new();
    let mut unreadable = Vec::new();
    for entry in WalkDir::new(root).follow_links(false).sort_by_file_name() {
        let entry = entry.map_err(|e| ElfError::Io {
            path: e.path().unwrap_or(root).to_path_buf(),
            source: e
                .into_io_error()
                .unwrap_or_else(|| std::io::Error::other("directory loop")),
        })?;
        if !entry.file_type().is_file()
            || !looks_like_shared_object(&entry.file_name().to_string_lossy())
        {
            continue;
        }
        let path = entry.path();
        let io = |source| ElfError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = entry.metadata().map_err(|e| {
            io(e.into_io_error()
                .unwrap_or_else(|| std::io::Error::other("metadata")))
        })?;
        if !seen_inodes.insert((meta.dev(), meta.ino()))
            || !starts_with_elf_magic(path).map_err(io)?
        {
            continue;
        }
        match ElfFile::open(path).and_then(|f| f.dynamic_info()) {
            Ok(dynamic) => {
                let name = dynamic
                    .soname
                    .clone()
                    .unwrap_or_else(|| entry.file_name().to_string_lossy().into_owned());
                libraries.push(TreeLibrary {
                    path: path.to_path_buf(),
                    name,
                    dynamic,
                });
            }
            Err(e) => unreadable.push((path.to_path_buf(), e.to_string())),
        }
    }
    Ok(LibraryTree {
        root: root.to_path_buf(),
        libraries,
        unreadable,
    })
}

fn starts_with_elf_magic(path: &Path) -> std::io::Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path)?;
    Ok(file.read(&mut magic)? == 4 && &magic == b"\x7fELF")
}

impl LibraryTree {
    /// Every file whose soname (or file name) is `soname`.
    pub fn copies(&self, soname: &str) -> Vec<&TreeLibrary> {
        self.libraries.iter().filter(|l| l.name == soname).collect()
    }

    /// The sonames in `shipped` that the tree holds zero times or more than once. Empty
    /// when each is there exactly once.
    pub fn not_exactly_one(&self, shipped: &[String]) -> Vec<SonameCopies> {
        shipped
            .iter()
            .map(|s| SonameCopies {
                soname: s.clone(),
                paths: self.copies(s).iter().map(|l| l.path.clone()).collect(),
            })
            .filter(|c| c.paths.len() != 1)
            .collect()
    }

    /// Every soname that more than one file of the tree carries.
    pub fn duplicates(&self) -> Vec<SonameCopies> {
        let mut by_name: BTreeMap<&str, Vec<PathBuf>> = BTreeMap::new();
        for l in &self.libraries {
            by_name.entry(&l.name).or_default().push(l.path.clone());
        }
        by_name
            .into_iter()
            .filter(|(_, p)| p.len() > 1)
            .map(|(s, paths)| SonameCopies {
                soname: s.to_string(),
                paths,
            })
            .collect()
    }

    /// DT_NEEDED entries of every library that neither its own RPATH/RUNPATH nor
    /// `search_dirs` (the target's system library directories) resolve, leaving out
    /// `host_provided` sonames (libcuda.so.1 comes with the driver, not the stack).
    pub fn unresolved(&self, search_dirs: &[PathBuf], host_provided: &[String]) -> Vec<Unresolved> {
        self.unresolved_with(search_dirs, host_provided, &|p| p.is_file())
    }

    /// [`LibraryTree::unresolved`] where the tree is not this machine's: `is_file` says
    /// whether a path is a file there, following symbolic links.
    pub fn unresolved_with(
        &self,
        search_dirs: &[PathBuf],
        host_provided: &[String],
        is_file: &dyn Fn(&Path) -> bool,
    ) -> Vec<Unresolved> {
        let mut out = Vec::new();
        for lib in &self.libraries {
            for r in resolve_needed_with(&lib.path, &lib.dynamic, search_dirs, is_file) {
                if r.found.is_some() || host_provided.contains(&r.needed) {
                    continue;
                }
                let elsewhere = self
                    .copies(&r.needed)
                    .iter()
                    .map(|l| l.path.clone())
                    .collect();
                out.push(Unresolved {
                    library: lib.path.clone(),
                    needed: r.needed,
                    elsewhere_in_tree: elsewhere,
                });
            }
        }
        out
    }
}
