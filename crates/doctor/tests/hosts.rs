//! The doctor against fixture hosts (recorded /proc, /sys, /dev trees and nvidia-smi output),
//! variations of them in temporary directories, and real nvidia-smi stand-in processes.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{copy_of, fixture};
use commstack_doctor::{
    CudaVersion, DoctorInput, DoctorReport, NvidiaSmiSource, Status, render_human, run,
};

fn input(host: &Path, env: &[(&str, &str)]) -> DoctorInput {
    DoctorInput {
        root: host.join("root"),
        nvidia_smi: NvidiaSmiSource::Recorded(host.join("nvidia-smi")),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        required_cuda: CudaVersion::DEFAULT_STACK,
    }
}

fn status(report: &DoctorReport, id: &str) -> Status {
    report
        .check(id)
        .unwrap_or_else(|| panic!("no check {id}"))
        .status
}

fn finding<'r>(report: &'r DoctorReport, id: &str) -> &'r str {
    &report.check(id).unwrap().finding
}

#[test]
fn the_h200_gpu_machine_flags_stream_memops_and_the_single_gpu() {
    let report = run(&input(&fixture("h200-single"), &[("PATH", "/usr/bin")]));
    let got: Vec<(&str, Status)> = report
        .checks
        .iter()
        .map(|c| (c.id.as_str(), c.status))
        .collect();
    assert_eq!(
        got,
        [
            ("nvidia-driver", Status::Pass),
            ("gpus", Status::Warn),
            ("gpu-topology", Status::Skip),
            ("rdma-devices", Status::Warn),
            ("nvidia-peermem", Status::Skip),
            ("ibgda-stream-memops", Status::Warn),
            ("ibgda-peer-mapping", Status::Warn),
            ("gdrdrv", Status::Warn),
            ("memlock", Status::Warn),
            ("dev-shm", Status::Pass),
            ("environment", Status::Pass),
        ]
    );
    assert!(!report.has_fail());
    assert_eq!(
        finding(&report, "nvidia-driver"),
        "driver 580.159.03 runs CUDA 13.0 (CUDA 13.x needs >= 580)"
    );
    assert!(
        finding(&report, "gpus")
            .starts_with("1 GPU (1× NVIDIA H200): DeepEP intranode tests need 2, 4 or 8 GPUs")
    );
    // DeepEP's low-latency test runs on one H200 without RDMA (measured: 1 process, rc 0,
    // after "init failed for transport: IBGDA"): doctor must not say it cannot.
    let rdma = finding(&report, "rdma-devices");
    assert!(
        rdma.contains("low-latency across nodes")
            && rdma.contains("on one node, intranode and low-latency kernels run over NVLink"),
        "{rdma}"
    );
    let memops = report.check("ibgda-stream-memops").unwrap();
    assert!(
        memops
            .finding
            .starts_with("EnableStreamMemOPs: 0 — GPU-initiated IBGDA"),
        "{}",
        memops.finding
    );
    assert!(
        memops
            .fix
            .as_deref()
            .unwrap()
            .contains("NVreg_EnableStreamMemOPs=1")
    );
    assert_eq!(finding(&report, "dev-shm"), "/dev/shm is 64.00 GiB");
    assert!(report.check("dev-shm").unwrap().details[0].contains("half of MemTotal"));
    assert!(
        finding(&report, "memlock").starts_with("memlock limited to 8.00 MiB: fine without RDMA")
    );
}

#[test]
fn a_healthy_hgx_host_passes_everything() {
    let report = run(&input(
        &fixture("hgx-h100-8gpu"),
        &[("PATH", "/usr/bin"), ("NCCL_DEBUG", "INFO")],
    ));
    let not_pass: Vec<_> = report
        .checks
        .iter()
        .filter(|c| c.status != Status::Pass)
        .map(|c| (&c.id, &c.finding))
        .collect();
    assert!(not_pass.is_empty(), "{not_pass:#?}");
    assert_eq!(finding(&report, "gpus"), "8 GPUs: 8× NVIDIA H100 80GB HBM3");
    assert_eq!(
        finding(&report, "gpu-topology"),
        "all 8 GPUs pairwise connected by NVLink (NV18)"
    );
    let topo = report.check("gpu-topology").unwrap();
    assert_eq!(topo.details[0], "mlx5_0 (NIC0): PIX to GPU0");
    assert_eq!(topo.details[1], "mlx5_1 (NIC1): PIX to GPU0");
    assert_eq!(topo.details[4], "mlx5_4 (NIC4): PIX to GPU4");
    assert_eq!(
        finding(&report, "rdma-devices"),
        "8 RDMA devices, 8 ports ACTIVE (mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7), 8 uverbs devices"
    );
    assert_eq!(
        finding(&report, "ibgda-peer-mapping"),
        "PeerMappingOverride=1 (RegistryDwords: \"PeerMappingOverride=1;\")"
    );
    assert_eq!(finding(&report, "dev-shm"), "/dev/shm is 16.00 GiB");
    assert_eq!(
        finding(&report, "environment"),
        "only logging variables are set"
    );
    let text = render_human(&report);
    assert!(text.contains("11 pass, 0 warn, 0 fail, 0 skip"), "{text}");
}

#[test]
fn the_report_is_versioned_json() {
    let report = run(&input(&fixture("hgx-h100-8gpu"), &[]));
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["schema_version"], 1);
    assert_eq!(json["required_cuda"], "13.0");
    assert_eq!(json["checks"][0]["status"], "pass");
    let back: DoctorReport = serde_json::from_value(json).unwrap();
    assert_eq!(back, report);
}

#[test]
fn the_driver_is_judged_against_the_stacks_cuda() {
    let host = fixture("h200-single");
    let mut old_cuda = input(&host, &[]);
    old_cuda.required_cuda = "12.8".parse().unwrap();
    assert_eq!(status(&run(&old_cuda), "nvidia-driver"), Status::Pass);
    let mut unknown = input(&host, &[]);
    unknown.required_cuda = "14.0".parse().unwrap();
    let report = run(&unknown);
    assert_eq!(status(&report, "nvidia-driver"), Status::Warn);
    assert!(finding(&report, "nvidia-driver").contains("no known minimum driver for CUDA 14.0"));

    // A 570 driver (CUDA 12.8) on a CUDA 13 stack.
    let dir = copy_of("h200-single");
    let version = dir.path().join("root/proc/driver/nvidia/version");
    fs::write(
        &version,
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Release Build\n",
    )
    .unwrap();
    for file in ["nvidia-smi.txt", "nvidia-smi-query.csv"] {
        let path = dir.path().join("nvidia-smi").join(file);
        let text = fs::read_to_string(&path)
            .unwrap()
            .replace("580.159.03", "570.172.08")
            .replace("CUDA Version: 13.0", "CUDA Version: 12.8");
        fs::write(path, text).unwrap();
    }
    let report = run(&input(dir.path(), &[]));
    assert_eq!(status(&report, "nvidia-driver"), Status::Fail);
    assert_eq!(
        finding(&report, "nvidia-driver"),
        "driver 570.172.08 is too old for CUDA 13.0: CUDA 13.x needs driver >= 580"
    );
    assert!(report.has_fail());

    // The kernel module and nvidia-smi disagree: upgraded without a reboot.
    fs::write(
        &version,
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.105.08  Release Build\n",
    )
    .unwrap();
    fs::copy(
        fixture("h200-single/nvidia-smi/nvidia-smi.txt"),
        dir.path().join("nvidia-smi/nvidia-smi.txt"),
    )
    .unwrap();
    let report = run(&input(dir.path(), &[]));
    assert_eq!(status(&report, "nvidia-driver"), Status::Fail);
    assert!(
        finding(&report, "nvidia-driver")
            .starts_with("kernel module 580.105.08 but user-space driver 580.159.03")
    );
}

#[test]
fn no_nvidia_smi_and_no_driver_is_reported_not_crashed() {
    let empty = tempfile::tempdir().unwrap();
    let report = run(&DoctorInput {
        root: empty.path().to_path_buf(),
        nvidia_smi: NvidiaSmiSource::Live,
        env: vec![("PATH".into(), empty.path().display().to_string())],
        required_cuda: CudaVersion::DEFAULT_STACK,
    });
    assert_eq!(status(&report, "gpus"), Status::Fail);
    assert_eq!(
        finding(&report, "gpus"),
        "no nvidia-smi: no NVIDIA driver on this host"
    );
    assert_eq!(
        finding(&report, "gpu-topology"),
        "no nvidia-smi: no NVIDIA driver on this host"
    );
    assert_eq!(status(&report, "gpu-topology"), Status::Skip);
    assert_eq!(status(&report, "nvidia-driver"), Status::Fail);
    assert!(finding(&report, "nvidia-driver").starts_with("no NVIDIA kernel module"));
    assert_eq!(status(&report, "ibgda-stream-memops"), Status::Skip);
    assert_eq!(status(&report, "rdma-devices"), Status::Warn);
    assert_eq!(status(&report, "memlock"), Status::Warn);
}

/// A real executable named nvidia-smi that prints the recorded output of a fixture host.
fn stand_in_nvidia_smi(dir: &Path, host: &Path) {
    let smi = host.join("nvidia-smi");
    let script = format!(
        "#!/bin/sh\ncase \"$1\" in\n  topo) cat '{}' ;;\n  --query-gpu=*) cat '{}' ;;\n  *) cat '{}' ;;\nesac\n",
        smi.join("nvidia-smi-topo-m.txt").display(),
        smi.join("nvidia-smi-query.csv").display(),
        smi.join("nvidia-smi.txt").display(),
    );
    let path = dir.join("nvidia-smi");
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn live_mode_runs_nvidia_smi_from_path() {
    let bin = tempfile::tempdir().unwrap();
    let host = fixture("hgx-h100-8gpu");
    stand_in_nvidia_smi(bin.path(), &host);
    let path = format!("{}:/usr/bin:/bin", bin.path().display());
    let report = run(&DoctorInput {
        nvidia_smi: NvidiaSmiSource::Live,
        ..input(&host, &[("PATH", &path)])
    });
    assert_eq!(report.nvidia_smi, "live");
    assert_eq!(status(&report, "gpus"), Status::Pass);
    assert_eq!(
        finding(&report, "gpu-topology"),
        "all 8 GPUs pairwise connected by NVLink (NV18)"
    );
    assert_eq!(status(&report, "nvidia-driver"), Status::Pass);
}

#[test]
fn a_failing_nvidia_smi_says_why() {
    let bin = tempfile::tempdir().unwrap();
    let path = bin.path().join("nvidia-smi");
    fs::write(
        &path,
        // With a terminal escape: what a command says is printed escaped.
        "#!/bin/sh\nprintf '\\033[2J'\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\"\nexit 9\n",
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    let report = run(&DoctorInput {
        nvidia_smi: NvidiaSmiSource::Live,
        ..input(
            &fixture("h200-single"),
            &[("PATH", &bin.path().display().to_string())],
        )
    });
    assert_eq!(status(&report, "gpus"), Status::Fail);
    let f = finding(&report, "gpus");
    assert!(
        f.starts_with("cannot list GPUs: nvidia-smi failed (exit status: 9): `")
            && f.contains("/nvidia-smi --query-gpu=")
            && !f.contains('\n'),
        "{f}"
    );
    assert!(
        f.contains("exit status: 9") && f.contains("couldn't communicate with the NVIDIA driver"),
        "{f}"
    );
    assert!(!f.contains('\x1b') && f.contains("\\x1b[2J"), "{f}");
    assert_eq!(status(&report, "gpu-topology"), Status::Warn);
    // The kernel module still answers: the driver check uses /proc.
    assert_eq!(status(&report, "nvidia-driver"), Status::Pass);
}

#[test]
fn docker_defaults_fail_shm_and_memlock_on_an_rdma_host() {
    let dir = copy_of("hgx-h100-8gpu");
    let root = dir.path().join("root");
    let mounts = fs::read_to_string(root.join("proc/mounts"))
        .unwrap()
        .replace("size=16777216k", "size=65536k");
    fs::write(root.join("proc/mounts"), mounts).unwrap();
    let limits = fs::read_to_string(fixture("h200-single/root/proc/self/limits")).unwrap();
    fs::write(root.join("proc/self/limits"), limits).unwrap();
    let report = run(&input(dir.path(), &[]));
    assert_eq!(status(&report, "dev-shm"), Status::Fail);
    assert!(
        finding(&report, "dev-shm")
            .starts_with("/dev/shm is 64.00 MiB: NCCL's shared-memory segments")
    );
    assert_eq!(status(&report, "memlock"), Status::Fail);
    assert!(
        finding(&report, "memlock")
            .contains("registering NCCL / NVSHMEM buffers with the RDMA NICs will fail")
    );
}

#[test]
fn rdma_devices_not_passed_into_the_container_fail() {
    let dir = copy_of("hgx-h100-8gpu");
    fs::remove_dir_all(dir.path().join("root/dev/infiniband")).unwrap();
    fs::write(
        dir.path()
            .join("root/sys/class/infiniband/mlx5_3/ports/1/state"),
        "1: DOWN\n",
    )
    .unwrap();
    let report = run(&input(dir.path(), &[]));
    assert_eq!(status(&report, "rdma-devices"), Status::Fail);
    let check = report.check("rdma-devices").unwrap();
    assert!(check.finding.contains("/dev/infiniband has no uverbs"));
    assert!(
        check
            .details
            .contains(&"mlx5_3: port 1 1: DOWN InfiniBand".to_string()),
        "{:?}",
        check.details
    );
}

#[test]
fn missing_peermem_and_pcie_only_pairs_warn() {
    let dir = copy_of("hgx-h100-8gpu");
    let root = dir.path().join("root");
    let modules = fs::read_to_string(root.join("proc/modules")).unwrap();
    let modules: String = modules
        .lines()
        .filter(|l| !l.starts_with("nvidia_peermem"))
        .map(|l| format!("{l}\n"))
        .collect();
    fs::write(root.join("proc/modules"), modules).unwrap();
    let topo_path = dir.path().join("nvidia-smi/nvidia-smi-topo-m.txt");
    let topo: String = fs::read_to_string(&topo_path)
        .unwrap()
        .lines()
        .map(|l| {
            // GPU0 <-> GPU7 over the SMP interconnect instead of NVLink.
            let mut cells: Vec<&str> = l.split_whitespace().collect();
            if l.starts_with("GPU0") {
                cells[8] = "SYS";
            } else if l.starts_with("GPU7") {
                cells[1] = "SYS";
            }
            // Keep the header's indentation: it is how nvidia-smi marks the header row.
            let indent = if l.starts_with(' ') { "\t" } else { "" };
            format!("{indent}{}\n", cells.join("\t"))
        })
        .collect();
    fs::write(&topo_path, topo).unwrap();
    let report = run(&input(dir.path(), &[]));
    assert_eq!(status(&report, "nvidia-peermem"), Status::Warn);
    assert_eq!(status(&report, "gpu-topology"), Status::Warn);
    let topo = report.check("gpu-topology").unwrap();
    assert!(
        topo.finding.starts_with("1 of 28 GPU pairs have no NVLink"),
        "{}",
        topo.finding
    );
    assert_eq!(topo.details[0], "GPU0–GPU7 SYS");
}

#[test]
fn environment_variables_that_change_behaviour_are_listed() {
    let dir = copy_of("h200-single");
    let nccl_dir = dir.path().join("root/opt/nccl/lib");
    fs::create_dir_all(&nccl_dir).unwrap();
    fs::write(nccl_dir.join("libnccl.so.2"), b"").unwrap();
    let report = run(&input(
        dir.path(),
        &[
            ("PATH", "/usr/bin"),
            ("NCCL_P2P_DISABLE", "1"),
            ("NVSHMEM_USE_NCCL", "ON"),
            ("NVSHMEM_DEBUG", "INFO"),
            ("TORCH_NCCL_BLOCKING_WAIT", "1"),
            ("LD_LIBRARY_PATH", "/usr/local/cuda/lib64:/opt/nccl/lib"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("NCCL_SOME_NEW_KNOB", "7"),
            // NVIDIA's images set it to describe themselves; NCCL never reads it.
            ("NCCL_VERSION", "2.28.3-1"),
            ("HOME", "/root"),
        ],
    ));
    let env = report.check("environment").unwrap();
    assert_eq!(env.status, Status::Warn);
    assert_eq!(
        env.finding,
        "6 variables change NCCL / NVSHMEM / DeepEP behaviour"
    );
    let has = |prefix: &str| env.details.iter().any(|d| d.starts_with(prefix));
    assert!(has(
        "NCCL_P2P_DISABLE=1 — disables NVLink/PCIe peer-to-peer"
    ));
    assert!(has("NVSHMEM_USE_NCCL=ON — an NVSHMEM CMake option default"));
    assert!(has(
        "LD_LIBRARY_PATH=/usr/local/cuda/lib64:/opt/nccl/lib — holds /opt/nccl/lib/libnccl.so.2"
    ));
    assert!(has(
        "TORCH_NCCL_BLOCKING_WAIT=1 — changes torch's ProcessGroupNCCL"
    ));
    assert!(has("NCCL_SOME_NEW_KNOB=7 — an NCCL setting"));
    assert!(has("CUDA_VISIBLE_DEVICES=0 — limits and renumbers"));
    assert!(!has("NCCL_VERSION"), "{:?}", env.details);
    assert!(
        env.details
            .last()
            .unwrap()
            .starts_with("NVSHMEM_DEBUG=INFO — NVSHMEM log level")
    );
    assert!(
        !env.details
            .iter()
            .any(|d| d.starts_with("HOME") || d.starts_with("PATH"))
    );
    let gpus = report.check("gpus").unwrap();
    assert!(
        gpus.details
            .iter()
            .any(|d| d.starts_with("CUDA_VISIBLE_DEVICES=0"))
    );
}
