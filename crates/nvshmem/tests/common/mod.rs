//! Shared by the fixture tests: real cmake and ninja from their PyPI wheels, and a
//! toolchain description around them (the fixture is C only: no nvcc is called).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource, host_compilers};
use commstack_wheel::{InstallLayout, install};

pub const CMAKE_WHEEL: &str = "cmake-4.4.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
pub const NINJA_WHEEL: &str =
    "ninja-1.13.0-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

pub fn fixture_source() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvshmem-contract")
}

/// The cmake and ninja wheels: from `$COMMSTACK_TEST_WHEELS`, `scratch/wheels` or
/// `.tools/wheels`; else downloaded once from PyPI (31 MB) into `.tools/wheels`.
fn tool_wheels() -> (PathBuf, PathBuf) {
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

/// A toolchain whose cmake and ninja are the real ones from the wheels, with a fake
/// CUDA home (the fixture only writes its path into the build-variable string).
pub fn fixture_toolchain(dir: &Path) -> Toolchain {
    let (cmake_whl, ninja_whl) = tool_wheels();
    let tools = dir.join("tools");
    let layout = InstallLayout::prefix(&tools);
    install(&cmake_whl, &layout).unwrap();
    install(&ninja_whl, &layout).unwrap();
    let cuda_home = dir.join("cuda");
    fs::create_dir_all(cuda_home.join("bin")).unwrap();
    let host = host_compilers().unwrap();
    Toolchain {
        source: ToolchainSource::System,
        cuda_home: cuda_home.clone(),
        nvcc: cuda_home.join("bin/nvcc"),
        cuda_include_dirs: vec![],
        cudart_lib_dir: cuda_home.join("lib"),
        cuda_stubs_dir: None,
        cmake: tools.join("cmake/data/bin/cmake"),
        ninja: tools.join("bin/ninja"),
        cc: host.cc,
        cxx: host.cxx,
        versions: ToolVersions {
            nvcc: "none (fixture)".into(),
            cuda: "13.0".into(),
            cmake: "4.4.3".into(),
            ninja: "1.13.0".into(),
            cc: host.cc_version,
            cxx: host.cxx_version,
        },
    }
}

/// An rdma-core prefix as `dpkg -x` leaves it (the fixture includes nothing from it).
pub fn fake_rdma_core(dir: &Path) -> PathBuf {
    let p = dir.join("rdma-core");
    let inc = p.join("usr/include/infiniband");
    fs::create_dir_all(&inc).unwrap();
    fs::write(inc.join("mlx5dv.h"), "/* fixture */\n").unwrap();
    fs::write(inc.join("verbs.h"), "/* fixture */\n").unwrap();
    let lib = p.join("usr/lib/x86_64-linux-gnu");
    fs::create_dir_all(&lib).unwrap();
    fs::write(lib.join("libmlx5.so.1"), "").unwrap();
    std::os::unix::fs::symlink("libmlx5.so.1", lib.join("libmlx5.so")).unwrap();
    p
}

pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
