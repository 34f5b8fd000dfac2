//! The `cuda/std/tuple` trap on CUDA 13, with NVIDIA's real headers: g++ (which compiles
//! DeepEP's .cpp files) does not find libcu++ under include/cccl by itself; the computed
//! environment's CPATH makes it.
//!
//! Needs the CUDA 13 cccl headers: `source kernels/dev-env.sh` (installs the pinned
//! compiler wheels into .tools/cuda), or COMMSTACK_CUDA_HOME=<a CUDA 13 home>, then
//! `cargo test -p commstack-deepep --test cccl -- --ignored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use commstack_deepep::env::{EnvInputs, build_env};
use commstack_stack::manifest::DeepEpApi;
use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource};

const USES_LIBCUXX: &str = "#include <cuda/std/tuple>\nint main() { cuda::std::tuple<int, int> t{1, 2}; return cuda::std::get<0>(t) - 1; }\n";

fn cuda_home() -> PathBuf {
    std::env::var_os("COMMSTACK_CUDA_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/cuda/nvidia/cu13")
        })
}

#[test]
#[ignore = "needs NVIDIA's CUDA 13 cccl headers: source kernels/dev-env.sh (or set COMMSTACK_CUDA_HOME), then run with --ignored"]
fn cuda_std_tuple_is_found_only_through_the_computed_cpath() {
    let home = cuda_home();
    let include = home.join("include");
    assert!(
        include.join("cccl/cuda/std/tuple").is_file(),
        "no CUDA 13 cccl headers under {}",
        include.display()
    );
    let tc = Toolchain {
        source: ToolchainSource::System,
        cuda_home: home.clone(),
        nvcc: home.join("bin/nvcc"),
        cuda_include_dirs: vec![include.clone(), include.join("cccl")],
        cudart_lib_dir: home.join("lib"),
        cuda_stubs_dir: Some(home.join("lib/stubs")),
        cmake: "/usr/bin/cmake".into(),
        ninja: "/usr/bin/ninja".into(),
        cc: "/usr/bin/gcc".into(),
        cxx: "/usr/bin/g++".into(),
        versions: ToolVersions {
            nvcc: "13.0.88".into(),
            cuda: "13.0".into(),
            cmake: "-".into(),
            ninja: "-".into(),
            cc: "-".into(),
            cxx: "-".into(),
        },
    };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("uses_libcuxx.cpp");
    std::fs::write(&src, USES_LIBCUXX).unwrap();
    let env = build_env(&EnvInputs {
        api: DeepEpApi::V1,
        python_bin_dir: Path::new("/nonexistent/bin"),
        toolchain: &tc,
        nvshmem_prefix: Path::new("/nonexistent/nvshmem"),
        nccl_root: None,
        extra_include: &[],
        torch_cuda_arch_list: "9.0",
        jobs: 1,
        home: dir.path(),
        tmp: dir.path(),
        git_ceiling: dir.path(),
        prefix_maps: &[],
        nvcc_objtemp: false,
        ld_wrapper_dir: None,
        source_date_epoch: commstack_deepep::reproducible::DEFAULT_SOURCE_DATE_EPOCH,
    })
    .unwrap();
    // torch's extension builder passes -I<CUDA_HOME>/include, not the cccl directory.
    let compile = |vars: &std::collections::BTreeMap<String, String>| {
        Command::new("g++")
            .args(["-std=c++17", "-fsyntax-only", "-I"])
            .arg(&include)
            .arg(&src)
            .env_clear()
            .envs(vars)
            .output()
            .unwrap()
    };
    let with = compile(&env.vars);
    assert!(
        with.status.success(),
        "{}",
        String::from_utf8_lossy(&with.stderr)
    );
    let mut without = env.vars.clone();
    without.remove("CPATH");
    let out = compile(&without);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cuda/std/tuple: No such file or directory")
    );
}
