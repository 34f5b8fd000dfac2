//! `verify` end to end: a real venv (python3 -m venv) holding a fake torch and NVIDIA-style
//! wheels built from real shared objects; every level, the JSON report and its file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use commstack_verify::report::Level;
use commstack_verify::runner::TestSpec;
use commstack_verify::{Expectations, Status, VerifyOptions, verify_python};

/// A venv whose site-packages holds `fake_site`'s packages; returns (python, site).
fn venv(root: &Path, use_nccl: &str) -> (PathBuf, PathBuf) {
    let venv = root.join("venv");
    let ok = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .status()
        .unwrap()
        .success();
    assert!(ok, "python3 -m venv failed");
    let python = venv.join("bin/python");
    let out = Command::new(&python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let built = fake_site(root, use_nccl, 22809);
    // Move the fake packages into the venv's site-packages.
    for entry in std::fs::read_dir(&built).unwrap() {
        let entry = entry.unwrap();
        std::fs::rename(entry.path(), site.join(entry.file_name())).unwrap();
    }
    fake_deep_ep(&site, None);
    (python, site)
}

fn level(
    report: &commstack_verify::Report,
    level: Level,
) -> &commstack_verify::report::LevelReport {
    report.levels.iter().find(|l| l.level == level).unwrap()
}

#[test]
fn our_stack_verifies_and_the_report_is_filed_under_its_environment() {
    let dir = tempfile::tempdir().unwrap();
    let (python, site) = venv(dir.path(), "OFF");
    let test = dir.path().join("t_pg.py");
    std::fs::write(&test, "def test():\n    print('collective ok')\n").unwrap();
    let expect = Expectations {
        nccl_version: Some("2.28.9".parse().unwrap()),
        nvshmem_version: Some("3.4.5".parse().unwrap()),
        nvshmem_prefix: Some(site.join("nvidia/nvshmem")),
        target_glibc: Some("2.36".parse().unwrap()),
        target_glibcxx: Some("3.4.30".parse().unwrap()),
        nvshmem_build_vars: [("NVSHMEM_IBGDA_SUPPORT".to_string(), "ON".to_string())].into(),
        ..Expectations::new()
    };
    let mut opts = VerifyOptions::new(&python, Level::ALL.to_vec(), expect);
    opts.tests.push(TestSpec::function("pg", &test, "test"));
    let reports = dir.path().join("reports");
    opts.log_dir = Some(reports.clone());
    let report = verify_python(&opts).unwrap();

    let statuses: Vec<(Level, Status)> =
        report.levels.iter().map(|l| (l.level, l.status)).collect();
    assert_eq!(
        statuses,
        [
            (Level::Static, Status::Passed),
            (Level::Runtime, Status::Passed),
            (Level::Selftest, Status::NotRun),
            (Level::Tests, Status::Passed),
            (Level::ExitClean, Status::Passed),
        ],
        "{}",
        report.human()
    );
    assert_eq!(
        report.exit_code(),
        2,
        "the self-test could not run: not a pass"
    );
    let static_names: Vec<&str> = level(&report, Level::Static)
        .checks
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    for name in [
        "static.nvshmem-host.build-vars",
        "static.nvshmem-host.no-libnccl",
        "static.one-copy.libnccl.so.2",
        "static.needed-resolve",
        "static.glibc",
    ] {
        assert!(
            static_names.contains(&name),
            "{name} missing from {static_names:?}"
        );
    }

    let json_path = report.write_to(&reports).unwrap();
    let id = &report.environment.key.id;
    assert_eq!(json_path, reports.join(format!("verify-{id}.json")));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["schema"], 1);
    assert_eq!(json["levels"][2]["status"], "not-run");
    assert!(reports.join(format!("verify-{id}.txt")).is_file());
    assert!(reports.join(format!("verify-{id}-pg.log")).is_file());
    let human = report.human();
    assert!(human.contains("selftest    not run"), "{human}");
    assert!(human.contains("verdict: not run"), "{human}");

    // The key follows the stack's files: replacing libnccl changes it.
    nccl_lib(&site.join("nvidia/nccl/lib"), 22810);
    let again = verify_python(&VerifyOptions::new(
        &python,
        vec![Level::Static],
        Expectations::new(),
    ))
    .unwrap();
    assert_ne!(&again.environment.key.id, id);
}

#[test]
fn nvidia_nvshmem_fails_static_and_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (python, _) = venv(dir.path(), "ON");
    let opts = VerifyOptions::new(
        &python,
        vec![Level::Static, Level::Runtime],
        Expectations::new(),
    );
    let report = verify_python(&opts).unwrap();
    assert_eq!(report.exit_code(), 1);
    assert_eq!(level(&report, Level::Static).status, Status::Failed);
    assert_eq!(level(&report, Level::Runtime).status, Status::Failed);
    let human = report.human();
    assert!(
        human.contains("NVSHMEM_USE_NCCL: expected OFF, found ON"),
        "{human}"
    );
    assert!(
        human.contains("NVIDIA's nvidia-nvshmem wheel is still installed"),
        "{human}"
    );
    assert!(level(&report, Level::Tests).not_run_because.as_deref() == Some("not requested"));
}

#[test]
fn a_newer_glibc_than_the_target_fails() {
    let dir = tempfile::tempdir().unwrap();
    let (python, site) = venv(dir.path(), "OFF");
    // Built against a glibc newer than the target's: getrandom is GLIBC_2.25.
    let rand = shared_lib(
        &site.join("torch/lib"),
        "librand.so",
        "librand.so",
        "#include <sys/random.h>\nlong r(void *b) { return getrandom(b, 8, 0); }",
        &[],
    );
    let expect = Expectations {
        target_glibc: Some("2.24".parse().unwrap()),
        ..Expectations::new()
    };
    let report = verify_python(&VerifyOptions::new(&python, vec![Level::Static], expect)).unwrap();
    let glibc = level(&report, Level::Static)
        .checks
        .iter()
        .find(|c| c.name == "static.glibc")
        .unwrap();
    assert_eq!(glibc.status, Status::Failed, "{glibc:?}");
    assert_eq!(
        glibc.detail,
        format!(
            "the target has glibc 2.24, but {} needs 2.25",
            rand.display()
        )
    );
}

/// DeepEP's record of the NVSHMEM device library it linked must name the one beside the
/// environment's libnvshmem_host, of the host's version; another one fails, a V1 DeepEP
/// without the record cannot be judged (not run); no DeepEP, or a V2 one (no NVSHMEM
/// linked), gives no check.
#[test]
fn deepep_device_code_must_come_from_the_host_librarys_build() {
    use commstack_verify::static_level::check_static;
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 22809);
    let device = site.join("nvidia/nvshmem/lib/libnvshmem_device.a");
    std::fs::write(&device, b"!<arch>\nfake device library\n").unwrap();
    let sha = commstack_digest::sha256_file(&device).unwrap();
    let find = |site: &Path| {
        let f = check_static(&[site.to_path_buf()], &Expectations::new());
        f.checks
            .into_iter()
            .find(|c| c.name == "static.deepep.nvshmem-device")
    };
    assert!(find(&site).is_none(), "no DeepEP, no check");

    let ext = "deep_ep_cpp.cpython-311-x86_64-linux-gnu.so";
    let dist = site.join("deep_ep-1.2.1.dist-info");
    std::fs::create_dir_all(&dist).unwrap();
    // V2: an extension that links no NVSHMEM.
    shared_lib(&site, ext, ext, "int deep_ep_v2(void) { return 2; }", &[]);
    assert!(
        find(&site).is_none(),
        "DeepEP V2 links no NVSHMEM: no check"
    );

    std::fs::remove_file(site.join(ext)).unwrap();
    let l_nvshmem = format!("-L{}", site.join("nvidia/nvshmem/lib").display());
    shared_lib(
        &site,
        ext,
        ext,
        "int deep_ep_v1(void) { return 1; }",
        &[&l_nvshmem, "-Wl,--no-as-needed", "-l:libnvshmem_host.so.3"],
    );
    assert_eq!(find(&site).unwrap().status, Status::NotRun);

    let record = |version: &str, sha: &str| {
        std::fs::write(
            dist.join("commstack-build.json"),
            format!(r#"{{"nvshmem":{{"device_library_sha256":"{sha}","host_soname":"libnvshmem_host.so.3","use_nccl":false,"version":"{version}"}}}}"#),
        )
        .unwrap();
    };
    record("3.4.5", &sha);
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Passed, "{c:?}");

    record("3.6.5", &sha);
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("3.6.5"), "{c:?}");

    record("3.4.5", &"0".repeat(64));
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains(&sha[..12]), "{c:?}");
}

/// DeepEP's extension must use the process's libstdc++: a `deep_ep/_C` that g++ built
/// against libstdc++.so.6 passes; one with a copy linked in (`-static-libstdc++`, what a
/// g++ that finds only libstdc++.a does: the H200's SIGSEGV in std::regex) fails, naming
/// the file and a symbol; no DeepEP, no check.
#[test]
fn deepep_extension_must_not_carry_its_own_libstdcxx() {
    use commstack_testkit::native::compile;
    use commstack_verify::static_level::check_static;
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 23007);
    let find = |site: &Path| {
        check_static(&[site.to_path_buf()], &Expectations::new())
            .checks
            .into_iter()
            .find(|c| c.name == "static.deepep.libstdcxx")
    };
    assert!(find(&site).is_none(), "no DeepEP, no check");

    let source = "#include <regex>\n#include <string>\nextern \"C\" int includes(const char *s) {\n    static const std::regex re(R\"(#include\\s*<deep_ep/([^>]+)>)\");\n    return std::regex_search(std::string(s), re) ? 1 : 0;\n}\n";
    let ext = site.join("deep_ep/_C.cpython-311-x86_64-linux-gnu.so");
    std::fs::create_dir_all(ext.parent().unwrap()).unwrap();
    let build = |extra: &[&str]| {
        let mut args = vec!["-shared", "-fPIC", "-O1", "-Wl,-Bsymbolic-functions"];
        args.extend_from_slice(extra);
        compile(&dir.path().join("src"), "c.cpp", source, &ext, &args);
    };

    build(&[]);
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Passed, "{c:?}");

    build(&["-static-libstdc++"]);
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(
        c.detail.contains("_C.cpython-311-x86_64-linux-gnu.so")
            && c.detail.contains("does not NEED libstdc++.so.6")
            && c.detail.contains("libstdc++'s internals (_ZN"),
        "{c:?}"
    );
}

/// DeepEP V2's `deep_ep/_C` must be linked to the environment's one libnvshmem_host and
/// one libnccl.so.2 and find them: linked with `$ORIGIN/../nvidia/...` RUNPATHs it passes,
/// naming both; a RUNPATH that leads to a second libnccl.so.2 fails, naming both copies.
#[test]
fn deepep_v2_extension_is_linked_to_the_one_nvshmem_and_the_one_nccl() {
    use commstack_testkit::native::compile;
    use commstack_verify::static_level::check_static;
    let dir = tempfile::tempdir().unwrap();
    let site = fake_site(dir.path(), "OFF", 23007);
    let find = |site: &Path| {
        check_static(&[site.to_path_buf()], &Expectations::new())
            .checks
            .into_iter()
            .find(|c| c.name == "static.deepep.links")
    };
    assert!(find(&site).is_none(), "no DeepEP, no check");
    let ext = site.join("deep_ep/_C.cpython-311-x86_64-linux-gnu.so");
    std::fs::create_dir_all(ext.parent().unwrap()).unwrap();
    let link = |runpath: &str| {
        let (nv, nccl) = (
            format!("-L{}", site.join("nvidia/nvshmem/lib").display()),
            format!("-L{}", site.join("nvidia/nccl/lib").display()),
        );
        let rp = format!("-Wl,-rpath,{runpath}");
        compile(
            &dir.path().join("src"),
            "c.cpp",
            "extern \"C\" int deep_ep_v2(void) { return 2; }\n",
            &ext,
            &[
                "-shared",
                "-fPIC",
                &nv,
                &nccl,
                "-Wl,--no-as-needed",
                "-l:libnvshmem_host.so.3",
                "-l:libnccl.so.2",
                "-Wl,--enable-new-dtags",
                &rp,
            ],
        );
    };
    link("$ORIGIN/../nvidia/nvshmem/lib:$ORIGIN/../nvidia/nccl/lib");
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Passed, "{c:?}");
    assert!(
        c.detail.contains("libnvshmem_host.so.3 -> ") && c.detail.contains("libnccl.so.2 -> "),
        "{c:?}"
    );

    // A second libnccl.so.2 beside the extension, first on its RUNPATH.
    std::fs::create_dir_all(site.join("deep_ep/lib")).unwrap();
    std::fs::copy(
        site.join("nvidia/nccl/lib/libnccl.so.2"),
        site.join("deep_ep/lib/libnccl.so.2"),
    )
    .unwrap();
    link("$ORIGIN/lib:$ORIGIN/../nvidia/nvshmem/lib");
    let c = find(&site).unwrap();
    assert_eq!(c.status, Status::Failed, "{c:?}");
    assert!(c.detail.contains("deep_ep/lib/libnccl.so.2"), "{c:?}");
}
