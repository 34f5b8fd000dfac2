//! Native test fixtures built from real parts: C and C++ shared objects compiled with the
//! system gcc/g++, an NVSHMEM-like library that embeds the build-variable string, NVIDIA's
//! NVSHMEM wheel when it has been unpacked, and `readelf` as an independent reader.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `source` (C, or C++ when `name` ends in .cpp) with `args` into `out`.
pub fn compile(dir: &Path, name: &str, source: &str, out: &Path, args: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let src = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let compiler = if name.ends_with(".cpp") { "g++" } else { "gcc" };
    let status = Command::new(compiler)
        .arg(&src)
        .args(args)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e} (the tests need gcc and g++)"));
    assert!(status.success(), "{compiler} failed on {name}");
}

/// A shared object `lib` (file name) with SONAME `soname`, built from C `source`.
pub fn shared_lib(dir: &Path, file: &str, soname: &str, source: &str, extra: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join(file);
    let soname_flag = format!("-Wl,-soname,{soname}");
    let mut args = vec!["-shared", "-fPIC", "-O1", soname_flag.as_str()];
    args.extend_from_slice(extra);
    // The source goes to `.src/` beside it: a library directory (or a wheel made from
    // one) holds only libraries.
    compile(&dir.join(".src"), &format!("{file}.c"), source, &out, &args);
    out
}

/// C source of a library that embeds an NVSHMEM-style build-variable string and vendor
/// string, laid out the way NVSHMEM's own (`#define NVSHMEM_BUILD_VARS "..."`).
pub fn nvshmem_like_source(use_nccl: &str, version: &str, extra_c: &str) -> String {
    format!(
        r#"
#include <stdio.h>
#define NVSHMEM_BUILD_VARS "NVSHMEM_DEBUG=OFF NVSHMEM_DEVEL=OFF NVSHMEM_IBGDA_SUPPORT=ON NVSHMEM_IBRC_SUPPORT=OFF NVSHMEM_MPI_SUPPORT=OFF NVSHMEM_SHMEM_SUPPORT=OFF NVSHMEM_UCX_SUPPORT=OFF NVSHMEM_USE_NCCL={use_nccl} NVSHMEM_USE_GDRCOPY=OFF CUDA_HOME=/opt/commstack/cuda NCCL_HOME=/usr/local/nccl NVSHMEM_PREFIX=/opt/commstack/nvshmem"
#define NVSHMEM_VENDOR_STRING "NVSHMEM v{version}"
void nvshmemi_print_build_info(void) {{
    printf("  %-28s\n\t%s\n", "Build Variables", NVSHMEM_BUILD_VARS);
    printf("%s\n", NVSHMEM_VENDOR_STRING);
}}
{extra_c}
"#
    )
}

/// Where NVIDIA's nvidia-nvshmem-cu13 3.4.5 wheel is unpacked: `$COMMSTACK_NVSHMEM_WHEEL_DIR`,
/// or `<workspace>/scratch/nvidia-nvshmem-cu13-3.4.5`. Get it with
/// `pip download --no-deps nvidia-nvshmem-cu13==3.4.5 -d scratch && python3 -m zipfile -e
/// scratch/nvidia_nvshmem_cu13-3.4.5-*.whl scratch/nvidia-nvshmem-cu13-3.4.5`.
/// Panics with that instruction when absent: only `#[ignore]`d tests call it.
pub fn nvidia_nvshmem_lib() -> PathBuf {
    let root = std::env::var_os("COMMSTACK_NVSHMEM_WHEEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scratch/nvidia-nvshmem-cu13-3.4.5")
        });
    let lib = root.join("nvidia/nvshmem/lib");
    assert!(
        lib.join("libnvshmem_host.so.3").is_file(),
        "NVIDIA's NVSHMEM wheel is not unpacked at {}: run `pip download --no-deps nvidia-nvshmem-cu13==3.4.5 -d scratch && python3 -m zipfile -e scratch/nvidia_nvshmem_cu13-3.4.5-*.whl scratch/nvidia-nvshmem-cu13-3.4.5` in the workspace, or set COMMSTACK_NVSHMEM_WHEEL_DIR",
        root.display()
    );
    lib
}

/// `readelf -V` as an independent reading of .gnu.version_r: (file, version) pairs.
pub fn readelf_needed_versions(path: &Path) -> Vec<(String, String)> {
    let out = Command::new("readelf")
        .arg("-V")
        .arg("-W")
        .arg(path)
        .output()
        .expect("readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut pairs = Vec::new();
    let mut in_needs = false;
    let mut file = String::new();
    for line in text.lines() {
        if line.starts_with("Version needs section") {
            in_needs = true;
            continue;
        }
        if line.starts_with("Version ") && !line.contains("needs") {
            in_needs = false;
        }
        if !in_needs {
            continue;
        }
        if let Some(rest) = line.split("File: ").nth(1) {
            file = rest.split_whitespace().next().unwrap().to_string();
        } else if let Some(rest) = line.split("Name: ").nth(1) {
            pairs.push((
                file.clone(),
                rest.split_whitespace().next().unwrap().to_string(),
            ));
        }
    }
    pairs
}
