//! The recorded hosts the doctor's tests run against (tests/fixtures: /proc, /sys and /dev
//! trees under root/, nvidia-smi's output under nvidia-smi/), as they are or copied to be
//! changed.

use std::fs;
use std::path::{Path, PathBuf};

/// The recorded host `name`, read-only (the fixture itself).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A writable copy of the recorded host `name`.
pub fn copy_of(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&fixture(name), dir.path());
    dir
}
