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
        sweep_trash(root);
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

/// Where a dropped fixed directory waits for its removal: `FIXED_BUILD_ROOT/.trash`.
const TRASH: &str = ".trash";

impl Drop for FixedDir {
    fn drop(&mut self) {
        // The path is free at once: the tree is renamed aside and removed by a thread, off
        // the step's time (a DeepEP build leaves ~12,000 header copies and its objects:
        // 14 s to remove on a busy 2-core machine). What a process leaves there when it
        // exits first, the next acquire removes. Best effort: the next acquire of the same
        // key clears the path anyway.
        let trash = Path::new(FIXED_BUILD_ROOT).join(TRASH);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let aside = trash.join(format!("{name}.{}", std::process::id()));
        let moved = fs::create_dir_all(&trash).is_ok()
            && crate::remove_tree(&aside).is_ok()
            && fs::rename(&self.path, &aside).is_ok();
        if moved {
            std::thread::spawn(move || crate::remove_tree(&aside));
        } else {
            let _ = crate::remove_tree(&self.path);
        }
    }
}

/// Removes what dropped fixed directories of processes that have exited left in the trash
/// (a name ends in its process id; a live process removes its own).
fn sweep_trash(root: &Path) {
    let Ok(entries) = fs::read_dir(root.join(TRASH)) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().to_string();
        let pid = name.rsplit('.').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            let _ = crate::remove_tree(&e.path());
        }
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
        fs::write(d.path().join("built"), "x").unwrap();
        drop(d);
        assert!(!path.exists(), "the path is free when done");
        // The tree itself goes in the background: gone soon after.
        let aside = Path::new(FIXED_BUILD_ROOT).join(TRASH).join(format!(
            "{}.{}",
            key.dir_name(),
            std::process::id()
        ));
        let start = std::time::Instant::now();
        while aside.exists() && start.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(
            !aside.exists(),
            "{} removed in the background",
            aside.display()
        );
    }

    #[test]
    fn acquire_removes_what_an_exited_process_left_in_the_trash() {
        let key = StepKey::new(
            "fixed-trash-test",
            &serde_json::json!({ "pid": std::process::id() }),
        );
        // A process id that is not running: the kernel's pid_max is below 2^22.
        let left = Path::new(FIXED_BUILD_ROOT)
            .join(TRASH)
            .join(format!("{}.4999999", key.dir_name()));
        fs::create_dir_all(left.join("deps")).unwrap();
        fs::write(left.join("deps/h.h"), "x").unwrap();
        // One of a live process (this one) stays: it is being removed by its owner.
        let live = Path::new(FIXED_BUILD_ROOT).join(TRASH).join(format!(
            "{}-live.{}",
            key.dir_name(),
            std::process::id()
        ));
        fs::create_dir_all(&live).unwrap();
        let d = FixedDir::acquire(&key).unwrap();
        assert!(!left.exists(), "an exited process's leftovers are removed");
        assert!(live.exists(), "a live process's trash is its own to remove");
        fs::remove_dir_all(&live).unwrap();
        drop(d);
    }
}
