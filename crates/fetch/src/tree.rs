//! Tree hashes: one digest for the *contents* of a source tree, the same whether the tree
//! is a `.tar.gz`/`.tgz`/`.tar`/`.zip`/`.whl` archive or a directory on disk. It lets the
//! same release fetched from another origin (repacked, other compression, other mtimes or
//! owners) be recognised, and it names what a `--source NAME=PATH` override holds.
//!
//! # Definition (`sha256:<hex>`)
//!
//! 1. Collect the entries: regular files (path, executable?, content) and symlinks (path,
//!    target). Directories are ignored (so are empty ones), as are devices and FIFOs.
//!    Paths are relative, `/`-separated, without a leading `./`. An archive's entries are
//!    those of the tree the one unpacker (commstack-archive) writes from it, unstripped:
//!    a later entry of the same path replaces an earlier one; a tar hard link is a file
//!    with the content and mode of the file its target finally is; a GNU sparse file is
//!    its whole content. An archive the unpacker refuses has no tree hash, and it checks
//!    links against step 3's top directory, as the source steps strip it
//!    (`Strip::TopDirIfSingle`): a link that stays in the archive but leaves that
//!    directory (`top/a -> .`, `top/b -> a/..`) is refused here too, not hashed and then
//!    refused by the build.
//! 2. Drop every entry with a path component named exactly `.git` (a checkout's `.git/`
//!    directory or a submodule's `.git` file). The unpacker never writes them in a source
//!    tree ([`unpack_verified`]), so the tree built from is the tree hashed.
//! 3. If every remaining entry lies under one and the same top-level directory (as in
//!    `nvshmem_src/...` or `DeepEP-567632d/...`), strip that first component.
//! 4. Sort the entries by path bytes. For each, append to one byte stream:
//!    - regular file: `F <x|-> <path>\0<sha256 hex of the content>\n`, where `x` means any
//!      executable bit (0o111) is set;
//!    - symlink: `L <path>\0<target>\n`.
//! 5. The tree hash is the sha256 of that stream, written `sha256:<lowercase hex>`.
//!
//! Owners, times and other mode bits never enter the hash.
//!
//! # One reading
//!
//! The tree hash of an archive is the tree hash of the directory the unpacker writes from
//! it ([`tree_sha256_archive`]), and a source step unpacks through [`unpack_verified`],
//! which hashes what it wrote before moving it into place. What is hashed and what is built
//! are the same bytes, whatever the archive's tricks (a sparse entry, a hard link to a
//! file replaced later, a `.git/` directory): a reader of its own here once disagreed with
//! the unpacker on all three, and a changed `setup.py` hashed to the locked tree.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
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
pub use commstack_archive::Strip;

use commstack_archive::Options;

/// The tree hash of a directory, or of an archive whose format `name_hint` (usually the
/// file name) tells; see the module docs for the definition.
pub fn tree_sha256(path: &Path, name_hint: &str) -> io::Result<String> {
    if path.is_dir() {
        return tree_sha256_dir(path);
    }
    // The name says whether it is an archive at all; the unpacker reads its format from
    // its first bytes.
    ArchiveKind::from_name(name_hint).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: no tree hash for this file type (want a directory, .tar.gz, .tgz, .tar, .zip or .whl)",
                path.display()
            ),
        )
    })?;
    tree_sha256_archive(path)
}

/// The tree hash of a directory on disk (symlinks are not followed).
pub fn tree_sha256_dir(dir: &Path) -> io::Result<String> {
    Ok(digest(read_entries(dir)?))
}

/// Step 1 for a directory on disk.
fn read_entries(dir: &Path) -> io::Result<Entries> {
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
    Ok(entries)
}

/// The tree hash of an archive: of the tree the unpacker writes from it, in a scratch
/// directory under the system's temporary directory.
pub fn tree_sha256_archive(path: &Path) -> io::Result<String> {
    tree_sha256_archive_in(path, &std::env::temp_dir())
}

/// [`tree_sha256_archive`], unpacking under `scratch` (created if missing; a directory of
/// the filesystem the archive's bytes may fill, such as a cache's `tmp/`).
pub fn tree_sha256_archive_in(path: &Path, scratch: &Path) -> io::Result<String> {
    let options = hashing();
    commstack_archive::with_unpacked(path, scratch, &options, |root| Ok(tree_sha256_dir(root)?))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:#}")))
}

/// How an archive is read for its tree hash: `.git` left out (step 2), and links checked
/// against the tree the steps build, inside step 3's top directory (step 1).
fn hashing() -> Options {
    Options {
        strip: Strip::TopDirIfSingle,
        drop_git: true,
        ..Options::default()
    }
}

/// [`tree_sha256_archive_in`], and the bytes of the file `name` at the top of the tree
/// (inside its single top directory, as the tree hash strips it), read from the same
/// unpacking: what `lock` learns of a source it fetches (its `.gitmodules`).
pub fn tree_sha256_archive_and_file(
    path: &Path,
    scratch: &Path,
    name: &str,
) -> io::Result<(String, Option<Vec<u8>>)> {
    let options = hashing();
    commstack_archive::with_unpacked(path, scratch, &options, |root| {
        let entries = read_entries(root)?;
        let top = match single_top(kept(&entries)) {
            Some(top) => root.join(std::ffi::OsStr::from_bytes(top)),
            None => root.to_path_buf(),
        };
        let tree = digest(entries);
        let file = top.join(name);
        let bytes = match file.symlink_metadata() {
            Ok(m) if m.is_file() => Some(std::fs::read(&file)?),
            _ => None,
        };
        Ok((tree, bytes))
    })
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:#}")))
}

/// A source into `dest` (which must not exist), refused, leaving nothing, unless the tree
/// written hashes to `expected`: a directory is copied without its `.git` ([`strip`] does
/// not apply), an archive goes through [`unpack_verified`]. Every source step places its
/// source through here.
///
/// [`strip`]: Strip
pub fn place_verified(src: &Path, dest: &Path, strip: Strip, expected: &str) -> io::Result<()> {
    if !src.is_dir() {
        return unpack_verified(src, dest, strip, expected);
    }
    let skip_git = |rel: &Path| rel.file_name() == Some(".git".as_ref());
    commstack_archive::copy_tree_checked(src, dest, skip_git, |root| {
        Ok(check_tree(src, root, expected)?)
    })
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:#}")))
}

/// `root`, written from `src`, must hash to `expected`.
fn check_tree(src: &Path, root: &Path, expected: &str) -> io::Result<()> {
    let got = tree_sha256_dir(root)?;
    if got != expected {
        return Err(io::Error::other(format!(
            "{} gives the tree {got}, not the expected {expected}: refused, nothing written; \
             if it is a cached download, it changed after it was checked (run `cargo xtask \
             cache verify --remove`, then `cargo xtask fetch`)",
            src.display()
        )));
    }
    Ok(())
}

/// Unpacks a source `archive` into `dest` (which must not exist), stripping as `strip`
/// says, and refuses it, leaving nothing, unless the tree written hashes to `expected`:
/// every tree-pinned source goes through here after it is fetched, whatever checked it
/// before (the cache's file could have changed since). `.git` entries are not written.
pub fn unpack_verified(
    archive: &Path,
    dest: &Path,
    strip: Strip,
    expected: &str,
) -> io::Result<()> {
    let options = Options {
        strip,
        drop_git: true,
        ..Options::default()
    };
    commstack_archive::unpack_checked(archive, dest, &options, |root| {
        Ok(check_tree(archive, root, expected)?)
    })
    .map(|_| ())
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e:#}")))
}

/// Steps 2 to 5 of the definition.
fn digest(entries: Entries) -> String {
    let top = single_top(kept(&entries)).map(<[u8]>::len);
    let kept: Entries = entries
        .into_iter()
        .filter(|(path, _)| !in_git(path))
        .collect();
    let mut hasher = Sha256::new();
    for (path, entry) in &kept {
        let path = match top {
            Some(len) => &path[len + 1..],
            None => &path[..],
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

/// Step 2: a path with a component named exactly `.git`.
fn in_git(path: &[u8]) -> bool {
    path.split(|&b| b == b'/').any(|c| c == b".git")
}

/// The paths step 2 keeps.
fn kept(entries: &Entries) -> impl Iterator<Item = &[u8]> {
    entries.keys().map(Vec::as_slice).filter(|p| !in_git(p))
}

/// Step 3's top directory: the first component every path shares, when each has more
/// than one (directories are not entries, so an empty `other/` beside `top/` does not
/// keep it). The tree hash strips it; `lock` reads `.gitmodules` inside it.
fn single_top<'a>(mut paths: impl Iterator<Item = &'a [u8]>) -> Option<&'a [u8]> {
    let first = |p: &'a [u8]| p.iter().position(|&b| b == b'/').map(|at| &p[..at]);
    let top = first(paths.next()?)?;
    paths.all(|p| first(p) == Some(top)).then_some(top)
}

fn sha256_hex(mut reader: impl Read) -> io::Result<String> {
    let mut hasher = Sha256::new();
    io::copy(&mut reader, &mut hasher)?;
    Ok(hex::encode(hasher.finalize()))
}

fn with_path(err: io::Error, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}
