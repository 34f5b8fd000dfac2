//! Shared by the fixture tests: real cmake and ninja from their PyPI wheels, and a
//! toolchain description around them (the fixture is C only: no nvcc is called).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource, host_compilers};
use commstack_wheel::{InstallLayout, install};

#[allow(unused_imports)] // not every test binary uses both
pub use commstack_testkit::build_tools::{repo_root, tool_wheels};

pub fn fixture_source() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvshmem-contract")
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
