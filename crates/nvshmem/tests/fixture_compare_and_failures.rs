//! Failures keep their logs and say where; the wheel comparison accounts for every
//! difference or fails.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use commstack_nvshmem::{
    BuildRequest, DifferenceKind, DropInSpec, NvshmemOptions, build, build_dropin_wheel,
    compare_wheels, copy_tree,
};
use commstack_store::Store;
use commstack_wheel::{Wheel, WheelBuilder};

fn request<'a>(
    source: &'a Path,
    options: &'a NvshmemOptions,
    tc: &'a commstack_toolchain::Toolchain,
) -> BuildRequest<'a> {
    BuildRequest {
        source_dir: source,
        source_tree_sha256: "sha256:test",
        options,
        toolchain: tc,
        python3: "/usr/bin/python3".into(),
        passthrough: Default::default(),
        jobs: 2,
        progress: &|_| {},
    }
}

#[test]
fn a_failed_build_keeps_its_log_and_prints_the_first_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let tc = fixture_toolchain(tmp.path());
    let store = Store::open(tmp.path().join("store")).unwrap();
    let src = tmp.path().join("src");
    copy_tree(&fixture_source(), &src).unwrap();
    fs::write(src.join("src/host/init.c"), "this is not C;\n").unwrap();
    let mut options = NvshmemOptions::default();
    options.switches.set("ibgda", false);
    let req = request(&src, &options, &tc);
    let err = format!("{:#}", build(&store, &req, false).unwrap_err());
    assert!(err.contains("ninja build failed"), "{err}");
    assert!(err.contains("error:"), "first error lines missing: {err}");
    let key = commstack_nvshmem::build_key(&req).unwrap().0;
    let log = store.failed_path(&key).join("logs/build.log");
    assert!(err.contains(&log.display().to_string()), "{err}");
    assert!(fs::read_to_string(&log).unwrap().contains("init.c"));
    assert!(
        store.lookup(&key).is_none(),
        "a failed build must not look done"
    );

    // IBGDA without rdma-core: refused before anything runs, naming the packages.
    let no_rdma = NvshmemOptions {
        rdma_core: Some(tmp.path().join("empty")),
        ..Default::default()
    };
    let err = build(&store, &request(&fixture_source(), &no_rdma, &tc), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("libibverbs-dev") && err.contains("ibverbs-providers"),
        "{err}"
    );
}

/// A stand-in for NVIDIA's wheel made from ours: what NVIDIA ships differently.
fn reference_wheel(
    ours: &Path,
    out: &Path,
    edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>,
    extra: &[(&str, &[u8])],
) -> std::path::PathBuf {
    let w = Wheel::open(ours).unwrap();
    let mut b = WheelBuilder::new("nvidia-nvshmem-cu13", "3.4.5")
        .unwrap()
        .tag("py3", "none", "manylinux2014_x86_64")
        .root_is_purelib(true);
    for e in &w.entries {
        if e.path.starts_with(&w.dist_info) || e.is_dir {
            continue;
        }
        if let Some(bytes) = edit(&e.path, w.read(&e.path).unwrap()) {
            b.add_bytes(&e.path, bytes, false).unwrap();
        }
    }
    for (p, bytes) in extra {
        b.add_bytes(p, bytes.to_vec(), false).unwrap();
    }
    b.add_dist_info_bytes("top_level.txt", b"nvidia\n".to_vec())
        .unwrap();
    b.write(out).unwrap().path
}

#[test]
fn every_difference_with_the_reference_wheel_is_explained_or_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let tc = fixture_toolchain(tmp.path());
    let store = Store::open(tmp.path().join("store")).unwrap();
    let options = NvshmemOptions {
        rdma_core: Some(fake_rdma_core(tmp.path())),
        ..Default::default()
    };
    let src = fixture_source();
    let built = build(&store, &request(&src, &options, &tc), false).unwrap();
    let spec = DropInSpec {
        cuda_major: 13,
        torch_pin: "3.4.5".into(),
        allow_version_mismatch: false,
    };
    let (ours, _) = build_dropin_wheel(&store, &built, &spec, false).unwrap();

    // NVIDIA's differs: NCCL and UCX on, an extra transport, the bitcode library,
    // another build string, other binaries.
    let nvidia_like = |path: &str, bytes: Vec<u8>| -> Option<Vec<u8>> {
        let text = || String::from_utf8(bytes.clone()).unwrap();
        Some(if path.ends_with("nvshmem_build_options.h") {
            text()
                .replace("/* #undef NVSHMEM_USE_NCCL */", "#define NVSHMEM_USE_NCCL")
                .replace(
                    "/* #undef NVSHMEM_UCX_SUPPORT */",
                    "#define NVSHMEM_UCX_SUPPORT",
                )
                .into_bytes()
        } else if path.ends_with("nvshmem_version.h") {
            text()
                .replace("NVSHMEM_USE_NCCL=OFF", "NVSHMEM_USE_NCCL=ON")
                .into_bytes()
        } else if path.ends_with("libnvshmem_host.so.3") {
            [bytes, b"nvidia".to_vec()].concat()
        } else {
            bytes
        })
    };
    let extra: [(&str, &[u8]); 2] = [
        (
            "nvidia/nvshmem/lib/nvshmem_transport_ucx.so.3",
            b"\x7fELF ucx",
        ),
        ("nvidia/nvshmem/lib/libnvshmem_device.bc", b"BC\xc0\xde"),
    ];
    let theirs = reference_wheel(&ours.wheel, &tmp.path().join("ref1"), nvidia_like, &extra);
    let c = compare_wheels(&ours.wheel, &theirs, &options).unwrap();
    assert!(c.passed(), "{}", c.render());
    let kind_of = |p: &str| c.differences.iter().find(|d| d.path == p).map(|d| d.kind);
    assert_eq!(
        kind_of("nvidia/nvshmem/lib/libnvshmem_device.bc"),
        Some(DifferenceKind::OnlyTheirs)
    );
    assert_eq!(
        kind_of("nvidia/nvshmem/lib/nvshmem_transport_ucx.so.3"),
        Some(DifferenceKind::OnlyTheirs)
    );
    assert_eq!(
        kind_of("nvidia/nvshmem/include/non_abi/nvshmem_build_options.h"),
        Some(DifferenceKind::ContentDiffers)
    );
    assert!(
        c.identical
            .iter()
            .any(|p| p == "nvidia/nvshmem/include/nvshmem.h")
    );
    let text = c.render();
    assert!(
        text.contains("torch's Triton") && text.contains("nvshmem.ucx is off"),
        "{text}"
    );

    // A device-ABI define that differs, and a changed public header: unexplained.
    let abi_break = |path: &str, bytes: Vec<u8>| -> Option<Vec<u8>> {
        let text = || String::from_utf8(bytes.clone()).unwrap();
        Some(if path.ends_with("nvshmem_build_options.h") {
            text()
                .replace(
                    "/* #undef NVSHMEM_TIMEOUT_DEVICE_POLLING */",
                    "#define NVSHMEM_TIMEOUT_DEVICE_POLLING",
                )
                .into_bytes()
        } else if path.ends_with("include/nvshmem.h") {
            format!("{}\nint nvshmem_other(void);\n", text()).into_bytes()
        } else {
            bytes
        })
    };
    let theirs = reference_wheel(&ours.wheel, &tmp.path().join("ref2"), abi_break, &[]);
    let c = compare_wheels(&ours.wheel, &theirs, &options).unwrap();
    let bad: Vec<&str> = c.unexplained().iter().map(|d| d.path.as_str()).collect();
    assert_eq!(
        bad,
        [
            "nvidia/nvshmem/include/non_abi/nvshmem_build_options.h",
            "nvidia/nvshmem/include/nvshmem.h"
        ],
        "{}",
        c.render()
    );
    assert_eq!(
        c.abi_defines["NVSHMEM_TIMEOUT_DEVICE_POLLING"],
        (false, true)
    );
}
