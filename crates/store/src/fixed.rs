//! A build directory whose path depends only on the step's key.
//!
//! Some compilers record the absolute path they build in: nvcc hashes the source file's
//! physical path into every module id of relocatable device code (`__fatbinwrap_<id>`,
//! `__nv_static_<n>__<id>`), and no option or prefix map changes that. A step that
//! compiles with them builds here instead of under the store, so the same key gives the
//! same bytes whatever COMMSTACK_HOME is, on any machine.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::StepKey;

/// Where fixed build directories live: the same on every machine (in `/var/tmp`, not
/// `/tmp`, which is often a small tmpfs or mounted noexec, and CMake runs what it builds).
pub const FIXED_BUILD_ROOT: &str = "/var/tmp/commstack-build";

/// `FIXED_BUILD_ROOT/<step>-<hash32>`, locked for this process, empty when acquired and
/// removed when dropped. Two processes building the same key wait for each other.
pub struct FixedDir {
    path: PathBuf,
    _lock: File,
}

impl FixedDir {
    pub fn acquire(key: &StepKey) -> Result<FixedDir> {
        let root = Path::new(FIXED_BUILD_ROOT);
        fs::create_dir_all(root).with_context(|| {
            format!(
                "cannot create {FIXED_BUILD_ROOT}, where steps that record their build path are built \
                 (it must be writable by the user running commstack)"
            )
        })?;
        let name = key.dir_name();
        let lock_path = root.join(format!("{name}.lock"));
        let lock = crate::lock_file(
            &lock_path,
            &format!("{} in {}", key.step, root.join(&name).display()),
        )?;
        let path = root.join(name);
        // Left by a crash: nothing in it is worth keeping (the store holds results).
        if fs::symlink_metadata(&path).is_ok() {
            crate::remove_tree(&path).with_context(|| {
                format!(
                    "cannot clear the fixed build directory {} (left by an earlier build, \
                     perhaps of another user: remove it)",
                    path.display()
                )
            })?;
        }
        fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(FixedDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FixedDir {
    fn drop(&mut self) {
        // Best effort: the next acquire clears it anyway.
        let _ = crate::remove_tree(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_depends_on_the_key_only_and_is_cleared_and_removed() {
        let key = StepKey::new(
            "fixed-test",
            &serde_json::json!({ "pid": std::process::id() }),
        );
        let path = Path::new(FIXED_BUILD_ROOT).join(key.dir_name());
        // What a crash would leave.
        fs::create_dir_all(&path).unwrap();
        fs::write(path.join("left"), "x").unwrap();
        let d = FixedDir::acquire(&key).unwrap();
        assert_eq!(d.path(), path);
        assert!(
            !d.path().join("left").exists(),
            "a crash's leftovers are cleared"
        );
        drop(d);
        assert!(!path.exists(), "removed when done");
    }
}
