//! The NVIDIA driver settings GPU-initiated IBGDA needs, and gdrdrv for CPU-assisted IBGDA.
//! Source: DeepEP third-party/README.md ("Enable NVSHMEM IBGDA support"), NVIDIA/nvshmem issue 23.

use crate::host::HostFs;
use crate::proc_files::{loaded_modules, nvidia_params, registry_dwords, registry_value};
use crate::report::{Check, Status};

const DRIVER_FIX: &str = "add `options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords=\"PeerMappingOverride=1;\"` \
to /etc/modprobe.d/nvidia.conf, run `sudo update-initramfs -u` and reboot; or load GDRCopy's gdrdrv for CPU-assisted IBGDA";

/// What /proc/driver/nvidia/params says about IBGDA.
#[derive(Debug, Clone)]
pub(crate) enum Settings {
    /// No params file: no NVIDIA kernel module.
    NoDriver,
    Unreadable(String),
    Read {
        stream_memops: Option<String>,
        registry_dwords: Option<String>,
        peer_mapping_override: Option<u64>,
    },
}

impl Settings {
    fn gpu_initiated_ready(&self) -> bool {
        matches!(self, Settings::Read { stream_memops: Some(s), peer_mapping_override: Some(1), .. } if s == "1")
    }
}

pub(crate) fn settings(fs: &HostFs) -> Settings {
    match fs.read("/proc/driver/nvidia/params") {
        Ok(None) => Settings::NoDriver,
        Err(e) => Settings::Unreadable(e.to_string()),
        Ok(Some(text)) => {
            let params = nvidia_params(&text);
            let dwords = params.get("RegistryDwords").cloned();
            let peer = dwords
                .as_deref()
                .map(registry_dwords)
                .and_then(|d| registry_value(&d, "PeerMappingOverride"));
            Settings::Read {
                stream_memops: params.get("EnableStreamMemOPs").cloned(),
                registry_dwords: dwords,
                peer_mapping_override: peer,
            }
        }
    }
}

fn not_read(id: &str, title: &str, settings: &Settings) -> Option<Check> {
    match settings {
        Settings::NoDriver => Some(Check::new(
            id,
            title,
            Status::Skip,
            "no /proc/driver/nvidia/params: the NVIDIA kernel module is not loaded",
        )),
        Settings::Unreadable(e) => Some(Check::new(
            id,
            title,
            Status::Warn,
            format!("cannot read /proc/driver/nvidia/params: {e}"),
        )),
        Settings::Read { .. } => None,
    }
}

pub(crate) fn stream_memops(settings: &Settings) -> Check {
    const ID: &str = "ibgda-stream-memops";
    const TITLE: &str = "IBGDA: NVreg_EnableStreamMemOPs";
    if let Some(check) = not_read(ID, TITLE, settings) {
        return check;
    }
    let Settings::Read { stream_memops, .. } = settings else {
        unreachable!()
    };
    match stream_memops.as_deref() {
        Some("1") => Check::new(ID, TITLE, Status::Pass, "EnableStreamMemOPs: 1"),
        Some(v) => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("EnableStreamMemOPs: {v} — GPU-initiated IBGDA (DeepEP internode, low-latency across nodes) cannot run; on one node, intranode and low-latency kernels over NVLink are unaffected"),
        )
        .fix(DRIVER_FIX),
        None => Check::new(ID, TITLE, Status::Warn, "no EnableStreamMemOPs in /proc/driver/nvidia/params").fix(DRIVER_FIX),
    }
}

pub(crate) fn peer_mapping(settings: &Settings) -> Check {
    const ID: &str = "ibgda-peer-mapping";
    const TITLE: &str = "IBGDA: RegistryDwords PeerMappingOverride";
    if let Some(check) = not_read(ID, TITLE, settings) {
        return check;
    }
    let Settings::Read {
        registry_dwords,
        peer_mapping_override,
        ..
    } = settings
    else {
        unreachable!()
    };
    let shown = format!(
        "RegistryDwords: \"{}\"",
        registry_dwords.as_deref().unwrap_or("")
    );
    match peer_mapping_override {
        Some(1) => Check::new(ID, TITLE, Status::Pass, format!("PeerMappingOverride=1 ({shown})")),
        _ => Check::new(
            ID,
            TITLE,
            Status::Warn,
            format!("PeerMappingOverride=1 not set ({shown}): the GPU cannot map the NIC's doorbells for GPU-initiated IBGDA"),
        )
        .fix(DRIVER_FIX),
    }
}

pub(crate) fn gdrdrv(fs: &HostFs, settings: &Settings) -> Check {
    const ID: &str = "gdrdrv";
    const TITLE: &str = "GDRCopy gdrdrv (CPU-assisted IBGDA)";
    let loaded = match fs.read("/proc/modules") {
        Ok(Some(text)) => loaded_modules(&text).iter().any(|m| m == "gdrdrv"),
        Ok(None) => {
            return Check::new(
                ID,
                TITLE,
                Status::Warn,
                "no /proc/modules: cannot tell whether gdrdrv is loaded",
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
    let device = fs.exists("/dev/gdrdrv");
    match (loaded, device) {
        (true, true) => Check::new(ID, TITLE, Status::Pass, "gdrdrv loaded, /dev/gdrdrv present"),
        (true, false) => Check::new(ID, TITLE, Status::Warn, "gdrdrv loaded but /dev/gdrdrv is missing here")
            .fix("pass /dev/gdrdrv into the container (--device=/dev/gdrdrv)"),
        (false, _) if settings.gpu_initiated_ready() => Check::new(
            ID,
            TITLE,
            Status::Skip,
            "gdrdrv not loaded; not needed: the driver is set up for GPU-initiated IBGDA",
        ),
        (false, _) => Check::new(
            ID,
            TITLE,
            Status::Warn,
            "gdrdrv not loaded and the driver is not set up for GPU-initiated IBGDA: no IBGDA mode is available",
        )
        .fix("install GDRCopy and load gdrdrv (CPU-assisted IBGDA), or set the driver options (GPU-initiated IBGDA)"),
    }
}
