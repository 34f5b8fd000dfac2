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
    /// A second name of a file (absolute path): not a copy.
    Hardlink {
        target: String,
    },
    /// A device, a FIFO: nothing the checks read.
    Other,
}

/// `/` + the path with `./` and trailing slashes gone.
fn absolute(raw: &Path) -> String {
    let mut out = String::new();
    for c in raw.components() {
        if let Component::Normal(n) = c {
            out.push('/');
            out.push_str(&n.to_string_lossy());
        }
    }
    if out.is_empty() { "/".into() } else { out }
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
        let path = absolute(&raw);
        let name = raw
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let parent = absolute(raw.parent().unwrap_or(Path::new("")));
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
            Entry::Hardlink {
                target: absolute(Path::new(&link()?)),
            }
        } else if kind.is_file() || kind.is_contiguous() || kind.is_gnu_sparse() {
            let facts = if wanted(Path::new(&path)) {
                if kind.is_gnu_sparse() {
                    bail!(
                        "{}: {path} is a sparse file, which verify does not read from a layer",
                        tar.display()
                    );
                }
                let start = usize::try_from(entry.raw_file_position())?;
                let size = usize::try_from(entry.size())?;
                let data = FileBytes {
                    map: map.clone(),
                    range: start..start + size,
                };
                if data.map.get(data.range.clone()).is_none() {
                    bail!("{}: {path} runs past the end of the tar", tar.display());
                }
                file_facts(Path::new(&path), &data).map(Box::new)
            } else {
                None
            };
            Entry::File { facts }
        } else {
            Entry::Other
        };
        index.entries.insert(path, e);
    }
    Ok(index)
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
        self.entries.get(&cur).map(|e| (cur, e))
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
        for root in roots {
            let dir = absolute(root);
            if !matches!(self.lookup(root), Some((_, Entry::Dir))) && !self.implied_dir(&dir) {
                unwalkable.push(format!("{}: not a directory of the image", root.display()));
                continue;
            }
            let prefix = format!("{dir}/");
            let files: Vec<(PathBuf, FileFacts)> = self
                .entries
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .filter_map(|(k, e)| match e {
                    Entry::File { facts: Some(f) } => Some((PathBuf::from(k), (**f).clone())),
                    _ => None,
                })
                .collect();
            trees.push(tree_of(root, files.iter().map(|(p, f)| (p.as_path(), f))));
            facts.extend(files);
        }
        Gathered {
            roots: roots.to_vec(),
            trees,
            facts,
            unwalkable,
            is_file: Box::new(|p: &Path| self.is_file(p)),
        }
    }
}

fn push_front(parts: &mut VecDeque<String>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(n) => parts.push_front(n.to_string_lossy().into_owned()),
            Component::ParentDir => parts.push_front("..".into()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}
