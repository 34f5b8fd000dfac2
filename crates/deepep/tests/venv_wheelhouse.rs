//! The managed venv made from a real lock, and the wheelhouse installed into an empty
//! venv: wheels served by the testkit's PyPI fixture index over real HTTP, fetched into a
//! real cache by commstack-fetch, installed by a real pip.

mod common;

use common::*;
use commstack_deepep::python::PythonEnv;
use commstack_deepep::venv::{managed_venv, runtime_wheels};
use commstack_deepep::wheelhouse::{
    CONSTRAINTS_FILE, REQUIREMENTS_FILE, WHEELS_DIR, WheelhouseKind, assemble_wheelhouse,
};
use commstack_fetch::{Artifact, FetchOptions, fetch_all};
use commstack_store::Store;
use commstack_testkit::TestServer;
use commstack_testkit::pypi::{FixtureIndex, WheelSpec};

struct Fixture {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    index_url: String,
    lock: commstack_stack::Lock,
    cache: commstack_fetch::Cache,
    dropin: commstack_deepep::LockedWheel,
    deepep: commstack_deepep::LockedWheel,
    _server: TestServer,
}

/// A fixture index holding a torch that pins NVIDIA's NVSHMEM, NCCL, NVIDIA's NVSHMEM
/// itself and filelock; a lock of them (NVSHMEM replaced); everything fetched.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let mut index = FixtureIndex::new();
    index
        .add(
            WheelSpec::new("torch", "2.11.0")
                .requires("nvidia-nvshmem-cu13==3.4.5")
                .requires("nvidia-nccl-cu13==2.28.9")
                .requires("filelock"),
        )
        .add(WheelSpec::new("nvidia-nccl-cu13", "2.28.9"))
        .add(WheelSpec::new("nvidia-nvshmem-cu13", "3.4.5"))
        .add(WheelSpec::new("filelock", "3.20.0"));
    let server = TestServer::start();
    let index_url = index.serve(&server);
    let mut packages = Vec::new();
    for (name, version, replaced) in [
        ("torch", "2.11.0", false),
        ("nvidia-nccl-cu13", "2.28.9", false),
        ("nvidia-nvshmem-cu13", "3.4.5", true),
        ("filelock", "3.20.0", false),
    ] {
        let spec = WheelSpec::new(name, version);
        let (bytes, sha256) = index.wheel(&spec.filename()).unwrap();
        packages.push(commstack_stack::lock::Wheel {
            name: name.into(),
            version: version.into(),
            filename: spec.filename(),
            url: server.url(&format!("/files/{}", spec.filename())),
            sha256,
            size: bytes.len() as u64,
            requires: vec![],
            replaced_by: replaced.then(|| "nvshmem".into()),
        });
    }
    let mut lock = fake_lock(&[]);
    lock.packages = packages;
    let artifacts: Vec<Artifact> = lock
        .packages
        .iter()
        .map(|w| {
            Artifact::new(&w.name, &w.url, &w.sha256)
                .unwrap()
                .with_size(w.size)
        })
        .collect();
    let mut options = FetchOptions::new(root.join("cache"));
    options.progress = false;
    fetch_all(&artifacts, &options).unwrap();
    let cache = commstack_fetch::Cache::new(root.join("cache"));
    let dropin = wheel(
        &root.join("ours"),
        "nvidia-nvshmem-cu13",
        "3.4.5+commstack.gabc1234",
        ("py3", "none", "any"),
        true,
        &[],
        &[(
            "nvidia/nvshmem/lib/README",
            b"ours, NVSHMEM_USE_NCCL=OFF\n".to_vec(),
        )],
    );
    let deepep = wheel(
        &root.join("ours"),
        "deep_ep",
        "1.2.1",
        ("py3", "none", "any"),
        false,
        &["torch"],
        &[("deep_ep/__init__.py", b"import torch\n".to_vec())],
    );
    Fixture {
        _dir: dir,
        root,
        index_url,
        lock,
        cache,
        dropin,
        deepep,
        _server: server,
    }
}

#[test]
fn the_managed_venv_holds_exactly_the_lock_with_the_dropin() {
    let f = fixture();
    let store = Store::open(f.root.join("store")).unwrap();
    let wheels = runtime_wheels(&f.lock, &f.cache, std::slice::from_ref(&f.dropin)).unwrap();
    let names: Vec<&str> = wheels.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "filelock",
            "nvidia-nccl-cu13",
            "nvidia-nvshmem-cu13",
            "torch"
        ]
    );
    let venv = managed_venv(&store, &python3(), &python_minor(), &wheels, false).unwrap();
    assert!(!venv.outcome.was_cached());
    let env = PythonEnv::probe(&venv.python).unwrap();
    assert_eq!(
        env.dist("nvidia-nvshmem-cu13").unwrap().version,
        "3.4.5+commstack.gabc1234"
    );
    assert_eq!(env.dist("nvidia-nccl-cu13").unwrap().version, "2.28.9");
    assert_eq!(env.dist("torch").unwrap().version, "2.11.0");
    // The step sealed the venv in its final place: its scripts run from there.
    let pip_script = venv.step.join("venv/bin/pip");
    let out = std::process::Command::new(&pip_script)
        .arg("--version")
        .env("PIP_CONFIG_FILE", "/dev/null")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} does not run: {}",
        pip_script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&venv.step.join("venv").display().to_string())
    );

    // Second run: the store has it.
    let again = managed_venv(&store, &python3(), &python_minor(), &wheels, false).unwrap();
    assert!(again.outcome.was_cached());
    assert_eq!(again.step, venv.step);

    // Another interpreter minor than the lock's is refused; so is a wheel not fetched.
    let err = managed_venv(&store, &python3(), "3.99", &wheels, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("3.99"), "{err}");
    let mut missing = f.lock.clone();
    missing.packages[0].sha256 = "0".repeat(64);
    let err = runtime_wheels(&missing, &f.cache, &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cargo xtask fetch") && err.contains(&missing.packages[0].filename),
        "{err}"
    );
}

#[test]
fn the_wheelhouse_installs_offline_and_its_constraint_keeps_nvidias_nvshmem_out() {
    let f = fixture();
    let store = Store::open(f.root.join("store")).unwrap();
    let runtime = runtime_wheels(&f.lock, &f.cache, std::slice::from_ref(&f.dropin)).unwrap();
    let house = assemble_wheelhouse(
        &store,
        WheelhouseKind::Full,
        &runtime,
        &f.dropin,
        &f.deepep,
        false,
    )
    .unwrap();
    let constraints = std::fs::read_to_string(house.dir.join(CONSTRAINTS_FILE)).unwrap();
    let first_pin = constraints.lines().find(|l| !l.starts_with('#')).unwrap();
    assert_eq!(first_pin, "nvidia-nvshmem-cu13==3.4.5+commstack.gabc1234");
    let again = assemble_wheelhouse(
        &store,
        WheelhouseKind::Full,
        &runtime,
        &f.dropin,
        &f.deepep,
        false,
    )
    .unwrap();
    assert!(again.outcome.was_cached());

    // Into an empty venv, offline, every file checked against its hash.
    let python = venv(&f.root.join("empty"), true);
    let wheels = house.dir.join(WHEELS_DIR);
    let req = house.dir.join(REQUIREMENTS_FILE);
    let con = house.dir.join(CONSTRAINTS_FILE);
    let out = pip(
        &python,
        &[
            "install",
            "--no-index",
            "--find-links",
            wheels.to_str().unwrap(),
            "--require-hashes",
            "-r",
            req.to_str().unwrap(),
            "-c",
            con.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let env = PythonEnv::probe(&python).unwrap();
    for w in &house.manifest.wheels {
        assert_eq!(
            env.dist(&w.name).map(|d| d.version.as_str()),
            Some(w.version.as_str()),
            "{}",
            w.name
        );
    }

    // A later install that would bring NVIDIA's NVSHMEM back (from a real index that has
    // it) is refused under the constraint ...
    let reinstall = |constrained: bool| {
        let mut args = vec![
            "install",
            "--index-url",
            &f.index_url,
            "--force-reinstall",
            "--no-deps",
            "nvidia-nvshmem-cu13==3.4.5",
        ];
        if constrained {
            args.extend(["-c", con.to_str().unwrap()]);
        }
        pip(&python, &args)
    };
    let refused = reinstall(true);
    assert!(
        !refused.status.success(),
        "pip installed NVIDIA's NVSHMEM despite the constraint"
    );
    let env = PythonEnv::probe(&python).unwrap();
    assert_eq!(
        env.dist("nvidia-nvshmem-cu13").unwrap().version,
        "3.4.5+commstack.gabc1234"
    );
    // ... and without it pip does replace ours: the constraint is what keeps it out.
    let replaced = reinstall(false);
    assert!(
        replaced.status.success(),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
    let env = PythonEnv::probe(&python).unwrap();
    assert_eq!(env.dist("nvidia-nvshmem-cu13").unwrap().version, "3.4.5");
}
