//! The one unpacker for every archive commstack opens (`.tar`, `.tar.gz`/`.tgz`, `.zip`,
//! `.whl`), and the one tree copy ([`copy_tree`]) in place of `cp -a`.
//!
//! [`unpack`] writes into a fresh temporary directory next to the destination and renames
//! it into place at the end, so a refused or broken archive leaves nothing behind. What it
//! writes is the only reading of an archive there is: the tree hash of an archive
//! (`commstack_fetch::tree`) is the hash of what [`with_unpacked`] wrote, and
//! [`unpack_checked`] checks the tree before it is moved into place, so what is hashed and
//! what is built cannot differ. It refuses, naming the entry (escaped, cut short):
//!
//! - absolute paths and paths with a `..` component;
//! - symlinks whose target, resolved lexically through every other link of the archive
//!   (chains such as `a -> .`, `b -> a/..` included), leaves the destination, or that
//!   loop; absolute symlink targets;
//! - hard links to a path outside the destination or to anything but a regular file
//!   earlier in the archive;
//! - device files, FIFOs and entry types it does not know;
//! - setuid, setgid and sticky bits: refused rather than stripped, since nothing commstack
//!   unpacks needs them and a stripped bit would silently change what the tree is;
//! - what exceeds a bound of [`Limits`], checked before the work it bounds: content bytes
//!   (absolute, as a ratio to the archive's size, against the free disk space), the
//!   decompressed stream, entries, name length (before a GNU long name is read whole) and
//!   path depth (docs/bounds.md);
//! - zip entries whose local header names another file than the central directory, and
//!   entries that share bytes of the archive.
//!
//! Links are written last, after every file and directory: no file is ever written
//! through a link, so the order of entries cannot be used to escape.

mod copy;
mod limits;
mod paths;
mod tar_in;
mod unpacker;
mod zip_in;

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use copy::{copy_tree, copy_tree_checked, copy_tree_except};
pub use limits::Limits;

use copy::{set_dir_modes_or_remove, temp_next_to};
use limits::Budget;
use unpacker::{Finished, Unpacker};

/// Whether the archive's single top directory is dropped (as GitHub and
/// `git archive --prefix` put one around the tree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strip {
    /// Keep every path as it is.
    #[default]
    None,
    /// `tar --strip-components=1`, but stricter: every entry must lie under one and the
    /// same top directory, else the archive is refused.
    TopDir,
    /// Strip the top directory when every file and link lies under one, else keep the
    /// paths: the rule the tree hash (`commstack_fetch::tree`) applies (directories do not
    /// count; those outside it are left out), so an archive and what it unpacks to hash
    /// alike.
    TopDirIfSingle,
}

/// What [`unpack`] does besides refusing unsafe entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub strip: Strip,
    pub limits: Limits,
    /// Keep absolute symlink targets (a root filesystem's links point into its own root,
    /// e.g. `bin/python -> /usr/bin/python3.11`). Only for archives we wrote ourselves, such
    /// as image layers: safe to write, as links are made last and never followed while
    /// unpacking, but such a tree is not safe to follow outside a container.
    pub keep_absolute_symlinks: bool,
    /// Leave out every entry with a path component named `.git` (not written, not a path
    /// of the tree): what the tree hash leaves out, so that a source's written tree is the
    /// hashed one. A `.git` directory in a source tree would make `git`, which build
    /// scripts run, obey whatever config it holds.
    pub drop_git: bool,
}

impl Options {
    pub fn strip(strip: Strip) -> Options {
        Options {
            strip,
            ..Options::default()
        }
    }
}

/// The archive formats [`unpack`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    TarGz,
    /// `.zip` and `.whl`.
    Zip,
}

impl Format {
    /// From the file name's extension; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Format> {
        let name = name.to_ascii_lowercase();
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Format::TarGz)
        } else if name.ends_with(".tar") {
            Some(Format::Tar)
        } else if name.ends_with(".zip") || name.ends_with(".whl") {
            Some(Format::Zip)
        } else {
            None
        }
    }

    /// From the first bytes (gzip, zip and ustar magic), else from the file name: the
    /// content wins, as caches store files under names that need not say what they are.
    pub fn detect(path: &Path) -> Result<Format> {
        let mut head = Vec::with_capacity(262);
        File::open(path)
            .with_context(|| format!("cannot open the archive {}", path.display()))?
            .take(262)
            .read_to_end(&mut head)
            .with_context(|| format!("cannot read the archive {}", path.display()))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            return Ok(Format::TarGz);
        }
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            return Ok(Format::Zip);
        }
        if head.get(257..262) == Some(b"ustar") {
            return Ok(Format::Tar);
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Format::from_name(&name).with_context(|| {
            format!(
                "{}: neither a .tar, .tar.gz/.tgz nor a .zip/.whl archive (by content or name)",
                path.display()
            )
        })
    }
}

/// What [`unpack`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Regular files (hard links included), relative to the destination, in archive order.
    pub files: Vec<PathBuf>,
    /// Entries read (after skipping pax global headers).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Unpack `archive` into `dest`, which must not exist (its parent is created). See the
/// crate docs for what is refused; on any error `dest` is not created.
pub fn unpack(archive: &Path, dest: &Path, options: &Options) -> Result<Unpacked> {
    unpack_checked(archive, dest, options, |_| Ok(()))
}

/// [`unpack`], with `check` run over the tree written (before the top directory is
/// stripped, before the archive's directory modes are applied) before it is moved into
/// place: an error from it refuses the archive, leaving nothing. The source steps check
/// the tree hash here (`commstack_fetch::tree::unpack_verified`).
pub fn unpack_checked(
    archive: &Path,
    dest: &Path,
    options: &Options,
    check: impl FnOnce(&Path) -> Result<()>,
) -> Result<Unpacked> {
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: unpacking {} writes a fresh directory; remove it first",
            dest.display(),
            archive.display()
        );
    }
    let tmp = temp_next_to(dest)?;
    let (u, done) = read_into(archive, tmp.path(), options)?;
    check(tmp.path())?;
    let from = match &done.top {
        Some(t) => tmp.path().join(t),
        None => tmp.path().to_path_buf(),
    };
    // Moved while every directory is still writable (moving a directory to another
    // parent needs write access to it, and a failure must still be able to clean up);
    // the archive's directory modes are applied in place afterwards.
    fs_rename(&from, dest, archive)?;
    let mut dirs = done.dirs;
    if done.top.is_none() {
        // The temporary directory is 0700; the tree's root gets what mkdir would give.
        dirs.push((PathBuf::new(), 0o755));
    }
    set_dir_modes_or_remove(dest, &dirs)?;
    drop(tmp);
    Ok(Unpacked {
        files: done.files,
        entries: u.entries,
        bytes: u.bytes,
    })
}

/// Unpack `archive` into a temporary directory under `scratch` (created if missing), give
/// `inspect` the tree (unstripped, every directory still writable) and remove it: how the
/// tree hash of an archive is taken from what the unpacker writes.
pub fn with_unpacked<R>(
    archive: &Path,
    scratch: &Path,
    options: &Options,
    inspect: impl FnOnce(&Path) -> Result<R>,
) -> Result<R> {
    std::fs::create_dir_all(scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(".unpacked-")
        .tempdir_in(scratch)
        .with_context(|| format!("cannot create a directory in {}", scratch.display()))?;
    read_into(archive, tmp.path(), options)?;
    inspect(tmp.path())
}

/// Every entry of `archive` under `root`, links included; nothing moved.
fn read_into(archive: &Path, root: &Path, options: &Options) -> Result<(Unpacker, Finished)> {
    let format = Format::detect(archive)?;
    let budget = Budget::new(&options.limits, archive, root)?;
    let mut u = Unpacker::new(archive, root, options, budget);
    let open = || {
        File::open(archive)
            .with_context(|| format!("cannot open the archive {}", archive.display()))
    };
    match format {
        Format::Tar => u.tar(BufReader::new(open()?))?,
        Format::TarGz => u.tar(flate2::read::GzDecoder::new(BufReader::new(open()?)))?,
        Format::Zip => u.zip(open()?)?,
    }
    let done = u.finish(options.strip)?;
    Ok((u, done))
}

fn fs_rename(from: &Path, dest: &Path, archive: &Path) -> Result<()> {
    std::fs::rename(from, dest).with_context(|| {
        format!(
            "cannot move the unpacked {} to {}",
            archive.display(),
            dest.display()
        )
    })
}
