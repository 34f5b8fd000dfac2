//! verify's static level holds the environment to exactly one NCCL, of the locked release:
//! every libnccl.so* under the roots named, its release read from the library's own version
//! string. The libraries are real shared objects (gcc, testkit's `native`).

mod common;

use std::path::Path;

use common::*;
use commstack_verify::static_level::check_static;
use commstack_verify::{Check, Expectations, Status};

fn nccl_check(site: &Path, want: Option<&str>) -> Check {
    let expect = Expectations {
        nccl_version: want.map(|v| v.parse().unwrap()),
        ..Expectations::new()
    };
    let findings = check_static(&[site.to_path_buf()], &expect);
    findings
        .checks
        .into_iter()
        .find(|c| c.name == "static.nccl.one")
        .expect("the static level has static.nccl.one")
}

#[test]
fn one_nccl_of_the_locked_release_passes() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    let lib = site.join("nvidia/nccl/lib/libnccl.so.2");
    let c = nccl_check(&site, Some("2.28.9"));
    assert_eq!(c.status, Status::Passed, "{c:?}");
    assert_eq!(
        c.detail,
        format!(
            "one NCCL: {} (NCCL 2.28.9), the locked release (its version string)",
            lib.display()
        )
    );
    // Another locked release (an [nccl] override the environment did not get) fails.
    let c = nccl_check(&site, Some("2.30.7"));
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert_eq!(
        c.detail,
        format!(
            "{} is NCCL 2.28.9; the lock pins NCCL 2.30.7",
            lib.display()
        )
    );
}

#[test]
fn two_libnccl_so_2_fail_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    // A second NCCL from another package (as cupy or a plugin wheel would bring one), of
    // the newer release DeepEP V2 wants: installed beside torch's, not in place of it.
    let second = nccl_lib(&site.join("cupy_backends/cuda/libs"), 23007);
    let first = site.join("nvidia/nccl/lib/libnccl.so.2");
    let c = nccl_check(&site, Some("2.28.9"));
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(
        c.detail.starts_with(&format!(
            "2 NCCL libraries in the environment: {} (NCCL 2.30.7), {} (NCCL 2.28.9)",
            second.display(),
            first.display()
        )),
        "{}",
        c.detail
    );
    // Without an expected release, two are still two.
    assert_eq!(nccl_check(&site, None).status, Status::Failed);
}

#[test]
fn an_nccl_without_a_version_string_cannot_be_the_locked_one() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site-packages");
    let lib = shared_lib(
        &site.join("nvidia/nccl/lib"),
        "libnccl.so.2",
        "libnccl.so.2",
        "int ncclGetVersion(int *v) { *v = 22809; return 0; }",
        &[],
    );
    let c = nccl_check(&site, Some("2.28.9"));
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(
        c.detail.starts_with(&format!(
            "{} has no `NCCL version X.Y.Z` string",
            lib.display()
        )),
        "{}",
        c.detail
    );
}

#[test]
fn the_one_nccl_must_be_libnccl_so_2() {
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site-packages");
    let lib = shared_lib(
        &site.join("nvidia/nccl/lib"),
        "libnccl.so.3",
        "libnccl.so.3",
        "__attribute__((used)) const char v[] = \"NCCL version 3.0.0+cuda13.0\";",
        &[],
    );
    let c = nccl_check(&site, Some("3.0.0"));
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert_eq!(
        c.detail,
        format!(
            "{}'s SONAME is libnccl.so.3, not libnccl.so.2: torch cannot load it as its NCCL",
            lib.display()
        )
    );
}
