//! Removing a directory tree its owner may have made read-only: a step's output can hold
//! directories of mode 0555 or 0000 (an archive's, a build's), which `rm -rf` cannot
//! empty as a user who is not root.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Removes `path` (a directory or a file; nothing if it is missing), first giving every
/// directory under it its owner's read, write and search access back when a plain
/// removal is refused.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let first = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    match first {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() != io::ErrorKind::PermissionDenied => return Err(e),
        Err(_) => {}
    }
    // Top down: a directory is reached through its parents, which come back first.
    let mut todo = vec![path.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let meta = fs::symlink_metadata(&dir)?;
        if !meta.is_dir() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & 0o700 != 0o700 {
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode | 0o700))?;
        }
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    fs::remove_dir_all(path)
}
