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
mod options;
mod paths;
mod tar_in;
mod unpacker;
mod zip_in;

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub use copy::{copy_tree, copy_tree_checked, copy_tree_except};
pub use limits::Limits;
pub use options::{Format, Options, Strip};

use copy::{set_dir_modes_or_remove, temp_next_to};
use limits::Budget;
use unpacker::{Finished, Unpacker};

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
    if options.plain_dir_modes {
        dirs.iter_mut().for_each(|(_, mode)| *mode = 0o755);
    }
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
/// tree hash of an archive is taken from what the unpacker writes. `options.strip` only
/// chooses the directory links must stay inside; the tree is never stripped here.
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
