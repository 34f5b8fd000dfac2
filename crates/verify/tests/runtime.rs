//! The runtime level: maps parsing on recorded listings, the verdicts on gcc-built
//! libraries at realistic paths, and the whole path end to end in a real python3 whose
//! fake `torch` loads real shared objects the way torch's wheel does (DT_NEEDED + RPATH).

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use commstack_verify::Status;
use commstack_verify::expect::{Expectations, NcclVersion};
use commstack_verify::runtime::{
    ProbeOutput, PythonFacts, Role, check_runtime, mapped_files, role_of, run_probe,
};

const SITE: &str = "/opt/venv/lib/python3.12/site-packages";

fn maps_fixture() -> String {
    format!(
        "\
55d0c8a00000-55d0c8a2a000 r--p 00000000 08:01 1311 /usr/bin/python3.12
55d0ca1f4000-55d0ca3c6000 rw-p 00000000 00:00 0 [heap]
7f2b10000000-7f2b10021000 rw-p 00000000 00:00 0
7f2b1a000000-7f2b1a200000 r--p 00000000 08:01 2301 {SITE}/nvidia/nccl/lib/libnccl.so.2
7f2b1a200000-7f2b1c000000 r-xp 00200000 08:01 2301 {SITE}/nvidia/nccl/lib/libnccl.so.2
7f2b1d000000-7f2b1d100000 r--p 00000000 08:01 2402 {SITE}/nvidia/nvshmem/lib/libnvshmem_host.so.3
7f2b1d100000-7f2b1f000000 r-xp 00100000 08:01 2402 {SITE}/nvidia/nvshmem/lib/libnvshmem_host.so.3
7f2b1f800000-7f2b1f900000 r--p 00000000 08:01 2403 {SITE}/nvidia/nvshmem/lib/nvshmem_bootstrap_uid.so.3
7f2b20000000-7f2b20100000 r--p 00000000 08:01 2501 {SITE}/nvidia/cuda_runtime/lib/libcudart.so.13
7f2b21000000-7f2b21100000 r--p 00000000 08:01 2601 {SITE}/torch/lib/libtorch_nvshmem.so
7f2b21200000-7f2b21300000 r--p 00000000 08:01 2602 {SITE}/torch/lib/libnccl-net.so
7f2b21400000-7f2b21500000 r--p 00000000 08:01 2701 /opt/my libs/libnvshmem_device.bc (deleted)
7f2b21600000-7f2b21700000 r--p 00000000 08:01 2402 {SITE}/nvidia/nvshmem/lib/hardlink/libnvshmem_host.so.3
7ffd3e1c2000-7ffd3e1e3000 rw-p 00000000 00:00 0 [stack]
7ffd3e1f6000-7ffd3e1f8000 r-xp 00000000 00:00 0 [vdso]
"
    )
}

#[test]
fn maps_listing_yields_distinct_files_and_roles() {
    let files = mapped_files(&maps_fixture());
    let names: Vec<String> = files.iter().map(|f| f.path.display().to_string()).collect();
    assert_eq!(files.len(), 8, "{names:#?}");
    assert_eq!(files[0].path, Path::new("/usr/bin/python3.12"));
    let bc = files
        .iter()
        .find(|f| f.path.ends_with("libnvshmem_device.bc"))
        .unwrap();
    assert!(bc.deleted);
    assert_eq!(
        bc.path,
        Path::new("/opt/my libs/libnvshmem_device.bc"),
        "paths with spaces survive"
    );
    let roles: Vec<(String, Role)> = files
        .iter()
        .filter_map(|f| {
            Some((
                f.path.file_name()?.to_string_lossy().into_owned(),
                role_of(&f.path)?,
            ))
        })
        .collect();
    assert_eq!(
        roles,
        [
            ("libnccl.so.2".to_string(), Role::Nccl),
            ("libnvshmem_host.so.3".to_string(), Role::NvshmemHost),
            (
                "nvshmem_bootstrap_uid.so.3".to_string(),
                Role::NvshmemPlugin
            ),
            ("libcudart.so.13".to_string(), Role::Cudart),
            ("libnvshmem_device.bc".to_string(), Role::NvshmemDevice),
        ],
        "the hard link to the same inode is one file; libnccl-net.so is not NCCL"
    );
}

#[test]
fn nccl_version_codes() {
    let v: NcclVersion = "2.28.9".parse().unwrap();
    assert_eq!(v.code(), 22809);
    assert_eq!(NcclVersion::from_code(22809), Some(v));
    assert_eq!(
        NcclVersion::from_code(2804).unwrap().to_string(),
        "2.8.4",
        "pre-2.9 codes"
    );
    assert_eq!("2.8.4".parse::<NcclVersion>().unwrap().code(), 2804);
    assert!("2.28".parse::<NcclVersion>().is_err());
}

fn probe(site: &Path) -> ProbeOutput {
    let modules = vec!["torch".to_string(), "deep_ep".to_string()];
    let env = vec![("PYTHONPATH".to_string(), site.display().to_string())];
    run_probe(
        Path::new("python3"),
        &modules,
        &env,
        Duration::from_secs(120),
    )
    .unwrap()
}

fn expectations(site: &Path) -> Expectations {
    Expectations {
        nccl_version: Some("2.28.9".parse().unwrap()),
        nvshmem_version: Some("3.4.5".parse().unwrap()),
        nvshmem_prefix: Some(site.join("nvidia/nvshmem")),
        ..Expectations::new()
    }
}

fn check<'a>(
    f: &'a commstack_verify::runtime::RuntimeFindings,
    name: &str,
) -> &'a commstack_verify::Check {
    f.checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:#?}", f.checks))
}

#[test]
fn end_to_end_our_stack_passes() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    fake_deep_ep(&site, None);
    let findings = check_runtime(&probe(&site), &expectations(&site));
    assert_eq!(findings.status(), Status::Passed, "{:#?}", findings.checks);
    assert_eq!(findings.nvshmem_host.len(), 1);
    assert_eq!(findings.nccl[0].code, Some(22809));
    assert!(
        check(&findings, "nccl.version")
            .detail
            .contains("22809 (2.28.9)")
    );
    assert!(
        check(&findings, "nvshmem-host.nccl-off")
            .detail
            .contains("NVSHMEM 3.4.5, NVSHMEM_USE_NCCL=OFF")
    );
    assert_eq!(
        findings.torch.as_ref().unwrap()["nccl_compiled"],
        serde_json::json!([2, 28, 9])
    );
}

#[test]
fn end_to_end_nvidia_nvshmem_left_in_place_fails_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "ON", 22809);
    fake_deep_ep(&site, None);
    let findings = check_runtime(&probe(&site), &expectations(&site));
    assert_eq!(findings.status(), Status::Failed);
    let c = check(&findings, "nvshmem-host.nccl-off");
    assert_eq!(c.status, Status::Failed);
    assert!(
        c.detail
            .starts_with("NVIDIA's nvidia-nvshmem wheel is still installed at"),
        "{}",
        c.detail
    );
    assert!(
        c.detail
            .contains("loads libnvshmem_host.so.3 by SONAME first"),
        "{}",
        c.detail
    );
    assert!(c.fix.as_deref().unwrap().contains("drop-in wheel"));
}

#[test]
fn end_to_end_second_nccl_and_wrong_version_fail() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    // DeepEP V2's NCCL override: another libnccl.so.2, version 2.30.4, loaded by path.
    let second = nccl_lib(&site.join("deep_ep/lib"), 23004);
    fake_deep_ep(&site, Some(&second));
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "nccl.mapped-once");
    assert_eq!(c.status, Status::Failed);
    assert!(
        c.detail.starts_with("2 libnccl files are mapped"),
        "{}",
        c.detail
    );
    // maps lists by address, not load order.
    let mut versions: Vec<(Option<i64>, bool)> = findings
        .nccl
        .iter()
        .map(|n| (n.code, n.path.starts_with(site.join("deep_ep"))))
        .collect();
    versions.sort();
    assert_eq!(
        versions,
        [(Some(22809), false), (Some(23004), true)],
        "each mapped NCCL answered for itself"
    );
    let wrong = findings
        .checks
        .iter()
        .filter(|c| c.name == "nccl.version" && c.status == Status::Failed)
        .count();
    assert_eq!(wrong, 1, "{:#?}", findings.checks);
}

#[test]
fn end_to_end_without_deep_ep_is_never_passed() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "import.deep_ep");
    assert_eq!(c.status, Status::NotRun);
    assert!(
        c.detail.contains("deep_ep is not installed"),
        "{}",
        c.detail
    );
    assert_eq!(findings.status(), Status::NotRun, "{:#?}", findings.checks);
    // What could run did: torch's NCCL and NVSHMEM were still checked.
    assert_eq!(check(&findings, "nccl.version").status, Status::Passed);
}

#[test]
fn a_broken_import_fails_with_its_traceback() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    std::fs::create_dir_all(site.join("deep_ep")).unwrap();
    std::fs::write(site.join("deep_ep/__init__.py"), "import deep_ep_cpp\n").unwrap();
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "import.deep_ep");
    assert_eq!(
        c.status,
        Status::Failed,
        "a missing dependency is not an absent module"
    );
    assert!(
        c.detail.contains("No module named 'deep_ep_cpp'"),
        "{}",
        c.detail
    );
}

/// A warning at import fails the import's check, named with its text and the fix: torch
/// without numpy warns "Failed to initialize NumPy" (issue 29), as a real torch 2.11 does
/// in an image whose closure lacks numpy. Warnings come from C code through
/// PyErr_WarnEx just as from Python: the probe records them through the warnings module.
#[test]
fn a_warning_at_import_fails_the_import_naming_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    fake_deep_ep(&site, None);
    let init = site.join("torch/__init__.py");
    let mut text = std::fs::read_to_string(&init).unwrap();
    text.push_str("import warnings as _w\n_w.warn(\"Failed to initialize NumPy: No module named 'numpy' (Triggered internally at torch/csrc/utils/tensor_numpy.cpp:84.)\", UserWarning)\n");
    std::fs::write(&init, text).unwrap();
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "import.torch");
    assert_eq!(c.status, Status::Failed, "{c:#?}");
    assert!(
        c.detail
            .contains("UserWarning: Failed to initialize NumPy: No module named 'numpy'"),
        "{}",
        c.detail
    );
    assert!(
        c.fix
            .as_deref()
            .unwrap_or("")
            .contains("\"numpy\" to [resolve] extra-requirements"),
        "{c:#?}"
    );
    assert_eq!(findings.status(), Status::Failed);
    // deep_ep imported after torch warned nothing itself: its check passes.
    assert_eq!(check(&findings, "import.deep_ep").status, Status::Passed);
}

/// A library's deprecation note about its own code (torch 2.11 warns that
/// `torch.jit.script_method` is deprecated when DeepEP V2 imports a module using it) is
/// hidden by Python's default filters: reported in the passed check, not failed; a
/// UserWarning in the same import still fails it.
#[test]
fn a_deprecation_inside_a_library_is_reported_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    fake_deep_ep(&site, None);
    let init = site.join("deep_ep/__init__.py");
    let original = std::fs::read_to_string(&init).unwrap();
    let deprecated = "import warnings as _w\nfor _ in range(3):\n    _w.warn(\"`torch.jit.script_method` is deprecated.\", DeprecationWarning)\n";
    std::fs::write(&init, format!("{original}{deprecated}")).unwrap();
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "import.deep_ep");
    assert_eq!(c.status, Status::Passed, "{c:#?}");
    assert!(
        c.detail
            .contains("3 warning(s) Python's default filters hide")
            && c.detail
                .contains("(3x) DeprecationWarning: `torch.jit.script_method` is deprecated."),
        "{}",
        c.detail
    );
    std::fs::write(
        &init,
        format!("{original}{deprecated}_w.warn(\"shown\", UserWarning)\n"),
    )
    .unwrap();
    let findings = check_runtime(&probe(&site), &expectations(&site));
    let c = check(&findings, "import.deep_ep");
    assert_eq!(c.status, Status::Failed, "{c:#?}");
    assert!(
        c.detail.contains("warned 1 time(s)") && c.detail.contains("UserWarning: shown"),
        "{}",
        c.detail
    );
}

/// `python -c IMPORT_CHECK_PY MODULE` (the image step's `import torch` where no GPU is)
/// judges an import as the probe does, through the same Python: exit 0 and no warnings for
/// the clean fake torch, 3 with the warning's text once torch warns, 1 for a module whose
/// own import fails; one JSON line with the ImportResult and torch's facts.
#[test]
fn the_import_check_judges_imports_as_the_probe_does() {
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    let run = |module: &str| {
        let out = std::process::Command::new("python3")
            .args(["-c", commstack_verify::runtime::IMPORT_CHECK_PY, module])
            .env("PYTHONPATH", &site)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let line: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("{e}: {stdout}{}", String::from_utf8_lossy(&out.stderr)));
        let import: commstack_verify::runtime::ImportResult =
            serde_json::from_value(line["import"].clone()).unwrap();
        (out.status.code(), import, line["torch"].clone())
    };
    let (code, import, torch) = run("torch");
    assert_eq!(
        (code, import.status.as_str()),
        (Some(0), "ok"),
        "{import:?}"
    );
    assert!(import.warnings.is_empty(), "{import:?}");
    assert!(torch["version"].is_string(), "{torch}");

    let init = site.join("torch/__init__.py");
    let mut text = std::fs::read_to_string(&init).unwrap();
    text.push_str("import warnings as _w\n_w.warn(\"Failed to initialize NumPy: No module named 'numpy'\", UserWarning)\n");
    std::fs::write(&init, text).unwrap();
    let (code, import, _) = run("torch");
    assert_eq!(code, Some(3), "{import:?}");
    assert_eq!(import.warnings.len(), 1, "{import:?}");
    assert!(
        import.warnings[0].starts_with(&format!(
            "UserWarning: {}",
            commstack_verify::runtime::NUMPY_MISSING
        )),
        "{import:?}"
    );

    std::fs::create_dir_all(site.join("deep_ep")).unwrap();
    std::fs::write(site.join("deep_ep/__init__.py"), "import deep_ep_cpp\n").unwrap();
    let (code, import, _) = run("deep_ep");
    assert_eq!(
        (code, import.status.as_str()),
        (Some(1), "error"),
        "{import:?}"
    );
    assert!(
        import
            .error
            .as_deref()
            .unwrap_or("")
            .contains("deep_ep_cpp"),
        "{import:?}"
    );
}

#[test]
fn verdicts_on_a_recorded_probe_with_unreadable_libraries() {
    // The recorded listing points at files that do not exist here: every mapped
    // NVSHMEM is reported unreadable (failed), never passed.
    let probe = ProbeOutput {
        schema: 1,
        python: PythonFacts {
            executable: "/opt/venv/bin/python".into(),
            version: "3.12.3".into(),
            prefix: "/opt/venv".into(),
        },
        imports: serde_json::from_value(serde_json::json!([
            {"module": "torch", "status": "ok", "file": "x", "version": "2.11.0"},
            {"module": "deep_ep", "status": "ok", "file": "y", "version": null}
        ]))
        .unwrap(),
        torch: Some(serde_json::json!({"version": "2.11.0", "cuda": "13.0"})),
        env: Default::default(),
        maps: maps_fixture(),
        nccl: serde_json::from_value(serde_json::json!([
            {"path": format!("{SITE}/nvidia/nccl/lib/libnccl.so.2"), "code": 22705}
        ]))
        .unwrap(),
    };
    let findings = check_runtime(
        &probe,
        &Expectations {
            nccl_version: Some("2.28.9".parse().unwrap()),
            ..Expectations::new()
        },
    );
    let c = check(&findings, "nvshmem-host.nccl-off");
    assert_eq!(c.status, Status::Failed);
    assert!(c.detail.contains("cannot read the mapped"), "{}", c.detail);
    let v = check(&findings, "nccl.version");
    assert_eq!(v.status, Status::Failed);
    assert!(
        v.detail
            .contains("the loaded NCCL is 2.27.5 (ncclGetVersion = 22705)"),
        "{}",
        v.detail
    );
    assert!(
        v.detail.contains("the stack pins 2.28.9 (22809)"),
        "{}",
        v.detail
    );
    assert_eq!(findings.cudart.len(), 1);
    assert_eq!(findings.nvshmem_plugins.len(), 1);
}
