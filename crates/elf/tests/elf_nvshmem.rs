//! The NVSHMEM proof on real ELF files: gcc-built libraries that embed a build-variable
//! string of NVSHMEM's format, and NVIDIA's own NCCL-on library when unpacked.

use std::collections::BTreeMap;

use commstack_elf::{ElfFile, NvshmemBuildVars, NvshmemVersion, find_build_vars};
use commstack_testkit::native::*;

fn expected(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn nccl_off_library_passes_the_proof() {
    let dir = tempfile::tempdir().unwrap();
    let lib = shared_lib(
        dir.path(),
        "libnvshmem_host.so.3",
        "libnvshmem_host.so.3",
        &nvshmem_like_source("OFF", "3.4.5", ""),
        &[],
    );
    let elf = ElfFile::open(&lib).unwrap();
    let info = elf.nvshmem_host_info().unwrap();
    assert_eq!(info.build_vars.use_nccl(), Some(false));
    assert_eq!(
        info.version,
        Some(NvshmemVersion {
            major: 3,
            minor: 4,
            patch: 5
        })
    );
    assert_eq!(
        info.build_vars.get("NVSHMEM_PREFIX"),
        Some("/opt/commstack/nvshmem")
    );
    assert_eq!(
        info.build_vars.get("NCCL_HOME"),
        Some("/usr/local/nccl"),
        "OFF builds still carry NCCL_HOME"
    );
    assert!(info.build_vars.raw.starts_with("NVSHMEM_DEBUG=OFF "));
    // `1` and `ON` are the same to CMake.
    let check = info.build_vars.check(&expected(&[
        ("NVSHMEM_IBGDA_SUPPORT", "1"),
        ("NVSHMEM_UCX_SUPPORT", "OFF"),
        ("NVSHMEM_PREFIX", "/opt/commstack/nvshmem"),
    ]));
    assert!(check.passed(), "{:?}", check.mismatches);
    assert!(elf.find_libnccl().unwrap().is_empty());
    assert!(
        elf.dynamic_info()
            .unwrap()
            .needed
            .iter()
            .all(|n| !n.contains("nccl"))
    );
}

#[test]
fn every_mismatch_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let lib = shared_lib(
        dir.path(),
        "libh.so",
        "libh.so",
        &nvshmem_like_source("ON", "3.4.5", ""),
        &[],
    );
    let info = ElfFile::open(&lib).unwrap().nvshmem_host_info().unwrap();
    let check = info.build_vars.check(&expected(&[
        ("NVSHMEM_IBGDA_SUPPORT", "OFF"),
        ("NVSHMEM_PMIX_SUPPORT", "OFF"),
        ("NVSHMEM_PREFIX", "/opt/other"),
    ]));
    let shown: Vec<String> = check.mismatches.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        shown,
        [
            "NVSHMEM_USE_NCCL: expected OFF, found ON",
            "NVSHMEM_IBGDA_SUPPORT: expected OFF, found ON",
            "NVSHMEM_PMIX_SUPPORT: expected OFF, absent from the build string",
            "NVSHMEM_PREFIX: expected /opt/other, found /opt/commstack/nvshmem",
        ]
    );
}

#[test]
fn dlopened_libnccl_is_found_without_any_dt_needed() {
    let dir = tempfile::tempdir().unwrap();
    // What NVIDIA's NCCL-on build does: dlopen by name, no link-time dependency.
    let dlopen = r#"
#include <dlfcn.h>
void *nvshmemi_load_nccl(void) { return dlopen("libnccl.so.2", RTLD_LAZY); }
"#;
    let lib = shared_lib(
        dir.path(),
        "libh.so",
        "libh.so",
        &nvshmem_like_source("ON", "3.4.5", dlopen),
        &["-ldl"],
    );
    let elf = ElfFile::open(&lib).unwrap();
    assert!(
        elf.dynamic_info()
            .unwrap()
            .needed
            .iter()
            .all(|n| !n.contains("nccl"))
    );
    let hits = elf.find_libnccl().unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0].section.as_deref(), Some(".rodata"));
    assert_eq!(hits[0].context, "libnccl.so.2");
    assert!(
        hits[0].segments.iter().any(|s| s.starts_with("PT_LOAD")),
        "{hits:?}"
    );
}

#[test]
fn two_different_build_strings_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let second =
        r#"const char other_build[] = "NVSHMEM_DEBUG=ON NVSHMEM_USE_NCCL=ON NCCL_HOME=/x";"#;
    let lib = shared_lib(
        dir.path(),
        "libh.so",
        "libh.so",
        &nvshmem_like_source("OFF", "3.4.5", second),
        &[],
    );
    let err = ElfFile::open(&lib)
        .unwrap()
        .nvshmem_host_info()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 different NVSHMEM build-variable strings"),
        "{err}"
    );
    assert!(err.contains("libh.so"), "the error names the file: {err}");
}

#[test]
fn a_library_without_a_build_string_is_not_nvshmem() {
    let err = ElfFile::open("/lib/x86_64-linux-gnu/libstdc++.so.6".as_ref())
        .unwrap()
        .nvshmem_host_info()
        .unwrap_err()
        .to_string();
    assert!(err.contains("no NVSHMEM build-variable string"), "{err}");
}

#[test]
fn build_string_parsing_keeps_every_byte() {
    let vars = NvshmemBuildVars::parse(
        "NVSHMEM_USE_NCCL=OFF MPI_HOME= CUDA_HOME=/opt/my cuda NVSHMEM_PREFIX=/p",
    )
    .unwrap();
    assert_eq!(vars.get("MPI_HOME"), Some(""));
    assert_eq!(vars.get("CUDA_HOME"), Some("/opt/my cuda"));
    assert!(
        NvshmemBuildVars::parse("NVSHMEM_DEBUG=OFF").is_err(),
        "no USE_NCCL key"
    );
    assert!(NvshmemBuildVars::parse("hello NVSHMEM_USE_NCCL=OFF").is_err());
    // The header NVSHMEM installs carries the same string.
    let header =
        b"#define NVSHMEM_BUILD_VARS \"NVSHMEM_DEBUG=OFF NVSHMEM_USE_NCCL=OFF NCCL_HOME=/n\"\n";
    let (_, vars) = find_build_vars(header).unwrap();
    assert_eq!(
        vars.raw,
        "NVSHMEM_DEBUG=OFF NVSHMEM_USE_NCCL=OFF NCCL_HOME=/n"
    );
}

#[test]
#[ignore = "needs NVIDIA's nvidia-nvshmem-cu13 3.4.5 wheel unpacked (see tests/common nvidia_nvshmem_lib); run with --ignored"]
fn nvidia_wheel_library_is_nccl_on() {
    let lib = nvidia_nvshmem_lib().join("libnvshmem_host.so.3");
    let elf = ElfFile::open(&lib).unwrap();
    let info = elf.nvshmem_host_info().unwrap();
    assert_eq!(
        info.version,
        Some(NvshmemVersion {
            major: 3,
            minor: 4,
            patch: 5
        })
    );
    assert_eq!(info.build_vars.use_nccl(), Some(true));
    assert_eq!(info.build_vars.get("NVSHMEM_IBGDA_SUPPORT"), Some("ON"));
    assert_eq!(
        info.build_vars.get("NCCL_HOME"),
        Some("/dvs/p4/build/sw/rel/gpgpu/toolkit/r13.0/nccl/build")
    );
    assert!(
        info.build_vars.vars.len() >= 30,
        "{:?}",
        info.build_vars.vars.keys()
    );
    let check = info.build_vars.check(&BTreeMap::new());
    assert_eq!(check.mismatches.len(), 1);
    assert_eq!(
        check.mismatches[0].to_string(),
        "NVSHMEM_USE_NCCL: expected OFF, found ON"
    );
    let hits = elf.find_libnccl().unwrap();
    assert!(
        hits.iter()
            .any(|h| h.context == "libnccl.so.2" && h.section.as_deref() == Some(".rodata")),
        "{hits:?}"
    );
    let dynamic = elf.dynamic_info().unwrap();
    assert_eq!(dynamic.soname.as_deref(), Some("libnvshmem_host.so.3"));
    assert!(
        dynamic.needed.iter().all(|n| !n.contains("nccl")),
        "NVIDIA dlopens NCCL: {:?}",
        dynamic.needed
    );
    assert_eq!(dynamic.rpath, ["${ORIGIN}"]);
}
