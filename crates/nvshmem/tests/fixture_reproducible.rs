//! The same NVSHMEM step key gives the same bytes from two stores in two homes, with two
//! job counts and a toolchain from wheels at two places: the fixture project through the
//! real recipe (cmake, ninja, gcc), its install and its drop-in wheel compared file by file.

mod common;

use std::path::Path;

use common::*;
use commstack_digest::manifest::{differences, manifest};
use commstack_nvshmem::{BuildRequest, DropInSpec, NvshmemOptions, build, build_dropin_wheel};
use commstack_store::{FIXED_BUILD_ROOT, Store};
use commstack_toolchain::{Toolchain, ToolchainSource, WheelPin};

/// The fixture toolchain as if provisioned from wheels into a store step at `dir`: its
/// paths differ between homes, its identity does not.
fn wheel_toolchain(dir: &Path) -> Toolchain {
    let mut tc = fixture_toolchain(dir);
    tc.source = ToolchainSource::Wheels {
        wheels: vec![WheelPin {
            filename: "fixture-toolchain.whl".into(),
            sha256: "0".repeat(64),
        }],
        step: dir.to_path_buf(),
    };
    tc
}

#[test]
fn two_homes_and_job_counts_give_identical_install_and_wheel() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // rdma-core is a prefix of this machine, the same for both homes (it is in the key).
    let shared = tempfile::tempdir().unwrap();
    let source = fixture_source();
    let options = NvshmemOptions {
        cuda_archs: vec!["90-real".parse().unwrap()],
        rdma_core: Some(fake_rdma_core(shared.path())),
        ..Default::default()
    };
    let spec = DropInSpec {
        cuda_major: 13,
        torch_pin: "3.4.5".into(),
        allow_version_mismatch: false,
    };
    let mut outputs = Vec::new();
    for (home, jobs) in [(a.path(), 1), (b.path(), 3)] {
        let tc = wheel_toolchain(&home.join("toolchain-step"));
        let store = Store::open(home.join("store")).unwrap();
        let req = BuildRequest {
            source_dir: &source,
            source_tree_sha256: "sha256:fixture",
            options: &options,
            toolchain: &tc,
            python3: "/usr/bin/python3".into(),
            passthrough: Default::default(),
            jobs,
            progress: &|_| {},
        };
        let built = build(&store, &req, false).unwrap();
        assert!(
            built.report.proof.passed(),
            "{:?}",
            built.report.proof.failures
        );
        // The recorded CUDA home is the fixed directory's link, not this home's toolchain.
        let cuda_home = &built.report.proof.build_vars["CUDA_HOME"];
        assert!(
            cuda_home.starts_with(FIXED_BUILD_ROOT)
                && !cuda_home.contains(&*home.to_string_lossy()),
            "{cuda_home}"
        );
        let (wheel, _) = build_dropin_wheel(&store, &built, &spec, false).unwrap();
        outputs.push((built.key.clone(), built.prefix.clone(), wheel));
    }
    let ((ka, pa, wa), (kb, pb, wb)) = (&outputs[0], &outputs[1]);
    assert_eq!(ka, kb, "the key does not depend on the home");
    let skip = |_: &str| false;
    let (ma, mb) = (manifest(pa, &skip).unwrap(), manifest(pb, &skip).unwrap());
    assert!(ma.keys().any(|f| f.starts_with("lib/")), "{ma:?}");
    assert_eq!(differences(&ma, &mb), Vec::<(String, String)>::new());
    assert_eq!(wa.filename, wb.filename);
    assert_eq!(
        wa.sha256,
        wb.sha256,
        "the drop-in wheels differ: {} and {}",
        wa.wheel.display(),
        wb.wheel.display()
    );
}
