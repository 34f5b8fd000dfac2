//! GPUs (count and model) and how they are connected (`nvidia-smi topo -m`).

use std::collections::BTreeMap;

use super::input::Host;
use crate::nvidia_smi::{parse_query_csv, parse_topology};
use crate::report::{Check, Status};

const NO_DRIVER_FIX: &str = "install the NVIDIA driver (nvidia-smi ships with it); in a container, run with the NVIDIA container toolkit (--gpus all)";

pub(crate) fn gpus(host: &Host) -> Check {
    const ID: &str = "gpus";
    const TITLE: &str = "GPUs";
    if let Some(why) = &host.smi.absent {
        return Check::new(ID, TITLE, Status::Fail, why.clone()).fix(NO_DRIVER_FIX);
    }
    let rows = match host
        .smi
        .query_csv
        .as_deref()
        .map_err(Clone::clone)
        .and_then(parse_query_csv)
    {
        Ok(rows) => rows,
        Err(e) => {
            return Check::new(ID, TITLE, Status::Fail, format!("cannot list GPUs: {e}"))
                .fix(NO_DRIVER_FIX);
        }
    };
    let mut models: BTreeMap<&str, usize> = BTreeMap::new();
    for row in &rows {
        *models.entry(row.name.as_str()).or_default() += 1;
    }
    let what = models
        .iter()
        .map(|(m, n)| format!("{n}× {m}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut details: Vec<String> = rows
        .iter()
        .map(|r| {
            let mut d = format!(
                "GPU {}: {}",
                r.index.map_or("?".into(), |i| i.to_string()),
                r.name
            );
            if let Some(bus) = &r.pci_bus_id {
                d.push_str(&format!(", {bus}"));
            }
            if let Some(mem) = &r.memory_total {
                d.push_str(&format!(", {mem}"));
            }
            d
        })
        .collect();
    if let Some(visible) = host.env("CUDA_VISIBLE_DEVICES") {
        details.push(format!(
            "CUDA_VISIBLE_DEVICES={visible}: processes see only these of the GPUs above"
        ));
    }
    let check = match rows.len() {
        0 => Check::new(ID, TITLE, Status::Fail, "nvidia-smi lists no GPU").fix(NO_DRIVER_FIX),
        1 => Check::new(ID, TITLE, Status::Warn, format!("1 GPU ({what}): DeepEP intranode tests need 2, 4 or 8 GPUs and cannot run here"))
            .fix("run the intranode tests on a host with 2, 4 or 8 NVLink-connected GPUs; single-GPU checks (import, loaded libraries, kernel self-test) still run here"),
        2 | 4 | 8 => Check::new(ID, TITLE, Status::Pass, format!("{} GPUs: {what}", rows.len())),
        n => Check::new(ID, TITLE, Status::Warn, format!("{n} GPUs ({what}): DeepEP intranode tests run with 2, 4 or 8 ranks"))
            .fix("run the tests on a 2-, 4- or 8-GPU subset (CUDA_VISIBLE_DEVICES)"),
    };
    check.details(details)
}

pub(crate) fn topology(host: &Host) -> Check {
    const ID: &str = "gpu-topology";
    const TITLE: &str = "GPU peer-to-peer / NVLink topology";
    if let Some(why) = &host.smi.absent {
        return Check::new(ID, TITLE, Status::Skip, why.clone());
    }
    let topo = match host
        .smi
        .topo
        .as_deref()
        .map_err(Clone::clone)
        .and_then(parse_topology)
    {
        Ok(t) => t,
        Err(e) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                format!("cannot read the topology: {e}"),
            )
            .fix("run `nvidia-smi topo -m` by hand and look for NV# links between every GPU pair");
        }
    };
    let gpus = topo.gpus();
    let mut details = nic_affinity(&topo);
    if gpus.len() < 2 {
        return Check::new(
            ID,
            TITLE,
            Status::Skip,
            format!("{} GPU: no GPU pairs to connect", gpus.len()),
        )
        .details(details);
    }
    let mut nvlink = BTreeMap::new();
    let mut pcie = Vec::new();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let link = topo.link(a, b).unwrap_or("?");
            if link.starts_with("NV") {
                *nvlink.entry(link.to_string()).or_insert(0usize) += 1;
            } else {
                pcie.push(format!("{a}–{b} {link}"));
            }
        }
    }
    let kinds = nvlink.keys().cloned().collect::<Vec<_>>().join("/");
    if pcie.is_empty() {
        Check::new(
            ID,
            TITLE,
            Status::Pass,
            format!(
                "all {} GPUs pairwise connected by NVLink ({kinds})",
                gpus.len()
            ),
        )
        .details(details)
    } else {
        let pairs = gpus.len() * (gpus.len() - 1) / 2;
        let finding = format!(
            "{} of {pairs} GPU pairs have no NVLink (PCIe or host bridge only): DeepEP intranode kernels need NVLink between all ranks",
            pcie.len()
        );
        details.splice(0..0, pcie);
        Check::new(ID, TITLE, Status::Warn, finding)
            .fix("run intranode ranks on an NVLink-connected set of GPUs (an NVSwitch host connects all 8)")
            .details(details)
    }
}

/// `mlx5_0 (NIC0): PIX to GPU0` — the closest GPUs of each NIC, what NVSHMEM maps PEs by.
fn nic_affinity(topo: &crate::nvidia_smi::Topology) -> Vec<String> {
    const CLOSE: [&str; 2] = ["PIX", "PXB"];
    let gpus = topo.gpus();
    topo.devices
        .iter()
        .filter(|d| d.starts_with("NIC"))
        .map(|nic| {
            let name = topo
                .nic_names
                .get(nic)
                .map_or(nic.clone(), |n| format!("{n} ({nic})"));
            let close: Vec<String> = gpus
                .iter()
                .filter_map(|g| {
                    topo.link(nic, g)
                        .filter(|l| CLOSE.contains(l))
                        .map(|l| format!("{l} to {g}"))
                })
                .collect();
            if close.is_empty() {
                format!("{name}: no GPU behind the same PCIe switch")
            } else {
                format!("{name}: {}", close.join(", "))
            }
        })
        .collect()
}
