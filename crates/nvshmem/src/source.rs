//! The NVSHMEM source tree: its version, and a private copy to build from (NVSHMEM's
//! CMake writes into its source directory: configured headers, git_commit.txt).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// `project(NVSHMEM ... VERSION 3.4.5.0)` in the top CMakeLists.txt -> `3.4.5`.
pub fn source_version(src: &Path) -> Result<String> {
    let path = src.join("CMakeLists.txt");
    let text = fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}: is {} an NVSHMEM source tree?",
            path.display(),
            src.display()
        )
    })?;
    let re = regex::Regex::new(r"(?s)project\s*\(\s*NVSHMEM\b.*?VERSION\s+(\d+)\.(\d+)\.(\d+)")
        .expect("valid regex");
    let c = re.captures(&text).with_context(|| {
        format!(
            "{}: no `project(NVSHMEM ... VERSION x.y.z)`: not an NVSHMEM source tree",
            path.display()
        )
    })?;
    Ok(format!("{}.{}.{}", &c[1], &c[2], &c[3]))
}

/// Copy `src` to `dest`, which must not exist (files with their modes, symlinks as
/// links), leaving out `.git`: commstack-archive's tree copy.
pub fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    commstack_archive::copy_tree_except(src, dest, |rel| rel.file_name() == Some(".git".as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_project_version() {
        let d = tempfile::tempdir().unwrap();
        fs::write(
            d.path().join("CMakeLists.txt"),
            "project(\n  NVSHMEM\n  LANGUAGES CUDA CXX C\n  VERSION 3.4.5.0\n)\n",
        )
        .unwrap();
        assert_eq!(source_version(d.path()).unwrap(), "3.4.5");
        fs::write(
            d.path().join("CMakeLists.txt"),
            "project(Other VERSION 1.0.0)",
        )
        .unwrap();
        assert!(source_version(d.path()).is_err());
    }
}
