//! The preflight from an image: the image step's fixture stack (crates/image's test
//! support) made into an image that carries this crate's `commstack-doctor` and the
//! preflight.json the image step writes, loaded into Docker, and run with
//! `docker run --network=none` against fixture /proc and /sys trees mounted in: a healthy
//! node, IBGDA's driver parameters off, no peermem, a small /dev/shm and an old driver
//! each give their verdict and exit status. Needs Docker (and skopeo/umoci as the image
//! tests do); no network.

#[path = "../../image/tests/support/mod.rs"]
mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use commstack_doctor::Status;
use commstack_doctor::preflight::{Expectations, IMAGE_EXPECTATIONS, PreflightVerdict};
use commstack_image::{DataFile, Image, Tool, assemble_image, docker_load};

const DOCTOR_IN_IMAGE: &str = "/opt/commstack/bin/commstack-doctor";

/// The shared libraries the doctor binary loads (`ldd`), as (host file, path in the
/// image, origin): the fixture base has no C library of its own.
fn c_library() -> Vec<(PathBuf, String, String)> {
    let out = Command::new("ldd")
        .arg(env!("CARGO_BIN_EXE_commstack-doctor"))
        .output()
        .expect("ldd (libc-bin)");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = l
                .split_whitespace()
                .find(|w| w.starts_with('/'))?
                .to_string();
            let host = PathBuf::from(&path);
            Some((
                host,
                path.trim_start_matches('/').to_string(),
                "deb:libc6".to_string(),
            ))
        })
        .collect()
}

/// The fixture image with the doctor and its expectations, loaded.
fn preflight_image(name: &str) -> (support::Fixture, Image, Expectations) {
    let mut f = support::fixture_with(name, 7, &c_library());
    let lock = &f.inputs.lock.resolved;
    let expect = Expectations::new(
        &lock.cuda,
        &["90".parse().unwrap()],
        &["ibgda"],
        lock.deepep_api,
    )
    .unwrap();
    f.inputs.tools.push(Tool {
        name: "commstack-doctor".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        image_path: DOCTOR_IN_IMAGE.into(),
        host_path: PathBuf::from(env!("CARGO_BIN_EXE_commstack-doctor")),
        source: "target/debug/commstack-doctor".into(),
    });
    f.inputs.data.push(DataFile {
        image_path: IMAGE_EXPECTATIONS.into(),
        bytes: expect.to_json().into_bytes(),
        source: "the fixture lock".into(),
    });
    let image = assemble_image(&f.store, &f.inputs, false).unwrap();
    docker_load(&image).unwrap();
    (f, image, expect)
}

/// A copy of the fixture node `name` that the image's user (uid 1000) can read.
fn node(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        fs::set_permissions(to, fs::Permissions::from_mode(0o755)).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), &target).unwrap();
                fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
        dir.path(),
    );
    dir
}

fn edit(path: &Path, edit: impl Fn(String) -> String) {
    let text = fs::read_to_string(path).unwrap();
    let changed = edit(text.clone());
    assert_ne!(text, changed, "{} unchanged", path.display());
    fs::write(path, changed).unwrap();
}

fn without_modules(node: &Path, names: &[&str]) {
    edit(&node.join("root/proc/modules"), |t| {
        t.lines()
            .filter(|l| !names.iter().any(|n| l.starts_with(&format!("{n} "))))
            .map(|l| format!("{l}\n"))
            .collect()
    });
}

/// The image's own preflight (its doctor, its preflight.json) against `node`, mounted
/// read-only, with no network: exit status and the JSON verdict from stdout.
fn run_in_image(image: &Image, node: &Path) -> (i32, PreflightVerdict) {
    run_in_image_with(image, node, &[])
}

fn run_in_image_with(image: &Image, node: &Path, extra: &[&str]) -> (i32, PreflightVerdict) {
    let out = Command::new("docker")
        .args(["run", "--rm", "--network=none", "-v"])
        .arg(format!("{}:/node:ro", node.display()))
        .args(["--entrypoint", DOCTOR_IN_IMAGE, image.tag()])
        .args(["preflight", "--expectations", IMAGE_EXPECTATIONS])
        .args([
            "--root",
            "/node/root",
            "--nvidia-smi-dir",
            "/node/nvidia-smi",
        ])
        .args(extra)
        .output()
        .expect("docker");
    let verdict = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no verdict on stdout ({e}), exit {:?}: {}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap(), verdict)
}

fn status(v: &PreflightVerdict, id: &str) -> Status {
    v.check(id)
        .unwrap_or_else(|| panic!("no check {id}"))
        .status
}

#[test]
fn the_images_preflight_gives_each_fixture_node_its_verdict() {
    let name = format!("commstack-fixture-preflight-{}", std::process::id());
    let (_f, image, expect) = preflight_image(&name);
    let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Healthy: IBGDA's parameters on, peermem and gdrdrv, 16 GiB /dev/shm, driver 580.
        let healthy = node("hgx-h100-8gpu");
        let (rc, v) = run_in_image(&image, healthy.path());
        assert_eq!((rc, v.verdict), (0, Status::Pass), "{v:#?}");
        assert_eq!(v.expectations, expect);
        assert_eq!(v.root, "/node/root");

        // IBGDA's driver parameters off, and no gdrdrv for CPU-assisted IBGDA.
        let off = node("hgx-h100-8gpu");
        edit(&off.path().join("root/proc/driver/nvidia/params"), |t| {
            t.replace("EnableStreamMemOPs: 1", "EnableStreamMemOPs: 0")
                .replace("PeerMappingOverride=1;", "")
        });
        without_modules(off.path(), &["gdrdrv"]);
        let (rc, v) = run_in_image(&image, off.path());
        assert_eq!(rc, 1);
        assert_eq!(v.failed, ["ibgda-stream-memops", "ibgda-peer-mapping"]);

        // No peermem (nor gdrdrv): GPU memory cannot be registered with the NICs.
        let no_peermem = node("hgx-h100-8gpu");
        without_modules(no_peermem.path(), &["nvidia_peermem", "gdrdrv"]);
        let (rc, v) = run_in_image(&image, no_peermem.path());
        assert_eq!(rc, 1);
        assert_eq!(v.failed, ["gpu-memory-registration"]);
        assert_eq!(status(&v, "ibgda-stream-memops"), Status::Pass);

        // Docker's default 64 MiB /dev/shm.
        let small_shm = node("hgx-h100-8gpu");
        edit(&small_shm.path().join("root/proc/mounts"), |t| {
            t.replace("size=16777216k", "size=65536k")
        });
        let (rc, v) = run_in_image(&image, small_shm.path());
        assert_eq!((rc, v.failed.as_slice()), (1, &["dev-shm".to_string()][..]));

        // A driver of the CUDA 12 branch for the image's CUDA 13.
        let old = node("hgx-h100-8gpu");
        for file in [
            "root/proc/driver/nvidia/version",
            "nvidia-smi/nvidia-smi.txt",
        ] {
            edit(&old.path().join(file), |t| {
                t.replace("580.105.08", "535.247.01")
            });
        }
        edit(&old.path().join("nvidia-smi/nvidia-smi.txt"), |t| {
            t.replace("CUDA Version: 13.0", "CUDA Version: 12.2")
        });
        let (rc, v) = run_in_image(&image, old.path());
        assert_eq!(
            (rc, v.failed.as_slice()),
            (1, &["nvidia-driver".to_string()][..])
        );
        let driver = v.check("nvidia-driver").unwrap();
        assert!(
            driver
                .finding
                .contains("535.247.01 is too old for CUDA 13.0"),
            "{driver:?}"
        );

        // The H200 GPU machine as recorded (no NICs, IBGDA parameters off): fails for the
        // image's fabric; with `--network none` (one node) only RDMA-free checks count.
        let h200 = node("h200-single");
        let (rc, v) = run_in_image(&image, h200.path());
        assert_eq!(rc, 1);
        assert!(v.failed.contains(&"rdma-devices".to_string()), "{v:#?}");
        let (rc, v) = run_in_image_with(&image, h200.path(), &["--network", "none"]);
        assert_eq!((rc, v.verdict), (0, Status::Pass), "{v:#?}");
        assert_eq!(status(&v, "memlock"), Status::Warn);
    }));
    let _ = Command::new("docker")
        .args(["rmi", "-f", image.tag()])
        .output();
    let _ = Command::new("docker")
        .args(["rmi", "-f", image.id()])
        .output();
    if let Err(panic) = results {
        std::panic::resume_unwind(panic);
    }
}
