//! The preflight binary (`commstack-doctor preflight`) against fixture nodes: the healthy
//! HGX host and variations of it in temporary directories (IBGDA's driver parameters off,
//! no peermem, a small /dev/shm, an old driver, an old kernel for DeepEP V2, a GPU the
//! image has no code for), through its exit status and its JSON verdict.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{copy_of, fixture};
use commstack_doctor::Status;
use commstack_doctor::preflight::{Expectations, PreflightVerdict};
use commstack_stack::manifest::DeepEpApi;

fn expectations(dir: &Path, archs: &[&str], api: DeepEpApi) -> PathBuf {
    let archs: Vec<_> = archs.iter().map(|a| a.parse().unwrap()).collect();
    let e = Expectations::new("13.0.2", &archs, &["ibgda", "nvtx"], api).unwrap();
    assert_eq!(e.transports, ["ibgda"]);
    let path = dir.join("preflight.json");
    fs::write(&path, e.to_json()).unwrap();
    path
}

/// Runs the binary on `host` (a fixture directory with root/ and nvidia-smi/); returns its
/// exit status and verdict (from `--json FILE`, checked against stdout's JSON form too).
fn preflight(host: &Path, expect: &Path, extra: &[&str]) -> (i32, PreflightVerdict) {
    let run = |json: Option<&Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_commstack-doctor"));
        c.arg("preflight")
            .arg("--expectations")
            .arg(expect)
            .arg("--root")
            .arg(host.join("root"))
            .arg("--nvidia-smi-dir")
            .arg(host.join("nvidia-smi"))
            .args(extra);
        if let Some(j) = json {
            c.arg("--json").arg(j);
        }
        c.output().unwrap()
    };
    let out = run(None);
    let from_stdout: PreflightVerdict = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("verdict.json");
    let with_file = run(Some(&file));
    let from_file: PreflightVerdict = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    assert_eq!(from_stdout, from_file);
    let report = String::from_utf8_lossy(&with_file.stdout);
    assert!(report.contains("commstack preflight"), "{report}");
    assert_eq!(out.status.code(), with_file.status.code());
    (out.status.code().unwrap(), from_stdout)
}

fn status(v: &PreflightVerdict, id: &str) -> Status {
    v.check(id)
        .unwrap_or_else(|| panic!("no check {id}: {v:#?}"))
        .status
}

fn replace_in(path: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    fs::write(path, text.replace(from, to)).unwrap();
}

#[test]
fn a_healthy_hgx_node_passes_with_exit_0() {
    let tmp = tempfile::tempdir().unwrap();
    let e = expectations(tmp.path(), &["90"], DeepEpApi::V2);
    let (rc, v) = preflight(&fixture("hgx-h100-8gpu"), &e, &[]);
    assert_eq!(rc, 0, "{v:#?}");
    assert_eq!(v.verdict, Status::Pass);
    assert!(v.failed.is_empty());
    assert_eq!(v.network, "infiniband");
    for id in [
        "nvidia-driver",
        "gpu-arch",
        "kernel",
        "rdma-devices",
        "rdma-gids",
        "gpu-memory-registration",
        "ibgda-stream-memops",
        "ibgda-peer-mapping",
        "memlock",
        "dev-shm",
    ] {
        assert_eq!(status(&v, id), Status::Pass, "{id}: {v:#?}");
    }
}

#[test]
fn ibgda_parameters_off_fail_without_gdrdrv_and_warn_with_it() {
    let host = copy_of("hgx-h100-8gpu");
    let params = host.path().join("root/proc/driver/nvidia/params");
    replace_in(&params, "EnableStreamMemOPs: 1", "EnableStreamMemOPs: 0");
    replace_in(&params, "PeerMappingOverride=1;", "");
    let e = expectations(host.path(), &["90"], DeepEpApi::V1);
    // gdrdrv loaded: CPU-assisted IBGDA works without them.
    let (rc, v) = preflight(host.path(), &e, &[]);
    assert_eq!(rc, 0, "{v:#?}");
    assert_eq!(status(&v, "ibgda-stream-memops"), Status::Warn);
    assert_eq!(status(&v, "ibgda-peer-mapping"), Status::Warn);
    // Without gdrdrv (nvidia_peermem still there): no IBGDA at all.
    replace_in(
        &host.path().join("root/proc/modules"),
        "gdrdrv 24576 0 - Live 0x0000000000000000 (OE)\n",
        "",
    );
    fs::remove_file(host.path().join("root/dev/gdrdrv")).unwrap();
    let (rc, v) = preflight(host.path(), &e, &[]);
    assert_eq!(rc, 1);
    assert_eq!(v.failed, ["ibgda-stream-memops", "ibgda-peer-mapping"]);
    let memops = v.check("ibgda-stream-memops").unwrap();
    assert!(
        memops.finding.starts_with("EnableStreamMemOPs: 0"),
        "{memops:?}"
    );
    assert!(
        memops
            .fix
            .as_deref()
            .unwrap()
            .contains("NVreg_EnableStreamMemOPs=1")
    );
    // On one node (no fabric) they do not matter.
    let (rc, v) = preflight(host.path(), &e, &["--network", "none"]);
    assert_eq!(rc, 0, "{v:#?}");
    assert!(v.check("ibgda-stream-memops").is_none());
    assert_eq!(status(&v, "rdma-devices"), Status::Skip);
}

#[test]
fn no_peermem_and_no_gdrdrv_fails_the_registration() {
    let host = copy_of("hgx-h100-8gpu");
    let modules = host.path().join("root/proc/modules");
    let kept: String = fs::read_to_string(&modules)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("nvidia_peermem") && !l.starts_with("gdrdrv"))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(&modules, kept).unwrap();
    let e = expectations(host.path(), &["90"], DeepEpApi::V1);
    let (rc, v) = preflight(host.path(), &e, &[]);
    assert_eq!(rc, 1);
    assert!(
        v.failed.contains(&"gpu-memory-registration".to_string()),
        "{v:#?}"
    );
    assert!(
        v.check("gpu-memory-registration")
            .unwrap()
            .fix
            .as_deref()
            .unwrap()
            .contains("modprobe nvidia_peermem")
    );
    // /sys/module is read too: peermem there is enough.
    fs::create_dir_all(host.path().join("root/sys/module/nvidia_peermem")).unwrap();
    let (_, v) = preflight(host.path(), &e, &[]);
    assert_eq!(status(&v, "gpu-memory-registration"), Status::Pass);
}

#[test]
fn a_small_dev_shm_fails() {
    let host = copy_of("hgx-h100-8gpu");
    replace_in(
        &host.path().join("root/proc/mounts"),
        "size=16777216k",
        "size=65536k",
    );
    let e = expectations(host.path(), &["90"], DeepEpApi::V1);
    let (rc, v) = preflight(host.path(), &e, &[]);
    assert_eq!(rc, 1);
    assert_eq!(v.failed, ["dev-shm"]);
    assert!(
        v.check("dev-shm")
            .unwrap()
            .finding
            .starts_with("/dev/shm is 64.00 MiB")
    );
}

#[test]
fn an_old_driver_fails_for_the_images_cuda() {
    let host = copy_of("hgx-h100-8gpu");
    replace_in(
        &host.path().join("root/proc/driver/nvidia/version"),
        "580.105.08",
        "535.247.01",
    );
    replace_in(
        &host.path().join("nvidia-smi/nvidia-smi.txt"),
        "580.105.08",
        "535.247.01",
    );
    replace_in(
        &host.path().join("nvidia-smi/nvidia-smi.txt"),
        "CUDA Version: 13.0",
        "CUDA Version: 12.2",
    );
    let e = expectations(host.path(), &["90"], DeepEpApi::V1);
    let (rc, v) = preflight(host.path(), &e, &[]);
    assert_eq!(rc, 1);
    assert!(v.failed.contains(&"nvidia-driver".to_string()), "{v:#?}");
    let driver = v.check("nvidia-driver").unwrap();
    assert!(
        driver.finding.contains("too old for CUDA 13.0") || driver.finding.contains("535"),
        "{driver:?}"
    );
}

#[test]
fn deepep_v2_needs_linux_5_6_and_v1_does_not() {
    let host = copy_of("hgx-h100-8gpu");
    fs::write(
        host.path().join("root/proc/sys/kernel/osrelease"),
        "5.4.0-216-generic\n",
    )
    .unwrap();
    let v2 = expectations(host.path(), &["90"], DeepEpApi::V2);
    let (rc, v) = preflight(host.path(), &v2, &[]);
    assert_eq!((rc, v.failed.as_slice()), (1, &["kernel".to_string()][..]));
    assert!(
        v.check("kernel")
            .unwrap()
            .finding
            .contains("older than 5.6")
    );
    let v1 = expectations(host.path(), &["90"], DeepEpApi::V1);
    let (rc, v) = preflight(host.path(), &v1, &[]);
    assert_eq!(rc, 0);
    assert_eq!(status(&v, "kernel"), Status::Skip);
}

#[test]
fn a_gpu_the_image_has_no_code_for_fails_and_ptx_only_warns() {
    let tmp = tempfile::tempdir().unwrap();
    let host = fixture("hgx-h100-8gpu");
    let (rc, v) = preflight(
        &host,
        &expectations(tmp.path(), &["100f"], DeepEpApi::V1),
        &[],
    );
    assert_eq!(rc, 1);
    assert_eq!(v.failed, ["gpu-arch"]);
    assert!(
        v.check("gpu-arch")
            .unwrap()
            .fix
            .as_deref()
            .unwrap()
            .contains("\"90\"")
    );
    let (rc, v) = preflight(
        &host,
        &expectations(tmp.path(), &["80"], DeepEpApi::V1),
        &[],
    );
    assert_eq!((rc, status(&v, "gpu-arch")), (0, Status::Warn));
}

#[test]
fn roce_needs_a_roce_v2_gid_and_says_when_the_ports_are_infiniband() {
    let tmp = tempfile::tempdir().unwrap();
    let e = expectations(tmp.path(), &["90"], DeepEpApi::V1);
    let (rc, v) = preflight(&fixture("hgx-h100-8gpu"), &e, &["--network", "roce"]);
    assert_eq!(rc, 1);
    assert_eq!(v.failed, ["rdma-gids"]);
    assert!(
        v.check("rdma-gids")
            .unwrap()
            .fix
            .as_deref()
            .unwrap()
            .contains("--network infiniband")
    );
}

#[test]
fn unreadable_expectations_exit_2_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("preflight.json");
    fs::write(&bad, "{\"schema_version\": 1}").unwrap();
    for file in [bad.clone(), tmp.path().join("missing.json")] {
        let out = Command::new(env!("CARGO_BIN_EXE_commstack-doctor"))
            .args(["preflight", "--expectations"])
            .arg(&file)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&file.display().to_string()), "{err}");
    }
}
