//! The recipe against the fixture project that follows NVSHMEM's build contract, with
//! real cmake and ninja (from their PyPI wheels) and gcc: hermetic despite a hostile
//! environment, cached, proven, packaged as a drop-in wheel that pip installs.

mod common;

use std::fs;
use std::process::Command;

use common::*;
use commstack_nvshmem::{
    BuildRequest, Built, DropIn, DropInSpec, NvshmemOptions, build, build_dropin_wheel,
    configure_only, env::resolve_passthrough, wheelset::Selection,
};
use commstack_store::Store;
use commstack_wheel::{Wheel, parse_record, record_hash};

#[test]
fn hostile_environment_still_builds_nccl_off_cached_and_ships_a_wheel() {
    set_hostile_environment();
    let tmp = tempfile::tempdir().unwrap();
    let tc = fixture_toolchain(tmp.path());
    let store = Store::open(tmp.path().join("store")).unwrap();
    let options = NvshmemOptions {
        cuda_archs: vec!["90-real".parse().unwrap(), "100-real".parse().unwrap()],
        rdma_core: Some(fake_rdma_core(tmp.path())),
        ..Default::default()
    };
    let passthrough = resolve_passthrough(&["NVSHMEM_DISABLE_NVLS".to_string()]).unwrap();
    let source = fixture_source();
    let req = BuildRequest {
        source_dir: &source,
        source_tree_sha256: "sha256:fixture",
        options: &options,
        toolchain: &tc,
        python3: "/usr/bin/python3".into(),
        passthrough,
        jobs: 2,
        progress: &|_| {},
    };

    let first = build(&store, &req, false).unwrap();
    assert!(!first.outcome.was_cached());
    check_proof(&first, &tc);
    let sel = check_wheel_set(&first);

    // static-lib = true: NVSHMEM's whole `all` and its own install. Its lib/ and include/
    // hold the same bytes plus the static library, so the default loses nothing else.
    let with_static = NvshmemOptions {
        static_lib: true,
        ..options.clone()
    };
    let full = build(
        &store,
        &BuildRequest {
            options: &with_static,
            python3: req.python3.clone(),
            passthrough: req.passthrough.clone(),
            ..req
        },
        false,
    )
    .unwrap();
    assert!(
        full.report.proof.passed(),
        "{:#?}",
        full.report.proof.failures
    );
    assert!(full.report.selection.is_none());
    assert!(full.prefix.join("lib/libnvshmem.a").is_file());
    assert!(full.prefix.join("bin/nvshmem-info").is_file());
    check_same_bytes_but_the_static_library(&first, &full);
    check_schedule_hook(&sel, &full, &req, &with_static, tmp.path());
    check_nothing_leaked(&first, &full);

    // Same inputs: nothing runs. --force: it runs again.
    let second = build(&store, &req, false).unwrap();
    assert!(second.outcome.was_cached());
    assert_eq!(second.report, first.report);
    assert_eq!(second.outcome.path(), first.outcome.path());
    let forced = build(&store, &req, true).unwrap();
    assert!(!forced.outcome.was_cached());
    // A changed option is another step.
    let mut other = options.clone();
    other.switches.set("nvtx", false);
    let req2 = BuildRequest {
        options: &other,
        ..req
    };
    assert_ne!(commstack_nvshmem::build_key(&req2).unwrap().0, first.key);

    let (dropin, label) = check_dropin(&store, &forced);
    check_pip_installs(tmp.path(), &dropin, &label);
}

/// The calling process exports what NVSHMEM's CMake would take as defaults. This test
/// is alone in its binary, so changing the process environment is safe.
fn set_hostile_environment() {
    for (k, v) in [
        ("NVSHMEM_USE_NCCL", "1"),
        ("NVSHMEM_MPI_SUPPORT", "1"),
        ("NVSHMEM_IBGDA_SUPPORT", "0"),
        ("NVSHMEM_BUILD_TESTS", "1"),
        ("NVSHMEM_PREFIX", "/evil/prefix"),
        ("NCCL_HOME", "/evil/nccl"),
        ("NCCL_DEBUG", "INFO"),
        ("CUDA_HOME", "/evil/cuda"),
        ("CMAKE_GENERATOR", "Unix Makefiles"),
        ("CFLAGS", "-DEVIL_CFLAGS"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ] {
        unsafe { std::env::set_var(k, v) };
    }
}

/// NCCL off, every option as asked, the archs, no libnccl, a manylinux tag, the logs.
fn check_proof(first: &Built, tc: &commstack_toolchain::Toolchain) {
    let proof = &first.report.proof;
    assert!(proof.passed(), "{:#?}", proof.failures);
    assert_eq!(proof.use_nccl, "OFF");
    assert_eq!(proof.build_vars["NVSHMEM_MPI_SUPPORT"], "OFF");
    assert_eq!(proof.build_vars["NVSHMEM_IBGDA_SUPPORT"], "ON");
    assert_eq!(proof.build_vars["NVSHMEM_PREFIX"], "/opt/commstack/nvshmem");
    assert_eq!(
        proof.build_vars["CUDA_HOME"],
        tc.cuda_home.display().to_string()
    );
    assert_eq!(
        proof.build_vars["NCCL_HOME"],
        "/nonexistent/commstack-unused/nccl"
    );
    assert!(!proof.build_options_h["NVSHMEM_BUILD_TESTS"]);
    assert_eq!(proof.version.as_deref(), Some("3.4.5"));
    assert_eq!(proof.sass_found["lib/libnvshmem_device.a"], vec![90, 100]);
    assert!(proof.libnccl_hits.is_empty());
    assert!(
        proof.manylinux.starts_with("manylinux_2_") && proof.newest_glibc.is_some(),
        "{}",
        proof.manylinux
    );
    assert!(first.outcome.path().join("build-report.json").is_file());
    assert!(first.outcome.path().join("logs/build.log").is_file());
}

/// The default builds only the wheel's set: NVSHMEM's `all` minus the static library
/// and nvshmem-info, installed without NVSHMEM's install rules.
fn check_wheel_set(first: &Built) -> Selection {
    let sel = first
        .report
        .selection
        .clone()
        .expect("the default selects targets");
    assert_eq!(
        sel.left_out,
        ["src/bin/nvshmem-info", "src/lib/libnvshmem.a"]
    );
    assert!(
        sel.targets
            .iter()
            .any(|t| t == "src/lib/libnvshmem_host.so"),
        "{sel:?}"
    );
    let log = fs::read_to_string(first.outcome.path().join("logs/build.log")).unwrap();
    assert!(
        log.contains("libnvshmem_host.so")
            && !log.contains("libnvshmem.a")
            && !log.contains("nvshmem-info"),
        "{log}"
    );
    assert!(!first.prefix.join("lib/libnvshmem.a").exists());
    assert!(!first.prefix.join("bin").exists());
    sel
}

/// The static-lib build's lib/ and include/ hold the default's bytes plus the static
/// library; the default's modes are NVSHMEM's own.
fn check_same_bytes_but_the_static_library(first: &Built, full: &Built) {
    // (include/fixture holds each build's own environment, with its own paths.)
    let ours = tree_digest(&first.prefix, &["lib", "include"]);
    let mut theirs = tree_digest(&full.prefix, &["lib", "include"]);
    assert!(theirs.remove("lib/libnvshmem.a").is_some());
    let differs = |k: &String| !k.starts_with("include/fixture/");
    let content = |t: &std::collections::BTreeMap<String, (u32, Vec<u8>)>| {
        t.iter()
            .filter(|(k, _)| differs(k))
            .map(|(k, (_, bytes))| (k.clone(), bytes.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (a, b) = (content(&ours), content(&theirs));
    let mismatched: Vec<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    assert!(mismatched.is_empty(), "differ: {mismatched:?}");
    // Modes: NVSHMEM's own (0755 in lib/, its FILE_PERMISSIONS; 0644 elsewhere), not the
    // build tree's or the umask's. (cmake's install gives .so files 0644 on Debian.)
    for (k, (mode, _)) in &ours {
        let want = if k.starts_with("lib/") { 0o755 } else { 0o644 };
        assert!(
            *mode == 0 || *mode == want,
            "{k}: mode {mode:o}, want {want:o}"
        );
    }
}

/// The default drops nvshmem_host's wait for the device step; static-lib keeps it.
fn check_schedule_hook(
    sel: &Selection,
    full: &Built,
    req: &BuildRequest<'_>,
    with_static: &NvshmemOptions,
    tmp: &std::path::Path,
) {
    // change: the bytes above are the same). In the configured graph its objects no
    // longer wait for that step, and its link still reads libnvshmem_device.a; without
    // the hook (static-lib) they wait.
    assert_eq!(
        sel.dropped_dependencies,
        ["nvshmem_host -> nvshmem_device_project-build"]
    );
    assert!(
        full.report
            .cmake_defines
            .iter()
            .all(|(k, _)| k != "CMAKE_PROJECT_INCLUDE")
    );
    let order_deps = |opts: &NvshmemOptions, dir: &str| {
        let cfg = tmp.join(dir);
        configure_only(
            &BuildRequest {
                options: opts,
                python3: req.python3.clone(),
                passthrough: req.passthrough.clone(),
                ..*req
            },
            &cfg,
        )
        .unwrap();
        let query = |t: &str| {
            run(Command::new(&req.toolchain.ninja)
                .arg("-C")
                .arg(cfg.join("build"))
                .args(["-t", "query", t]))
        };
        let link = query("src/lib/libnvshmem_host.so.3.4.5");
        assert!(link.contains("src/lib/libnvshmem_device.a"), "{link}");
        query("cmake_object_order_depends_target_nvshmem_host")
    };
    let hooked = order_deps(req.options, "configured-default");
    assert!(!hooked.contains("nvshmem_device_project"), "{hooked}");
    let upstream = order_deps(with_static, "configured-static");
    assert!(
        upstream.contains("nvshmem_device_project-build"),
        "{upstream}"
    );
}

/// What the build saw: nothing of the hostile environment but the passthrough.
fn check_nothing_leaked(first: &Built, full: &Built) {
    for (file, prefix) in ["configure-env.txt", "build-env.txt"]
        .into_iter()
        .flat_map(|f| [(f, &first.prefix), (f, &full.prefix)])
    {
        let env = fs::read_to_string(prefix.join("include/fixture").join(file)).unwrap();
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        let leaked: Vec<&&str> = names
            .iter()
            .filter(|k| {
                (k.starts_with("NVSHMEM_") && **k != "NVSHMEM_DISABLE_NVLS")
                    || k.starts_with("NCCL_")
                    || ["CUDA_HOME", "CMAKE_GENERATOR", "CFLAGS"].contains(k)
            })
            .collect();
        assert!(
            leaked.is_empty(),
            "{file} of {} leaked {leaked:?}",
            prefix.display()
        );
        assert!(
            env.lines().any(|l| l == "NVSHMEM_DISABLE_NVLS=1"),
            "{file}: passthrough missing"
        );
    }
    assert_eq!(
        fs::read_to_string(first.prefix.join("git_commit.txt")).unwrap(),
        "commstack source tree sha256:fixture\n"
    );
}

/// The drop-in wheel of `forced`: named and tagged as torch's pin, NVIDIA's selection of
/// files, cached, refused for another pin. Returns it and the build's label.
fn check_dropin(store: &Store, forced: &Built) -> (DropIn, String) {
    let spec = DropInSpec {
        cuda_major: 13,
        torch_pin: "3.4.5".into(),
        allow_version_mismatch: false,
    };
    let (dropin, outcome) = build_dropin_wheel(store, forced, &spec, false).unwrap();
    assert!(!outcome.was_cached());
    let label = forced.key.hash[..7].to_string();
    assert!(
        dropin.filename.starts_with(&format!(
            "nvidia_nvshmem_cu13-3.4.5+commstack.g{label}-py3-none-manylinux"
        )),
        "{}",
        dropin.filename
    );
    // Tagged from the glibc symbol versions the libraries need (the fixture needs few).
    assert!(
        dropin
            .platform_tags
            .iter()
            .any(|t| t.starts_with("manylinux_2_")),
        "{:?}",
        dropin.platform_tags
    );
    for f in [
        "nvidia/nvshmem/lib/libnvshmem_host.so.3",
        "nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3",
        "nvidia/nvshmem/lib/nvshmem_bootstrap_uid.so.3",
        "nvidia/nvshmem/lib/libnvshmem_device.a",
        "nvidia/nvshmem/include/non_abi/nvshmem_build_options.h",
    ] {
        assert!(
            dropin.files.iter().any(|x| x == f),
            "{f} missing from {:?}",
            dropin.files
        );
    }
    for f in [
        "nvidia/nvshmem/lib/libnvshmem_host.so",
        "nvidia/nvshmem/lib/libnvshmem_host.so.3.4.5",
    ] {
        assert!(
            !dropin.files.iter().any(|x| x == f),
            "{f} should not ship (NVIDIA's wheel has only .so.3)"
        );
    }
    Wheel::open(&dropin.wheel).unwrap().verify().unwrap();
    assert!(
        build_dropin_wheel(store, forced, &spec, false)
            .unwrap()
            .1
            .was_cached()
    );
    let other_pin = DropInSpec {
        torch_pin: "3.3.20".into(),
        ..spec.clone()
    };
    let err = build_dropin_wheel(store, forced, &other_pin, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("torch pins nvidia-nvshmem-cu13==3.3.20"),
        "{err}"
    );
    (dropin, label)
}

/// pip installs it; the RECORD it keeps verifies; the library is ours.
fn check_pip_installs(tmp: &std::path::Path, dropin: &DropIn, label: &str) {
    let venv = tmp.join("venv");
    run(Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv));
    let py = venv.join("bin/python");
    run(Command::new("python3")
        .args(["-m", "pip", "--python"])
        .arg(&py)
        .args(["install", "--no-index", "--no-deps", "-q"])
        .arg(&dropin.wheel));
    let show = run(Command::new("python3")
        .args(["-m", "pip", "--python"])
        .arg(&py)
        .args(["show", "nvidia-nvshmem-cu13"]));
    assert!(
        show.contains(&format!("Version: 3.4.5+commstack.g{label}")),
        "{show}"
    );
    let site = run(Command::new(&py).args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]));
    let site = std::path::Path::new(site.trim());
    let dist_info = fs::read_dir(site)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.to_string_lossy().ends_with(".dist-info")
                && p.to_string_lossy().contains("nvidia_nvshmem_cu13")
        })
        .unwrap();
    let record = parse_record(&fs::read(dist_info.join("RECORD")).unwrap()).unwrap();
    let mut hashed = 0;
    for e in &record {
        if let Some(h) = &e.hash {
            assert_eq!(
                &record_hash(&fs::read(site.join(&e.path)).unwrap()),
                h,
                "{}",
                e.path
            );
            hashed += 1;
        }
    }
    assert!(hashed >= 10);
    let host = fs::read(site.join("nvidia/nvshmem/lib/libnvshmem_host.so.3")).unwrap();
    assert!(host.windows(20).any(|w| w == b"NVSHMEM_USE_NCCL=OFF"));
}

/// Relative path -> (mode, content) of every file, or (0, link target) of every link,
/// under `dirs`.
fn tree_digest(
    root: &std::path::Path,
    dirs: &[&str],
) -> std::collections::BTreeMap<String, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    for d in dirs {
        for e in walkdir::WalkDir::new(root.join(d)) {
            let e = e.unwrap();
            let rel = e
                .path()
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if e.path_is_symlink() {
                let target = fs::read_link(e.path()).unwrap();
                out.insert(rel, (0, target.into_os_string().into_encoded_bytes()));
            } else if e.file_type().is_file() {
                let mode = e.metadata().unwrap().permissions().mode() & 0o7777;
                out.insert(rel, (mode, fs::read(e.path()).unwrap()));
            }
        }
    }
    out
}
