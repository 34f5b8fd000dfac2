//! Tree hashes: one digest for the *contents* of a source tree, the same whether the tree
//! is a `.tar.gz`/`.tgz`/`.tar`/`.zip`/`.whl` archive or a directory on disk. It lets the
//! same release fetched from another origin (repacked, other compression, other mtimes or
//! owners) be recognised, and it names what a `--source NAME=PATH` override holds.
//!
//! # Definition (`sha256:<hex>`)
//!
//! 1. Collect the entries: regular files (path, executable?, content) and symlinks (path,
//!    target). Directories are ignored (so are empty ones), as are devices and FIFOs.
//!    Paths are relative, `/`-separated, without a leading `./`. In an archive a later
//!    entry of the same path replaces an earlier one; a tar hard link is a file with the
//!    content and mode of its target.
//! 2. Drop every entry with a path component named exactly `.git` (a checkout's `.git/`
//!    directory or a submodule's `.git` file).
//! 3. If every remaining entry lies under one and the same top-level directory (as in
//!    `nvshmem_src/...` or `DeepEP-567632d/...`), strip that first component.
//! 4. Sort the entries by path bytes. For each, append to one byte stream:
//!    - regular file: `F <x|-> <path>\0<sha256 hex of the content>\n`, where `x` means any
//!      executable bit (0o111) is set;
//!    - symlink: `L <path>\0<target>\n`.
//! 5. The tree hash is the sha256 of that stream, written `sha256:<lowercase hex>`.
//!
//! Owners, times and other mode bits never enter the hash.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// One entry of a tree, by its `/`-separated relative path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    File { executable: bool, sha256: String },
    Symlink { target: Vec<u8> },
}

type Entries = BTreeMap<Vec<u8>, Entry>;

/// The archive formats [`tree_sha256`] reads, by file name: the unpacker's, so that what
/// is hashed and what is unpacked are the same set.
pub use commstack_archive::Format as ArchiveKind;

/// The tree hash of a directory, or of an archive whose format `name_hint` (usually the
/// file name) tells; see the module docs for the definition.
pub fn tree_sha256(path: &Path, name_hint: &str) -> io::Result<String> {
    if path.is_dir() {
        return tree_sha256_dir(path);
    }
    let kind = ArchiveKind::from_name(name_hint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: no tree hash for this file type (want a directory, .tar.gz, .tgz, .tar, .zip or .whl)",
                path.display()
            ),
        )
    })?;
    tree_sha256_archive(path, kind)
}

/// The tree hash of a directory on disk (symlinks are not followed).
pub fn tree_sha256_dir(dir: &Path) -> io::Result<String> {
    let mut entries = Entries::new();
    for item in walkdir::WalkDir::new(dir).follow_links(false).min_depth(1) {
        let item = item.map_err(|e| io::Error::other(format!("walking {}: {e}", dir.display())))?;
        let relative = item
            .path()
            .strip_prefix(dir)
            .expect("walkdir yields paths under its root");
        let path = relative.as_os_str().as_bytes().to_vec();
        let file_type = item.file_type();
        if file_type.is_symlink() {
            let target = std::fs::read_link(item.path())?;
            entries.insert(
                path,
                Entry::Symlink {
                    target: target.as_os_str().as_bytes().to_vec(),
                },
            );
        } else if file_type.is_file() {
            let executable = item
                .metadata()
                .map_err(io::Error::other)?
                .permissions()
                .mode()
                & 0o111
                != 0;
            let file = File::open(item.path()).map_err(|e| with_path(e, item.path()))?;
            entries.insert(
                path,
                Entry::File {
                    executable,
                    sha256: sha256_hex(file)?,
                },
            );
        }
    }
    Ok(digest(entries))
}

/// The tree hash of an archive.
pub fn tree_sha256_archive(path: &Path, kind: ArchiveKind) -> io::Result<String> {
    let file = File::open(path).map_err(|e| with_path(e, path))?;
    let reader = BufReader::new(file);
    let entries = match kind {
        ArchiveKind::TarGz => tar_entries(flate2::read::GzDecoder::new(reader)),
        ArchiveKind::Tar => tar_entries(reader),
        ArchiveKind::Zip => zip_entries(path),
    }
    .map_err(|e| io::Error::new(e.kind(), format!("reading archive {}: {e}", path.display())))?;
    Ok(digest(entries))
}

fn tar_entries(reader: impl Read) -> io::Result<Entries> {
    let mut archive = tar::Archive::new(reader);
    let mut entries = Entries::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = clean_path(&entry.path_bytes());
        if path.is_empty() {
            continue;
        }
        let header = entry.header();
        let kind = header.entry_type();
        if kind.is_symlink() {
            let target = entry
                .link_name_bytes()
                .map(|t| t.into_owned())
                .unwrap_or_default();
            entries.insert(path, Entry::Symlink { target });
        } else if kind.is_hard_link() {
            let target = clean_path(&entry.link_name_bytes().unwrap_or_default());
            let linked = entries.get(&target).cloned().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "hard link {} points to {}, not seen before it",
                        show(&path),
                        show(&target)
                    ),
                )
            })?;
            entries.insert(path, linked);
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let executable = header.mode()? & 0o111 != 0;
            entries.insert(
                path,
                Entry::File {
                    executable,
                    sha256: sha256_hex(&mut entry)?,
                },
            );
        }
    }
    Ok(entries)
}

fn zip_entries(path: &Path) -> io::Result<Entries> {
    let file = File::open(path)?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(io::Error::other)?;
    let mut entries = Entries::new();
    for index in 0..archive.len() {
        let mut item = archive.by_index(index).map_err(io::Error::other)?;
        let name = clean_path(item.name_raw());
        if name.is_empty() || item.is_dir() {
            continue;
        }
        let mode = item.unix_mode().unwrap_or(0);
        // S_IFLNK: zip stores a symlink as a file whose content is the target.
        if mode & 0o170000 == 0o120000 {
            let mut target = Vec::new();
            item.read_to_end(&mut target)?;
            entries.insert(name, Entry::Symlink { target });
        } else {
            entries.insert(
                name,
                Entry::File {
                    executable: mode & 0o111 != 0,
                    sha256: sha256_hex(&mut item)?,
                },
            );
        }
    }
    Ok(entries)
}

/// `./a//b/` -> `a/b`.
fn clean_path(raw: &[u8]) -> Vec<u8> {
    let parts: Vec<&[u8]> = raw
        .split(|&b| b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .collect();
    parts.join(&b'/')
}

/// Steps 2 to 5 of the definition.
fn digest(entries: Entries) -> String {
    let kept: Entries = entries
        .into_iter()
        .filter(|(path, _)| !path.split(|&b| b == b'/').any(|c| c == b".git"))
        .collect();
    let first_components: std::collections::BTreeSet<&[u8]> = kept
        .keys()
        .map(|path| path.split(|&b| b == b'/').next().unwrap_or_default())
        .collect();
    let single_root = first_components.len() == 1 && kept.keys().all(|path| path.contains(&b'/'));
    let mut hasher = Sha256::new();
    for (path, entry) in &kept {
        let path = match single_root {
            true => &path[path.iter().position(|&b| b == b'/').unwrap() + 1..],
            false => &path[..],
        };
        match entry {
            Entry::File { executable, sha256 } => {
                hasher.update(if *executable { b"F x " } else { b"F - " });
                hasher.update(path);
                hasher.update(b"\0");
                hasher.update(sha256.as_bytes());
            }
            Entry::Symlink { target } => {
                hasher.update(b"L ");
                hasher.update(path);
                hasher.update(b"\0");
                hasher.update(target);
            }
        }
        hasher.update(b"\n");
    }
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

fn sha256_hex(mut reader: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    io::copy(&mut reader, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn with_path(err: io::Error, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}
