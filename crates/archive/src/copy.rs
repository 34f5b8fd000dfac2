//! The one tree copy ([`copy_tree`]) in place of `cp -a`, and what it shares with the
//! unpacker: a temporary directory beside the destination, and directory modes applied
//! last (with the write access they take away given back when that fails).

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::limits::parent_of;

/// Copy the directory `src` to `dest`, which must not exist, as `cp -a` does for what
/// commstack copies: files with their modes, symlinks as links (never followed),
/// directories with their modes. Devices, FIFOs and sockets are refused.
pub fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    copy_tree_except(src, dest, |_| false)
}

/// [`copy_tree`], leaving out every entry (and what is under it) for which `skip`, given
/// the path relative to `src`, says true.
pub fn copy_tree_except(src: &Path, dest: &Path, skip: impl Fn(&Path) -> bool) -> Result<()> {
    copy_tree_checked(src, dest, skip, |_| Ok(()))
}

/// [`copy_tree_except`], with `check` run over the copy (before its directory modes are
/// applied) before it is moved into place: an error from it refuses the copy, leaving
/// nothing (as [`crate::unpack_checked`] does for archives).
pub fn copy_tree_checked(
    src: &Path,
    dest: &Path,
    skip: impl Fn(&Path) -> bool,
    check: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let root_meta = fs::metadata(src)
        .with_context(|| format!("cannot copy {}: no such directory", src.display()))?;
    if !root_meta.is_dir() {
        bail!("cannot copy {}: not a directory", src.display());
    }
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: copying {} writes a fresh directory; remove it first",
            dest.display(),
            src.display()
        );
    }
    let tmp = temp_next_to(dest)?;
    let mut dirs = vec![(PathBuf::new(), root_meta.permissions().mode())];
    let walk = walkdir::WalkDir::new(src)
        .follow_links(false)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| !skip(e.path().strip_prefix(src).unwrap_or(e.path())));
    for entry in walk {
        let entry = entry.with_context(|| format!("cannot walk {}", src.display()))?;
        let rel = entry
            .path()
            .strip_prefix(src)
            .expect("walkdir stays under its root")
            .to_path_buf();
        let to = tmp.path().join(&rel);
        let ft = entry.file_type();
        if ft.is_dir() {
            fs::create_dir(&to).with_context(|| format!("cannot create {}", to.display()))?;
            let mode = entry.metadata()?.permissions().mode();
            dirs.push((rel, mode));
        } else if ft.is_symlink() {
            let target = fs::read_link(entry.path())
                .with_context(|| format!("cannot read the link {}", entry.path().display()))?;
            symlink(&target, &to).with_context(|| format!("cannot link {}", to.display()))?;
        } else if ft.is_file() {
            // fs::copy keeps the permission bits.
            fs::copy(entry.path(), &to).with_context(|| {
                format!("cannot copy {} to {}", entry.path().display(), to.display())
            })?;
        } else {
            bail!(
                "{} is neither a file, a directory nor a symlink (a device, FIFO or socket): \
                 copy_tree copies only those; remove it from {} or copy it by hand",
                entry.path().display(),
                src.display()
            );
        }
    }
    check(tmp.path())?;
    // The root's mode last, after the move: within one parent a rename needs no write
    // access to the directory moved, but the failure path does to remove it.
    let root_mode = dirs.remove(0).1;
    set_dir_modes_or_remove(tmp.path(), &dirs)?;
    fs::rename(tmp.path(), dest).with_context(|| {
        format!(
            "cannot move the copy of {} to {}",
            src.display(),
            dest.display()
        )
    })?;
    set_dir_modes_or_remove(dest, &[(PathBuf::new(), root_mode)])
}

/// A temporary directory in `dest`'s parent (created if missing), so that the final
/// rename stays on one filesystem.
pub(crate) fn temp_next_to(dest: &Path) -> Result<tempfile::TempDir> {
    let parent = parent_of(dest);
    fs::create_dir_all(&parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(&parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })
}

/// Directory modes last (deepest first: a read-only directory would refuse its entries).
/// If one cannot be set, every directory gets its owner's access back and `root` is
/// removed: a tree with a 0555 or 0000 directory cannot be removed by its non-root owner.
pub(crate) fn set_dir_modes_or_remove(root: &Path, dirs: &[(PathBuf, u32)]) -> Result<()> {
    let mut sorted: Vec<&(PathBuf, u32)> = dirs.iter().collect();
    sorted.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
    for (rel, mode) in &sorted {
        let path = root.join(rel);
        if let Err(e) = fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777)) {
            // Shallowest first: a directory's mode can be changed only through its parents.
            for (rel, _) in sorted.iter().rev() {
                let _ = fs::set_permissions(root.join(rel), fs::Permissions::from_mode(0o700));
            }
            let _ = fs::remove_dir_all(root);
            return Err(e).with_context(|| format!("cannot set the mode of {}", path.display()));
        }
    }
    Ok(())
}
