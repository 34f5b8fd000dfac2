//! Real cmake and ninja for fixture builds, from their PyPI wheels (31 MB): found in
//! `$COMMSTACK_TEST_WHEELS`, `scratch/wheels` or `.tools/wheels`, else downloaded once
//! into `.tools/wheels` with pip.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const CMAKE_WHEEL: &str = "cmake-4.4.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
pub const NINJA_WHEEL: &str =
    "ninja-1.13.0-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";

/// The repository's root (testkit sits at crates/testkit).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The cmake and ninja wheels.
pub fn tool_wheels() -> (PathBuf, PathBuf) {
    // Tests of one binary run in parallel: download at most once.
    static WHEELS: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    WHEELS.get_or_init(find_or_download_wheels).clone()
}

fn find_or_download_wheels() -> (PathBuf, PathBuf) {
    let root = repo_root();
    let mut dirs: Vec<PathBuf> = std::env::var_os("COMMSTACK_TEST_WHEELS")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.push(root.join("scratch/wheels"));
    dirs.push(root.join(".tools/wheels"));
    for d in &dirs {
        if d.join(CMAKE_WHEEL).is_file() && d.join(NINJA_WHEEL).is_file() {
            return (d.join(CMAKE_WHEEL), d.join(NINJA_WHEEL));
        }
    }
    let dest = root.join(".tools/wheels");
    fs::create_dir_all(&dest).unwrap();
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_x86_64",
            "-q",
            "-d",
        ])
        .arg(&dest)
        .args(["cmake==4.4.3", "ninja==1.13.0"])
        .status()
        .expect("python3 -m pip");
    assert!(
        status.success(),
        "cannot download the cmake and ninja wheels from PyPI into {}",
        dest.display()
    );
    (dest.join(CMAKE_WHEEL), dest.join(NINJA_WHEEL))
}

/// The ninja binary of [`NINJA_WHEEL`], unpacked as `<dir>/ninja` (mode 0755).
pub fn ninja(dir: &Path) -> PathBuf {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let (_, wheel) = tool_wheels();
    let mut zip = zip::ZipArchive::new(fs::File::open(&wheel).unwrap()).unwrap();
    let mut entry = zip
        .by_name("ninja-1.13.0.data/scripts/ninja")
        .expect("the ninja wheel's binary");
    let mut bytes = Vec::new();
    entry.read_to_end(&mut bytes).unwrap();
    fs::create_dir_all(dir).unwrap();
    let out = dir.join("ninja");
    fs::write(&out, bytes).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o755)).unwrap();
    out
}
