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

/// A port's GIDs: (index, GID, type such as `IB/RoCE v1` or `RoCE v2`), the zero ones left out.
fn port_gids(fs: &HostFs, device: &str, port: &str) -> Vec<(String, String, String)> {
    let base = format!("/sys/class/infiniband/{device}/ports/{port}");
    fs.list(&format!("{base}/gids"))
        .into_iter()
        .filter_map(|i| {
            let gid = fs.read_attr(&format!("{base}/gids/{i}"))?;
            if gid.chars().all(|c| c == '0' || c == ':') {
                return None;
            }
            let kind = fs
                .read_attr(&format!("{base}/gid_attrs/types/{i}"))
                .unwrap_or_else(|| "?".into());
            Some((i, gid, kind))
        })
        .collect()
}

/// The GIDs of the ACTIVE ports for the fabric: on InfiniBand a GID on an InfiniBand port,
/// on RoCE a `RoCE v2` GID on an Ethernet port (an address on the NIC's netdev gives one).
pub(crate) fn gids(fs: &HostFs, devices: &[RdmaDevice], roce: bool) -> Check {
    const ID: &str = "rdma-gids";
    const TITLE: &str = "RDMA ports and GIDs for the fabric";
    let (layer, fabric) = match roce {
        true => ("Ethernet", "RoCE"),
        false => ("InfiniBand", "InfiniBand"),
    };
    if devices.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Skip,
            "no RDMA devices (see rdma-devices)",
        );
    }
    let mut details = Vec::new();
    let mut usable = Vec::new();
    let mut other_layer = 0;
    for d in devices {
        for (port, state, link) in &d.ports {
            if !state.contains("ACTIVE") {
                continue;
            }
            if link != layer {
                other_layer += 1;
                details.push(format!("{} port {port}: {link}, not {layer}", d.name));
                continue;
            }
            let gids: Vec<_> = port_gids(fs, &d.name, port)
                .into_iter()
                .filter(|(_, _, kind)| !roce || kind.eq_ignore_ascii_case("RoCE v2"))
                .collect();
            match gids.first() {
                Some((i, gid, kind)) => {
                    details.push(format!("{} port {port}: GID {i} {gid} ({kind})", d.name));
                    usable.push(format!("{}:{port}", d.name));
                }
                None => details.push(format!(
                    "{} port {port}: no {}GID",
                    d.name,
                    if roce { "RoCE v2 " } else { "" }
                )),
            }
        }
    }
    if !usable.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Pass,
            format!(
                "{} {fabric} port(s) with a GID: {}",
                usable.len(),
                usable.join(", ")
            ),
        )
        .details(details);
    }
    let (finding, fix) = if other_layer > 0 {
        let other = if roce { "infiniband" } else { "roce" };
        (
            format!("no ACTIVE {layer} port: the ACTIVE ports are of another link layer"),
            format!(
                "this node's fabric is not {fabric}: run the preflight with `--network {other}` (stack.toml's deploy.network)"
            ),
        )
    } else if roce {
        (
            "no ACTIVE Ethernet port has a RoCE v2 GID".to_string(),
            "give the NIC's network interface an IP address (RoCE v2 GIDs come from its addresses); `show_gids` lists them".to_string(),
        )
    } else {
        (
            "no ACTIVE InfiniBand port with a GID".to_string(),
            "check the subnet manager (ibstat: a port gets its GID once the SM brings it up)"
                .to_string(),
        )
    };
    Check::new(ID, TITLE, Status::Fail, finding)
        .fix(fix)
        .details(details)
}

/// Whether a kernel module is loaded: in /proc/modules, or its /sys/module directory.
pub(crate) fn module_loaded(fs: &HostFs, name: &str) -> bool {
    let listed = fs
        .read("/proc/modules")
        .ok()
        .flatten()
        .is_some_and(|t| loaded_modules(&t).iter().any(|m| m == name));
    listed || fs.exists(&format!("/sys/module/{name}"))
}

/// GPU memory the NICs can reach: nvidia_peermem (GPUDirect RDMA), or GDRCopy's gdrdrv.
pub(crate) fn registration(fs: &HostFs) -> Check {
    const ID: &str = "gpu-memory-registration";
    const TITLE: &str = "GPU memory for the NICs (nvidia_peermem or gdrdrv)";
    let found: Vec<&str> = ["nvidia_peermem", "nv_peer_mem", "gdrdrv"]
        .into_iter()
        .filter(|m| module_loaded(fs, m))
        .collect();
    if found.is_empty() {
        return Check::new(
            ID,
            TITLE,
            Status::Fail,
            "neither nvidia_peermem nor gdrdrv is loaded (/proc/modules, /sys/module): NVSHMEM cannot register GPU memory with the NICs (\"neither nv_peer_mem, or nvidia_peermem detected\")",
        )
        .fix("on the node: `sudo modprobe nvidia_peermem` (and list it in /etc/modules-load.d/), or install GDRCopy and load gdrdrv");
    }
    Check::new(
        ID,
        TITLE,
        Status::Pass,
        format!("{} loaded", found.join(", ")),
    )
}
