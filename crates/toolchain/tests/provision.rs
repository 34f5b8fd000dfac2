//! Provision the real CUDA 13.0 / cmake / ninja wheels into a store and use them.
//!
//! Needs the wheels (about 130 MB): put them in `$COMMSTACK_TOOLCHAIN_WHEELS` (default
//! `<repo>/scratch/wheels`), e.g. with
//! `pip download --no-deps --only-binary=:all: --platform manylinux2014_x86_64 -d scratch/wheels
//!  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
//!  nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-nvtx==13.0.85
//!  nvidia-nvml-dev==13.0.87 cmake==4.4.3 ninja==1.13.0`,
//! then `cargo test -p commstack-toolchain -- --ignored`.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use commstack_store::Store;
use commstack_toolchain::{REQUIRED_WHEELS, ToolchainSource, WheelInput, provision_wheels};
use commstack_wheel::{WheelFilename, normalize_name};
use sha2::{Digest, Sha256};

fn wheel_dir() -> PathBuf {
    std::env::var_os("COMMSTACK_TOOLCHAIN_WHEELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scratch/wheels"))
}

fn inputs() -> Vec<WheelInput> {
    let dir = wheel_dir();
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (see this file's header)", dir.display()))
    {
        let path = entry.unwrap().path();
        let filename = path.file_name().unwrap().to_str().unwrap().to_string();
        let Ok(f) = WheelFilename::parse(&filename) else {
            continue;
        };
        if !REQUIRED_WHEELS.contains(&normalize_name(&f.name).as_str()) {
            continue;
        }
        let sha256 = hex::encode(Sha256::digest(fs::read(&path).unwrap()));
        out.push(WheelInput {
            filename,
            path,
            sha256,
        });
    }
    out
}

#[test]
#[ignore = "needs the CUDA 13.0 toolchain wheels (130 MB) in scratch/wheels"]
fn provisions_wheels_and_nvcc_compiles() {
    let wheels = inputs();
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path().join("store")).unwrap();
    let first = provision_wheels(&store, &wheels, false).unwrap();
    assert!(!first.outcome.was_cached());
    let tc = &first.toolchain;
    assert!(matches!(tc.source, ToolchainSource::Wheels { .. }));
    assert_eq!(tc.versions.nvcc, "13.0.88");
    assert_eq!(tc.versions.cuda, "13.0");
    assert_eq!(tc.cuda_major(), 13);
    assert_eq!(tc.versions.cmake, "4.4.3");
    assert!(tc.versions.ninja.starts_with("1.13.0"));
    // The real binary, not a link, with its profile beside it.
    assert!(
        fs::symlink_metadata(&tc.nvcc)
            .unwrap()
            .file_type()
            .is_file()
    );
    assert!(tc.nvcc.with_file_name("nvcc.profile").is_file());
    assert!(tc.cudart_lib_dir.ends_with("targets/x86_64-linux/lib"));
    assert!(tc.cudart_lib_dir.join("libcudart_static.a").is_file());
    assert!(
        tc.cuda_include_dirs
            .iter()
            .any(|d| d.join("cuda/std/tuple").is_file()),
        "cccl include dir"
    );
    assert!(
        tc.cuda_stubs_dir
            .as_ref()
            .unwrap()
            .join("libcuda.so")
            .is_file()
    );
    assert!(tc.cuda_include_dirs[0].join("nvtx3/nvToolsExt.h").is_file());
    assert!(tc.cuda_include_dirs[0].join("nvml.h").is_file());

    // A kernel + host program links against cudart and the libcuda stub.
    let work = tmp.path().join("work");
    fs::create_dir_all(&work).unwrap();
    fs::write(
        work.join("k.cu"),
        "#include <cuda.h>\n#include <cuda/std/tuple>\n__global__ void k(int*p){*p=cuda::std::get<0>(cuda::std::make_tuple(7));}\n\
         int main(){ CUdevice d; return cuDeviceGet(&d, 0) == CUDA_SUCCESS; }\n",
    )
    .unwrap();
    let out = Command::new(&tc.nvcc)
        .args(["-arch=sm_90", "-ccbin"])
        .arg(&tc.cc)
        .arg(work.join("k.cu"))
        .arg("-o")
        .arg(work.join("k"))
        .arg(format!(
            "-L{}",
            tc.cuda_stubs_dir.as_ref().unwrap().display()
        ))
        .arg("-lcuda")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // cmake from the wheel finds its modules; ninja runs.
    let v = Command::new(&tc.cmake)
        .arg("--system-information")
        .output()
        .unwrap();
    assert!(v.status.success());

    // "System" mode over the same tree (as on a machine with CUDA installed): versions are
    // read from the tools, the source says system.
    let sys = commstack_toolchain::system(&commstack_toolchain::SystemOptions {
        cuda_home: tc.cuda_home.clone(),
        cmake: Some(tc.cmake.clone()),
        ninja: Some(tc.ninja.clone()),
    })
    .unwrap();
    assert_eq!(sys.source, ToolchainSource::System);
    assert_eq!(sys.versions, tc.versions);
    assert!(sys.describe().starts_with("system: nvcc 13.0.88"));
    assert!(sys.cudart_lib_dir.ends_with("targets/x86_64-linux/lib"));

    let second = provision_wheels(&store, &wheels, false).unwrap();
    assert!(second.outcome.was_cached());
    assert_eq!(second.toolchain, first.toolchain);
}

#[test]
fn an_incomplete_set_is_refused_naming_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let w = WheelInput {
        filename: "cmake-4.4.3-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl".into(),
        path: tmp.path().join("nope.whl"),
        sha256: "0".repeat(64),
    };
    let err = provision_wheels(&store, &[w], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nvidia-cuda-nvcc") && err.contains("ninja"),
        "{err}"
    );
}

/// cuobjdump (DeepEP V2's stacks lock it for the JIT) may join the set; another
/// distribution may not.
#[test]
fn cuobjdump_may_join_the_set_and_others_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(tmp.path()).unwrap();
    let w = |filename: &str| WheelInput {
        filename: filename.into(),
        path: tmp.path().join("nope.whl"),
        sha256: "0".repeat(64),
    };
    let err = provision_wheels(
        &store,
        &[w(
            "nvidia_cuda_cuobjdump-13.4.92-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        )],
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("lack") && err.contains("nvidia-cuda-nvcc"),
        "{err}"
    );
    let err = provision_wheels(
        &store,
        &[w(
            "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl",
        )],
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("nvidia-cublas is not part of the toolchain")
            && err.contains("nvidia-cuda-cuobjdump"),
        "{err}"
    );
}
