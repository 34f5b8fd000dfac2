//! RDMA NICs (/sys/class/infiniband, /dev/infiniband) and GPUDirect RDMA (nvidia_peermem).

use crate::host::HostFs;
use crate::proc_files::loaded_modules;
use crate::report::{Check, Status};

/// One RDMA device and its ports.
#[derive(Debug, Clone)]
pub(crate) struct RdmaDevice {
    pub name: String,
    /// (port, state such as `4: ACTIVE`, link layer such as `InfiniBand` / `Ethernet`)
    pub ports: Vec<(String, String, String)>,
}

impl RdmaDevice {
    fn active_ports(&self) -> usize {
        self.ports
            .iter()
            .filter(|(_, state, _)| state.contains("ACTIVE"))
            .count()
    }
}

pub(crate) fn devices(fs: &HostFs) -> Vec<RdmaDevice> {
    fs.list("/sys/class/infiniband")
        .into_iter()
        .map(|name| {
            let base = format!("/sys/class/infiniband/{name}/ports");
            let ports = fs
                .list(&base)
                .into_iter()
                .map(|p| {
                    let state = fs
                        .read_attr(&format!("{base}/{p}/state"))
                        .unwrap_or_else(|| "?".into());
                    let layer = fs
                        .read_attr(&format!("{base}/{p}/link_layer"))
                        .unwrap_or_else(|| "?".into());
                    (p, state, layer)
                })
                .collect();
            RdmaDevice { name, ports }
        })
        .collect()
}

pub(crate) fn check(fs: &HostFs, devices: &[RdmaDevice]) -> Check {
    const ID: &str = "rdma-devices";
    const TITLE: &str = "RDMA devices";
    if devices.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            "no RDMA devices (/sys/class/infiniband is empty or missing): DeepEP internode kernels and low-latency across nodes (NVSHMEM IBGDA) cannot run; on one node, intranode and low-latency kernels run over NVLink (NVSHMEM logs \"init failed for transport: IBGDA\" and goes on)",
        )
        .fix("for multi-node runs: a host with ConnectX NICs and their driver (mlx5_ib), and /dev/infiniband passed into the container");
    }
    let details: Vec<String> = devices
        .iter()
        .map(|d| {
            let ports: Vec<String> = d
                .ports
                .iter()
                .map(|(p, s, l)| format!("port {p} {s} {l}"))
                .collect();
            format!(
                "{}: {}",
                d.name,
                if ports.is_empty() {
                    "no ports".into()
                } else {
                    ports.join(", ")
                }
            )
        })
        .collect();
    let active: usize = devices.iter().map(RdmaDevice::active_ports).sum();
    let uverbs: Vec<String> = fs
        .list("/dev/infiniband")
        .into_iter()
        .filter(|n| n.starts_with("uverbs"))
        .collect();
    if uverbs.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            format!("{} RDMA devices, but /dev/infiniband has no uverbs: user-space verbs cannot open them here", devices.len()),
        )
        .fix("pass the devices into the container (--device=/dev/infiniband/uverbsN and rdma_cm, or the RDMA shared device plugin)")
        .details(details);
    }
    if active == 0 {
        return Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("{} RDMA devices, no port ACTIVE", devices.len()),
        )
        .fix("check cabling and the subnet manager (ibstat); RoCE ports need a configured link")
        .details(details);
    }
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    Check::new(
        ID,
        TITLE,
        Status::Pass,
        format!(
            "{} RDMA devices, {active} ports ACTIVE ({}), {} uverbs devices",
            devices.len(),
            names.join(", "),
            uverbs.len()
        ),
    )
    .details(details)
}

pub(crate) fn peermem(fs: &HostFs, devices: &[RdmaDevice]) -> Check {
    const ID: &str = "nvidia-peermem";
    const TITLE: &str = "GPUDirect RDMA (nvidia_peermem)";
    let modules = match fs.read("/proc/modules") {
        Ok(Some(text)) => loaded_modules(&text),
        Ok(None) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                "no /proc/modules: cannot tell which kernel modules are loaded",
            );
        }
        Err(e) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("cannot read /proc/modules: {e}"),
            );
        }
    };
    if let Some(m) = modules
        .iter()
        .find(|m| *m == "nvidia_peermem" || *m == "nv_peer_mem")
    {
        return Check::new(ID, TITLE, Status::Pass, format!("{m} loaded"));
    }
    if devices.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Skip,
            "nvidia_peermem not loaded; not needed without RDMA devices",
        );
    }
    Check::new(
        ID,
        TITLE,
        Status::Warn,
        "nvidia_peermem not loaded: NVSHMEM skips its IB transports (\"neither nv_peer_mem, or nvidia_peermem detected\") unless DMA-BUF works",
    )
    .fix("sudo modprobe nvidia_peermem (and list it in /etc/modules-load.d/ to persist)")
}
