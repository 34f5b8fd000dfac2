//! DT_NEEDED, SONAME, RPATH/RUNPATH and resolving each needed library the way ld.so
//! would, against the library's own search path and a set of directories given.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{ElfError, ElfFile};

/// The dynamic-linking facts of one shared object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicInfo {
    /// DT_NEEDED entries, in order.
    pub needed: Vec<String>,
    pub soname: Option<String>,
    /// DT_RPATH entries (colon-split), unexpanded.
    pub rpath: Vec<String>,
    /// DT_RUNPATH entries (colon-split), unexpanded.
    pub runpath: Vec<String>,
}

impl ElfFile {
    pub fn dynamic_info(&self) -> Result<DynamicInfo, ElfError> {
        let elf = self.parse()?;
        let split = |entries: &[&str]| -> Vec<String> {
            entries
                .iter()
                .flat_map(|e| e.split(':'))
                .filter(|e| !e.is_empty())
                .map(str::to_string)
                .collect()
        };
        Ok(DynamicInfo {
            needed: elf.libraries.iter().map(|s| s.to_string()).collect(),
            soname: elf.soname.map(str::to_string),
            rpath: split(&elf.rpaths),
            runpath: split(&elf.runpaths),
        })
    }
}

impl DynamicInfo {
    /// The directories this object itself adds to the search, `$ORIGIN` expanded against
    /// `origin` (the directory holding the object). ld.so ignores DT_RPATH when DT_RUNPATH
    /// is present; so does this.
    pub fn own_search_dirs(&self, origin: &Path) -> Vec<PathBuf> {
        let entries = if self.runpath.is_empty() {
            &self.rpath
        } else {
            &self.runpath
        };
        entries.iter().map(|e| expand_origin(e, origin)).collect()
    }
}

/// Expands `$ORIGIN` and `${ORIGIN}` in one RPATH/RUNPATH entry. `$LIB` and `$PLATFORM`
/// are left as they are (no library of the stack uses them; an entry holding them will
/// simply not resolve, and say so).
pub fn expand_origin(entry: &str, origin: &Path) -> PathBuf {
    let origin = origin.to_string_lossy();
    PathBuf::from(
        entry
            .replace("${ORIGIN}", &origin)
            .replace("$ORIGIN", &origin),
    )
}

/// Where one DT_NEEDED entry was found, or that it was not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NeededResolution {
    pub needed: String,
    /// The file that would be loaded; `None` when no directory holds it.
    pub found: Option<PathBuf>,
    /// Which search produced it: `rpath`, `runpath` or `search-dirs`.
    pub via: Option<&'static str>,
}

/// Resolves every DT_NEEDED entry of `library`: first its own RPATH/RUNPATH (`$ORIGIN`
/// = its directory), then `search_dirs` in order (e.g. the tree's library directories,
/// then the target's system directories). A name containing `/` is taken as a path.
pub fn resolve_needed(
    library: &Path,
    info: &DynamicInfo,
    search_dirs: &[PathBuf],
) -> Vec<NeededResolution> {
    resolve_needed_with(library, info, search_dirs, &|p| p.is_file())
}

/// [`resolve_needed`] against another file tree than this machine's (an image's layers):
/// `is_file` says whether a path is a file there, following symbolic links.
pub fn resolve_needed_with(
    library: &Path,
    info: &DynamicInfo,
    search_dirs: &[PathBuf],
    is_file: &dyn Fn(&Path) -> bool,
) -> Vec<NeededResolution> {
    let origin = library.parent().unwrap_or(Path::new("."));
    let own_kind = if info.runpath.is_empty() {
        "rpath"
    } else {
        "runpath"
    };
    let own = info.own_search_dirs(origin);
    info.needed
        .iter()
        .map(|needed| {
            if needed.contains('/') {
                let path = expand_origin(needed, origin);
                let found = is_file(&path).then_some(path);
                let via = found.as_ref().map(|_| "path");
                return NeededResolution {
                    needed: needed.clone(),
                    found,
                    via,
                };
            }
            let hit = |dirs: &[PathBuf]| dirs.iter().map(|d| d.join(needed)).find(|p| is_file(p));
            let (found, via) = match hit(&own) {
                Some(p) => (Some(p), Some(own_kind)),
                None => match hit(search_dirs) {
                    Some(p) => (Some(p), Some("search-dirs")),
                    None => (None, None),
                },
            };
            NeededResolution {
                needed: needed.clone(),
                found,
                via,
            }
        })
        .collect()
}
