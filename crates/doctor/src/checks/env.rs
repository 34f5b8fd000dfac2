//! Environment variables that silently change what NCCL, NVSHMEM, torch or DeepEP do.

use crate::host::HostFs;
use crate::report::{Check, Status};

/// Whether a variable changes behaviour or only logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Changes,
    Logging,
}

use Effect::{Changes, Logging};

/// Known variables, exact names. Effects from NCCL's and NVSHMEM's environment documentation
/// and sources (NCCL src/**/NCCL_PARAM, NVSHMEM src/include/host/env/env_defs.h).
const KNOWN: &[(&str, Effect, &str)] = &[
    (
        "CUDA_VISIBLE_DEVICES",
        Changes,
        "limits and renumbers the GPUs this process sees: tests and NCCL topology see only these",
    ),
    (
        "CUDA_DEVICE_ORDER",
        Changes,
        "FASTEST_FIRST numbers GPUs differently from nvidia-smi's PCI order",
    ),
    (
        "CUDA_LAUNCH_BLOCKING",
        Changes,
        "serialises every kernel launch: DeepEP overlap is lost and kernels that wait on each other can hang",
    ),
    (
        "NVSHMEM_DIR",
        Changes,
        "DeepEP's setup.py builds and links against the NVSHMEM in this directory",
    ),
    (
        "EP_SUPPRESS_NCCL_CHECK",
        Changes,
        "DeepEP skips its check that only one libnccl is loaded",
    ),
    (
        "NCCL_P2P_DISABLE",
        Changes,
        "disables NVLink/PCIe peer-to-peer: GPU traffic goes through host memory",
    ),
    (
        "NCCL_P2P_LEVEL",
        Changes,
        "limits by topology distance when NCCL uses peer-to-peer",
    ),
    (
        "NCCL_SHM_DISABLE",
        Changes,
        "disables the shared-memory transport between local ranks",
    ),
    (
        "NCCL_IB_DISABLE",
        Changes,
        "disables InfiniBand/RoCE: inter-node traffic falls back to TCP sockets",
    ),
    (
        "NCCL_NET",
        Changes,
        "forces one network module (IB, Socket or a plugin's)",
    ),
    (
        "NCCL_NET_PLUGIN",
        Changes,
        "loads another network plugin library",
    ),
    (
        "NCCL_SOCKET_IFNAME",
        Changes,
        "restricts the interfaces used for bootstrap and socket traffic",
    ),
    (
        "NCCL_IB_HCA",
        Changes,
        "restricts which RDMA NICs and ports NCCL uses",
    ),
    (
        "NCCL_IB_GID_INDEX",
        Changes,
        "selects the RoCE GID (address family / RoCE version)",
    ),
    (
        "NCCL_CUMEM_ENABLE",
        Changes,
        "turns cuMem-based buffers on or off (NCCL's device API, used by DeepEP V2, needs cuMem)",
    ),
    ("NCCL_NVLS_ENABLE", Changes, "turns NVLink SHARP on or off"),
    ("NCCL_ALGO", Changes, "overrides NCCL's algorithm choice"),
    ("NCCL_PROTO", Changes, "overrides NCCL's protocol choice"),
    (
        "NCCL_MIN_NCHANNELS",
        Changes,
        "changes the channel count, hence bandwidth and SM use",
    ),
    (
        "NCCL_MAX_NCHANNELS",
        Changes,
        "changes the channel count, hence bandwidth and SM use",
    ),
    (
        "NCCL_BUFFSIZE",
        Changes,
        "changes NCCL's buffer size per channel",
    ),
    (
        "NCCL_NET_GDR_LEVEL",
        Changes,
        "limits when GPUDirect RDMA is used",
    ),
    (
        "NCCL_NET_GDR_READ",
        Changes,
        "turns GPUDirect RDMA reads on or off",
    ),
    (
        "NCCL_DMABUF_ENABLE",
        Changes,
        "turns DMA-BUF GPUDirect RDMA on or off",
    ),
    (
        "NCCL_COMM_ID",
        Changes,
        "fixes the bootstrap root address of every communicator",
    ),
    (
        "NCCL_TOPO_FILE",
        Changes,
        "replaces the detected topology with a file",
    ),
    (
        "NCCL_GRAPH_FILE",
        Changes,
        "replaces NCCL's computed graphs with a file",
    ),
    (
        "NCCL_IGNORE_CPU_AFFINITY",
        Changes,
        "ignores the process's CPU affinity when pinning NCCL threads",
    ),
    (
        "NCCL_CROSS_NIC",
        Changes,
        "lets rings/trees use different NICs on different nodes",
    ),
    (
        "NCCL_RUNTIME_CONNECT",
        Changes,
        "connects peers lazily at first use instead of at init",
    ),
    (
        "NCCL_LAUNCH_MODE",
        Changes,
        "changes how NCCL launches kernels for multi-GPU processes",
    ),
    ("NCCL_DEBUG", Logging, "NCCL log level"),
    ("NCCL_DEBUG_SUBSYS", Logging, "NCCL log subsystems"),
    ("NCCL_DEBUG_FILE", Logging, "NCCL log file"),
    (
        "NVSHMEM_DISABLE_NCCL",
        Changes,
        "NVSHMEM host collectives stop using NCCL (no effect on a build with NVSHMEM_USE_NCCL=OFF)",
    ),
    (
        "NVSHMEM_REMOTE_TRANSPORT",
        Changes,
        "picks NVSHMEM's inter-node transport (ibrc, ucx, libfabric, ibdevx, none)",
    ),
    (
        "NVSHMEM_IB_ENABLE_IBGDA",
        Changes,
        "turns the GPU-initiated IBGDA transport on or off (DeepEP sets it itself)",
    ),
    (
        "NVSHMEM_IBGDA_NIC_HANDLER",
        Changes,
        "gpu or cpu: who rings the NIC doorbell (cpu needs gdrdrv)",
    ),
    (
        "NVSHMEM_HCA_LIST",
        Changes,
        "restricts which NICs NVSHMEM uses",
    ),
    (
        "NVSHMEM_HCA_PE_MAPPING",
        Changes,
        "maps NICs to PEs by hand",
    ),
    (
        "NVSHMEM_ENABLE_NIC_PE_MAPPING",
        Changes,
        "assigns NICs to PEs round-robin instead of by distance",
    ),
    (
        "NVSHMEM_SYMMETRIC_SIZE",
        Changes,
        "sets the symmetric heap size per PE",
    ),
    (
        "NVSHMEM_DISABLE_P2P",
        Changes,
        "disables NVLink/PCIe peer access between PEs",
    ),
    (
        "NVSHMEM_DISABLE_CUDA_VMM",
        Changes,
        "disables CUDA VMM for the symmetric heap",
    ),
    (
        "NVSHMEM_DISABLE_MNNVL",
        Changes,
        "disables multi-node NVLink",
    ),
    (
        "NVSHMEM_BOOTSTRAP",
        Changes,
        "picks how PEs find each other (PMI, MPI, UID, plugin)",
    ),
    (
        "NVSHMEM_BOOTSTRAP_PLUGIN",
        Changes,
        "loads another bootstrap plugin",
    ),
    (
        "NVSHMEM_IBGDA_NUM_RC_PER_PE",
        Changes,
        "changes the RC QPs per PE (DeepEP chooses its own)",
    ),
    (
        "NVSHMEM_IBGDA_NUM_DCT",
        Changes,
        "asks for DC QPs, which DeepEP does not use (DeepEP issue 461: hangs or segfaults)",
    ),
    (
        "NVSHMEM_QP_DEPTH",
        Changes,
        "changes the QP depth (DeepEP low-latency mode asserts a minimum)",
    ),
    (
        "NVSHMEM_DEBUG",
        Logging,
        "NVSHMEM log level (and, for a source build, a debug build)",
    ),
    ("NVSHMEM_DEBUG_SUBSYS", Logging, "NVSHMEM log subsystems"),
    ("NVSHMEM_DEBUG_FILE", Logging, "NVSHMEM log file"),
    ("NVSHMEM_INFO", Logging, "prints NVSHMEM's settings at init"),
];

/// NVSHMEM's cmake_config/NVSHMEMEnv.cmake reads these as option defaults: exported, they change
/// any NVSHMEM source build started from this shell.
const NVSHMEM_BUILD_OPTIONS: &[&str] = &[
    "NVSHMEM_MPI_SUPPORT",
    "NVSHMEM_IBRC_SUPPORT",
    "NVSHMEM_USE_GDRCOPY",
    "NVSHMEM_USE_MLX5DV",
    "NVSHMEM_NVTX",
    "NVSHMEM_BUILD_TESTS",
    "NVSHMEM_BUILD_EXAMPLES",
    "NVSHMEM_BUILD_PYTHON_LIB",
    "NVSHMEM_PMIX_SUPPORT",
    "NVSHMEM_SHMEM_SUPPORT",
    "NVSHMEM_IBGDA_SUPPORT",
    "NVSHMEM_IBDEVX_SUPPORT",
    "NVSHMEM_LIBFABRIC_SUPPORT",
    "NVSHMEM_UCX_SUPPORT",
    "NVSHMEM_USE_NCCL",
    "NVSHMEM_PREFIX",
    "NVSHMEM_HOME",
    "NCCL_HOME",
    "GDRCOPY_HOME",
];

const VALUE_MAX: usize = 120;

pub(crate) fn check(env: &[(String, String)], fs: &HostFs) -> Check {
    let mut changes = Vec::new();
    let mut logging = Vec::new();
    let mut sorted: Vec<&(String, String)> = env.iter().collect();
    sorted.sort();
    for (name, value) in sorted {
        let Some((effect, what)) = describe(name, value, fs) else {
            continue;
        };
        let line = format!("{name}={} — {what}", shorten(value));
        match effect {
            Changes => changes.push(line),
            Logging => logging.push(line),
        }
    }
    let count = changes.len();
    let mut details = changes;
    details.extend(logging.iter().cloned());
    let title = "Environment variables that change NCCL / NVSHMEM behaviour";
    if count > 0 {
        Check::new(
            "environment",
            title,
            Status::Warn,
            format!("{count} variable{} change{} NCCL / NVSHMEM / DeepEP behaviour", plural(count), if count == 1 { "s" } else { "" }),
        )
        .fix("unset what you did not mean to set (commstack's builds clear NVSHMEM_* themselves; runs inherit the rest)")
        .details(details)
    } else if !logging.is_empty() {
        Check::new(
            "environment",
            title,
            Status::Pass,
            "only logging variables are set",
        )
        .details(details)
    } else {
        Check::new(
            "environment",
            title,
            Status::Pass,
            "no variable that changes NCCL / NVSHMEM behaviour is set",
        )
    }
}

fn describe(name: &str, value: &str, fs: &HostFs) -> Option<(Effect, String)> {
    if let Some((_, effect, what)) = KNOWN.iter().find(|(n, _, _)| *n == name) {
        let mut what = what.to_string();
        if NVSHMEM_BUILD_OPTIONS.contains(&name) {
            what.push_str("; also a default for NVSHMEM source builds");
        }
        return Some((*effect, what));
    }
    if NVSHMEM_BUILD_OPTIONS.contains(&name) {
        return Some((Changes, "an NVSHMEM CMake option default (cmake_config/NVSHMEMEnv.cmake): changes a source build".into()));
    }
    match name {
        "LD_PRELOAD" => {
            let comm = value.split([':', ' ']).any(is_comm_library);
            return Some(if comm {
                (Changes, "preloads an NCCL or NVSHMEM library: it wins over the one torch / DeepEP would load".into())
            } else {
                (Changes, "preloads libraries into every process".into())
            });
        }
        "LD_LIBRARY_PATH" => return ld_library_path(value, fs),
        _ => {}
    }
    // Set by NVIDIA's container images to describe what they ship; NCCL never reads it.
    if name == "NCCL_VERSION" {
        return None;
    }
    if name.starts_with("TORCH_NCCL_") {
        return Some((
            Changes,
            "changes torch's ProcessGroupNCCL (watchdog, blocking wait, error handling)".into(),
        ));
    }
    if name.starts_with("NCCL_") {
        return Some((
            Changes,
            "an NCCL setting, read by every communicator in the process".into(),
        ));
    }
    if name.starts_with("NVSHMEM_") {
        return Some((
            Changes,
            "an NVSHMEM runtime setting (and a CMake default for source builds)".into(),
        ));
    }
    None
}

/// LD_LIBRARY_PATH matters when one of its directories holds an NCCL or NVSHMEM library:
/// it is searched before the RUNPATH that points torch at its own wheel's copy.
fn ld_library_path(value: &str, fs: &HostFs) -> Option<(Effect, String)> {
    let mut found = Vec::new();
    for dir in value.split(':').filter(|d| !d.is_empty()) {
        for file in fs.list(dir) {
            if is_comm_library(&file) {
                found.push(format!("{}/{file}", dir.trim_end_matches('/')));
            }
        }
    }
    if found.is_empty() {
        None
    } else {
        Some((
            Changes,
            format!(
                "holds {}: searched before torch's RUNPATH, so another NCCL / NVSHMEM may load",
                found.join(", ")
            ),
        ))
    }
}

fn is_comm_library(name: &str) -> bool {
    let file = name.rsplit('/').next().unwrap_or(name);
    file.starts_with("libnccl.so")
        || file.starts_with("libnvshmem_host.so")
        || file.starts_with("libnvshmem.so")
}

fn shorten(value: &str) -> String {
    match value.char_indices().nth(VALUE_MAX) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_string(),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
