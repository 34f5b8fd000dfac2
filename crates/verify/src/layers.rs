//! The static level over an image's layers, on this machine, without Docker: each layer
//! tar is indexed once ([`index_layer`]: every entry, and the facts of the files the checks
//! read, taken from the tar's bytes in place), and the image's file tree is its layers'
//! indexes applied bottom first with OCI whiteouts ([`ImageFiles`]). An index depends on
//! the layer's bytes alone (its diff_id), so whoever keeps them by diff_id reads a layer
//! once: an update that moves three layers reads three. The image's ID is the digest of
//! a config naming these diff_ids, so these checks are of the very image Docker loads.

use std::collections::{BTreeMap, VecDeque};
use std::io::Cursor;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::facts::{FACTS_SCHEMA, FileBytes, FileFacts, file_facts, wanted};
use crate::static_level::{Gathered, tree_of};

/// What one layer holds: every entry by absolute path (`/usr/lib/...`), and its whiteouts.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LayerIndex {
    /// [`FACTS_SCHEMA`] when it was made.
    pub schema: u32,
    pub diff_id: String,
    pub entries: BTreeMap<String, Entry>,
    /// `.wh.<name>`: the path (and what is under it) of lower layers is removed.
    #[serde(default)]
    pub whiteouts: Vec<String>,
    /// `.wh..wh..opq`: what lower layers hold under these directories is hidden.
    #[serde(default)]
    pub opaque: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Entry {
    File {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        facts: Option<Box<FileFacts>>,
    },
    Dir,
    Symlink {
        target: String,
    },
    /// A second name of a file (absolute path): not a second copy of it. Its facts (for
    /// a name the checks read) are the file's.
    Hardlink {
        target: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        facts: Option<Box<FileFacts>>,
    },
    /// A device, a FIFO: nothing the checks read.
    Other,
}

/// The absolute path a tar names, cleaned as Docker cleans it when it unpacks a layer
/// (Go's `filepath.Clean`): `./`, `//` and trailing slashes gone, each `..` taking the
/// component before it. None for a name that climbs above the root, which Docker refuses.
fn absolute(raw: &Path) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(format!("/{}", parts.join("/")))
}

/// Reads the layer tar at `tar` (uncompressed, as image steps keep them): every entry,
/// and the facts of the files the checks read, from the mapped tar without copying.
pub fn index_layer(tar: &Path, diff_id: &str) -> Result<LayerIndex> {
    let file =
        std::fs::File::open(tar).with_context(|| format!("cannot open {}", tar.display()))?;
    // Safety: read-only mapping of a sealed store file.
    let map = Arc::new(
        unsafe { Mmap::map(&file) }.with_context(|| format!("cannot map {}", tar.display()))?,
    );
    let mut index = LayerIndex {
        schema: FACTS_SCHEMA,
        diff_id: diff_id.to_string(),
        entries: BTreeMap::new(),
        whiteouts: Vec::new(),
        opaque: Vec::new(),
    };
    // Where each regular file's bytes lie, for the hard links to it.
    let mut ranges: BTreeMap<String, std::ops::Range<usize>> = BTreeMap::new();
    let mut archive = tar::Archive::new(Cursor::new(&map[..]));
    let entries = archive
        .entries_with_seek()
        .with_context(|| format!("{} is not a tar", tar.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("{}: a damaged tar entry", tar.display()))?;
        let raw = entry
            .path()
            .with_context(|| format!("{}: an entry with an unreadable path", tar.display()))?
            .into_owned();
        let climbs = || {
            anyhow::anyhow!(
                "{}: the entry `{}` climbs above the image's root (Docker refuses such a layer)",
                tar.display(),
                raw.display()
            )
        };
        let path = absolute(&raw).ok_or_else(climbs)?;
        let name = raw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent =
            absolute(Path::new(&path).parent().unwrap_or(Path::new("/"))).ok_or_else(climbs)?;
        if name == ".wh..wh..opq" {
            index.opaque.push(parent);
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            index.whiteouts.push(match parent.as_str() {
                "/" => format!("/{hidden}"),
                p => format!("{p}/{hidden}"),
            });
            continue;
        }
        let kind = entry.header().entry_type();
        let link = || -> Result<String> {
            Ok(entry
                .link_name()
                .with_context(|| format!("{}: {path}: unreadable link", tar.display()))?
                .with_context(|| format!("{}: {path}: a link with no target", tar.display()))?
                .to_string_lossy()
                .into_owned())
        };
        let e = if kind.is_dir() {
            Entry::Dir
        } else if kind.is_symlink() {
            Entry::Symlink { target: link()? }
        } else if kind.is_hard_link() {
            let target = absolute(Path::new(&link()?)).ok_or_else(climbs)?;
            // The facts of this name, from the bytes of the file it names in this layer
            // (Docker links only within a layer): it may be the name inside the root.
            let facts = match (wanted(Path::new(&path)), ranges.get(&target)) {
                (true, Some(range)) => facts_of(
                    &path,
                    &FileBytes {
                        map: map.clone(),
                        range: range.clone(),
                    },
                ),
                _ => None,
            };
            Entry::Hardlink { target, facts }
        } else if kind.is_file() || kind.is_contiguous() || kind.is_gnu_sparse() {
            let facts = if wanted(Path::new(&path)) {
                if kind.is_gnu_sparse() {
                    bail!(
                        "{}: {path} is a sparse file, which verify does not read from a layer",
                        tar.display()
                    );
                }
                let data = FileBytes {
                    map: map.clone(),
                    range: range_of(&entry, map.len())
                        .with_context(|| format!("{}: {path}", tar.display()))?,
                };
                facts_of(&path, &data)
            } else {
                None
            };
            if !kind.is_gnu_sparse() {
                ranges.insert(
                    path.clone(),
                    range_of(&entry, map.len())
                        .with_context(|| format!("{}: {path}", tar.display()))?,
                );
            }
            Entry::File { facts }
        } else {
            Entry::Other
        };
        index.entries.insert(path, e);
    }
    Ok(index)
}

/// The bytes of a regular file's entry within the mapped tar of `len` bytes.
fn range_of<R: std::io::Read>(
    entry: &tar::Entry<'_, R>,
    len: usize,
) -> Result<std::ops::Range<usize>> {
    let start = usize::try_from(entry.raw_file_position())?;
    let end = start
        .checked_add(usize::try_from(entry.size())?)
        .filter(|&end| end <= len)
        .context("runs past the end of the tar")?;
    Ok(start..end)
}

fn facts_of(path: &str, data: &FileBytes) -> Option<Box<FileFacts>> {
    file_facts(Path::new(path), data).map(Box::new)
}

/// An image's file tree: its layers' indexes applied bottom first.
pub struct ImageFiles {
    entries: BTreeMap<String, Entry>,
}

/// Removes `dir`'s descendants (not `dir` itself).
fn remove_under(entries: &mut BTreeMap<String, Entry>, dir: &str) {
    let prefix = if dir == "/" {
        "/".to_string()
    } else {
        format!("{dir}/")
    };
    let doomed: Vec<String> = entries
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for k in doomed {
        entries.remove(&k);
    }
}

impl ImageFiles {
    /// The tree of `layers` (bottom first), whiteouts applied as overlayfs does: a
    /// layer's whiteouts and opaque directories hide what the layers below it hold.
    pub fn new(layers: Vec<LayerIndex>) -> ImageFiles {
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for layer in layers {
            for dir in &layer.opaque {
                remove_under(&mut entries, dir);
            }
            for gone in &layer.whiteouts {
                entries.remove(gone);
                remove_under(&mut entries, gone);
            }
            for (path, e) in layer.entries {
                // A file or link over a lower directory hides what was under it.
                if !matches!(e, Entry::Dir) && matches!(entries.get(&path), Some(Entry::Dir)) {
                    remove_under(&mut entries, &path);
                }
                entries.insert(path, e);
            }
        }
        ImageFiles { entries }
    }

    /// Whether `dir` exists as a directory only implied by what is under it (a tar need
    /// not carry every parent directory's entry).
    fn implied_dir(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        self.entries
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    }

    /// The entry at `path`, following symbolic links (in the image's tree, relative
    /// ones against their directory) as the kernel would, at most 40 of them.
    pub fn lookup(&self, path: &Path) -> Option<(String, &Entry)> {
        let mut parts: VecDeque<String> = VecDeque::new();
        push_front(&mut parts, path);
        let mut cur = String::from("/");
        let mut hops = 0;
        while let Some(part) = parts.pop_front() {
            match part.as_str() {
                "." | "" => continue,
                ".." => {
                    cur = match cur.rfind('/') {
                        Some(0) | None => "/".into(),
                        Some(i) => cur[..i].to_string(),
                    };
                    continue;
                }
                _ => {}
            }
            let next = if cur == "/" {
                format!("/{part}")
            } else {
                format!("{cur}/{part}")
            };
            match self.entries.get(&next) {
                Some(Entry::Symlink { target }) => {
                    hops += 1;
                    if hops > 40 {
                        return None;
                    }
                    if target.starts_with('/') {
                        cur = "/".into();
                    }
                    push_front(&mut parts, Path::new(target));
                }
                Some(_) => cur = next,
                None if !parts.is_empty() && self.implied_dir(&next) => cur = next,
                None => return None,
            }
        }
        match self.entries.get(&cur) {
            Some(e) => Some((cur, e)),
            None if cur == "/" || self.implied_dir(&cur) => Some((cur, &IMPLIED_DIR)),
            None => None,
        }
    }

    /// Whether `path` is a file of the image (following links).
    pub fn is_file(&self, path: &Path) -> bool {
        matches!(
            self.lookup(path),
            Some((_, Entry::File { .. } | Entry::Hardlink { .. }))
        )
    }

    /// What the checks read of `roots` (directories of the image, e.g. its venv's
    /// site-packages): each file's facts, second hard links left out as not copies.
    pub fn gather(&self, roots: &[PathBuf]) -> Gathered<'_> {
        let mut facts = BTreeMap::new();
        let mut trees = Vec::new();
        let mut unwalkable = Vec::new();
        let mut resolved_roots = Vec::new();
        for root in roots {
            // Listed where its links lead, as the loader sees it.
            let dir = match self.lookup(root) {
                Some((dir, Entry::Dir)) => dir,
                _ => {
                    unwalkable.push(format!("{}: not a directory of the image", root.display()));
                    continue;
                }
            };
            let prefix = if dir == "/" {
                dir.clone()
            } else {
                format!("{dir}/")
            };
            // A file and its hard links are one file: its first name inside the root
            // stands for it, as a walk of the directory would find it.
            let mut seen = std::collections::HashSet::new();
            let files: Vec<(PathBuf, FileFacts)> = self
                .entries
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .filter_map(|(k, e)| {
                    let (file, f) = match e {
                        Entry::File { facts } => (k.as_str(), facts),
                        Entry::Hardlink { target, facts } => (target.as_str(), facts),
                        _ => return None,
                    };
                    if !seen.insert(file) {
                        return None;
                    }
                    f.as_ref().map(|f| (PathBuf::from(k), (**f).clone()))
                })
                .collect();
            let root = PathBuf::from(&dir);
            trees.push(tree_of(&root, files.iter().map(|(p, f)| (p.as_path(), f))));
            facts.extend(files);
            resolved_roots.push(root);
        }
        Gathered {
            roots: resolved_roots,
            trees,
            facts,
            unwalkable,
            is_file: Box::new(|p: &Path| self.is_file(p)),
        }
    }
}

/// What [`ImageFiles::lookup`] gives for a directory the tar does not list but whose
/// contents it holds.
static IMPLIED_DIR: Entry = Entry::Dir;

fn push_front(parts: &mut VecDeque<String>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => parts.push_front(n.to_string_lossy().into_owned()),
            Component::ParentDir => parts.push_front("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}
