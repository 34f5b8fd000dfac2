//! The recipe against the real NVSHMEM source with the PyPI CUDA 13.0 toolchain.
//!
//! Needs (none of it in git): the NVSHMEM 3.4.5 source unpacked in
//! `$COMMSTACK_NVSHMEM_SOURCE` (default `scratch/nvshmem-3.4.5`), the toolchain wheels in
//! `$COMMSTACK_TOOLCHAIN_WHEELS` (default `scratch/wheels`), rdma-core headers in
//! `$COMMSTACK_RDMA_CORE` (default `scratch/rdma-core`: `apt-get download libibverbs-dev
//! ibverbs-providers libibverbs1` + `dpkg -x`). Run with
//! `cargo test -p commstack-nvshmem --test real_nvshmem -- --ignored --nocapture`.

mod common;

use std::fs;
use std::path::PathBuf;

use common::repo_root;
use commstack_nvshmem::{
    BuildRequest, DropInSpec, NvshmemOptions, build, build_dropin_wheel, compare_wheels,
    configure_only,
};
use commstack_store::Store;
use commstack_toolchain::{REQUIRED_WHEELS, WheelInput, provision_wheels};
use sha2::{Digest, Sha256};

fn path_env(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(default))
}

fn toolchain(store: &Store) -> commstack_toolchain::Toolchain {
    let dir = path_env("COMMSTACK_TOOLCHAIN_WHEELS", "scratch/wheels");
    let mut wheels = Vec::new();
    for e in fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let filename = path.file_name().unwrap().to_str().unwrap().to_string();
        let Ok(f) = commstack_wheel::WheelFilename::parse(&filename) else {
            continue;
        };
        if REQUIRED_WHEELS.contains(&commstack_wheel::normalize_name(&f.name).as_str()) {
            let sha256 = hex::encode(Sha256::digest(fs::read(&path).unwrap()));
            wheels.push(WheelInput {
                filename,
                path,
                sha256,
            });
        }
    }
    provision_wheels(store, &wheels, false).unwrap().toolchain
}

fn options() -> NvshmemOptions {
    NvshmemOptions {
        rdma_core: Some(path_env("COMMSTACK_RDMA_CORE", "scratch/rdma-core")),
        ..Default::default()
    }
}

#[test]
#[ignore = "needs the NVSHMEM source, the CUDA toolchain wheels and rdma-core in scratch/"]
fn real_nvshmem_configures_with_the_options_asked() {
    let store = Store::open(repo_root().join("scratch/test-store")).unwrap();
    let tc = toolchain(&store);
    let source = path_env("COMMSTACK_NVSHMEM_SOURCE", "scratch/nvshmem-3.4.5");
    let opts = options();
    unsafe { std::env::set_var("NVSHMEM_USE_NCCL", "1") };
    let req = BuildRequest {
        source_dir: &source,
        source_tree_sha256: "sha256:unhashed-test",
        options: &opts,
        toolchain: &tc,
        python3: "/usr/bin/python3".into(),
        passthrough: Default::default(),
        jobs: 2,
        progress: &|l| eprintln!("{l}"),
    };
    let work = tempfile::tempdir().unwrap();
    let cache = configure_only(&req, work.path()).unwrap();
    for (k, v) in [
        ("NVSHMEM_USE_NCCL", "OFF"),
        ("NVSHMEM_IBGDA_SUPPORT", "ON"),
        ("NVSHMEM_MPI_SUPPORT", "OFF"),
        ("NVSHMEM_IBRC_SUPPORT", "OFF"),
        ("NVSHMEM_BUILD_PYTHON_LIB", "OFF"),
        ("NVSHMEM_BUILD_TESTS", "OFF"),
        ("CMAKE_CUDA_ARCHITECTURES", "90"),
        ("NCCL_HOME", "/nonexistent/commstack-unused/nccl"),
    ] {
        assert_eq!(cache.get(k).map(String::as_str), Some(v), "{k}");
    }
    let log = fs::read_to_string(work.path().join("logs/configure.log")).unwrap();
    assert!(log.contains("-- Generating done"), "{log}");
}

/// The whole build: about 30 min on 2 cores. Also needs COMMSTACK_REAL_BUILD=1.
#[test]
#[ignore = "a full NVSHMEM build (~30 min on 2 cores)"]
fn real_nvshmem_builds_and_proves() {
    assert!(
        std::env::var_os("COMMSTACK_REAL_BUILD").is_some(),
        "set COMMSTACK_REAL_BUILD=1 to run the full build (about 30 min on 2 cores)"
    );
    let store = Store::open(repo_root().join("scratch/test-store")).unwrap();
    let tc = toolchain(&store);
    let source = path_env("COMMSTACK_NVSHMEM_SOURCE", "scratch/nvshmem-3.4.5");
    let tree = "sha256:unhashed-test".to_string();
    let opts = options();
    let req = BuildRequest {
        source_dir: &source,
        source_tree_sha256: &tree,
        options: &opts,
        toolchain: &tc,
        python3: "/usr/bin/python3".into(),
        passthrough: Default::default(),
        jobs: 2,
        progress: &|l| eprintln!("{l}"),
    };
    let built = build(&store, &req, false).unwrap();
    println!(
        "{}",
        serde_json::to_string_pretty(&built.report.proof).unwrap()
    );
    println!("timings: {:?}", built.report.timings);
    assert!(built.report.proof.passed());

    // The drop-in wheel, compared file by file with NVIDIA's of the same version.
    let spec = DropInSpec {
        cuda_major: 13,
        torch_pin: "3.4.5".into(),
        allow_version_mismatch: false,
    };
    let (dropin, _) = build_dropin_wheel(&store, &built, &spec, false).unwrap();
    println!(
        "wheel: {} ({:?})",
        dropin.wheel.display(),
        dropin.platform_tags
    );
    let nvidia = path_env(
        "COMMSTACK_NVIDIA_NVSHMEM_WHEEL",
        "scratch/wheels/nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    );
    if nvidia.is_file() {
        let c = compare_wheels(&dropin.wheel, &nvidia, &opts).unwrap();
        println!("{}", c.render());
        assert!(c.passed(), "unexplained differences with NVIDIA's wheel");
    }
}
