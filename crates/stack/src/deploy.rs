//! `[deploy]`: where and how the image runs (`cargo xtask deploy render`, crates/deploy).
//! The model only; `deploy_check` makes it from the raw section. Not in the echo or the
//! fingerprint: deploy settings change where the image runs, never what is built, so
//! editing them does not make the lock stale.

use std::collections::BTreeMap;

/// The fabric between the nodes, which decides the RDMA resource and the transports'
/// environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    Infiniband,
    Roce,
    /// No RDMA: one node only (DeepEP's internode kernels and NVSHMEM's IBGDA need RDMA).
    None,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::Infiniband => "infiniband",
            Network::Roce => "roce",
            Network::None => "none",
        }
    }
}

/// What a pod is given so that NVSHMEM's IBGDA can map the NIC's doorbells from the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IbgdaAccess {
    /// The nodes' NVIDIA driver is loaded with `NVreg_RegistryDwords="PeerMappingOverride=1;"`
    /// (the preflight checks it): nothing beyond IPC_LOCK.
    Driver,
    /// CAP_SYS_RAWIO added (llm-d's wide-EP manifests do so). An opt-in: whether it is
    /// enough without PeerMappingOverride depends on the driver; the preflight says.
    SysRawio,
    /// A privileged container: what NVSHMEM's IBGDA needs where the driver lacks
    /// PeerMappingOverride. Every device of the node, every capability.
    Privileged,
}

impl IbgdaAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            IbgdaAccess::Driver => "driver",
            IbgdaAccess::SysRawio => "sys-rawio",
            IbgdaAccess::Privileged => "privileged",
        }
    }
}

/// The LeaderWorkerSet's `restartPolicy`: what happens to a group when one pod fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupRestart {
    /// Recreate the whole group, but only once every pod of it has started (none Pending):
    /// a slow pull of a large image on one node does not recreate the others in a loop.
    RecreateGroupAfterStart,
    /// Recreate the whole group on any pod or container restart (LWS's default).
    RecreateGroupOnPodRestart,
    /// Restart only the failed pod (NCCL and NVSHMEM cannot take a rank back: rarely right).
    None,
}

impl GroupRestart {
    /// As LWS spells it.
    pub fn lws(self) -> &'static str {
        match self {
            GroupRestart::RecreateGroupAfterStart => "RecreateGroupAfterStart",
            GroupRestart::RecreateGroupOnPodRestart => "RecreateGroupOnPodRestart",
            GroupRestart::None => "None",
        }
    }
}

/// How the Slurm job runs the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmContainer {
    /// Slurm's own OCI container support (`srun --container=BUNDLE`, oci.conf's runtime,
    /// e.g. crun): the bundle is made on each node by skopeo (pull by digest) and umoci.
    Oci,
    /// The pyxis plugin's `srun --container-image=` (enroot imports the image).
    Pyxis,
}

impl SlurmContainer {
    pub fn as_str(self) -> &'static str {
        match self {
            SlurmContainer::Oci => "oci",
            SlurmContainer::Pyxis => "pyxis",
        }
    }
}

/// `[deploy.slurm]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slurm {
    pub container: SlurmContainer,
    pub partition: Option<String>,
    pub account: Option<String>,
    /// `--time`, as Slurm writes it (`HH:MM:SS`, `D-HH:MM`, minutes).
    pub time: Option<String>,
    /// Where each node keeps the OCI bundles it made (one per image digest).
    pub bundle_dir: String,
}

pub const DEFAULT_BUNDLE_DIR: &str = "/var/tmp/commstack-bundles";
pub const DEFAULT_DEPLOY_NAME: &str = "commstack";
pub const DEFAULT_NAMESPACE: &str = "default";
pub const DEFAULT_SHM_SIZE: &str = "32Gi";
pub const DEFAULT_MASTER_PORT: u16 = 29500;
pub const DEFAULT_GATE_DEADLINE_SECONDS: u32 = 3600;
/// Longest `name`: the pods' host names (`<name>-gate-selftest-0-12-abcde`, LWS's
/// `<name>-<group>-<worker>`) must stay within a 63-character DNS label.
pub const MAX_DEPLOY_NAME: usize = 30;

/// A Kubernetes resource quantity as written (`32Gi`, `500m`), checked for form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quantity {
    pub text: String,
    /// Its value rounded down to a whole number (bytes for sizes).
    pub value: u128,
}

/// `[deploy]`, validated; defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deploy {
    /// The objects' base name (a DNS label of at most [`MAX_DEPLOY_NAME`] characters).
    pub name: String,
    pub namespace: String,
    /// Nodes of one serving group (the LeaderWorkerSet's size), one pod or task each.
    pub nodes: u32,
    /// GPUs of each node, all held by its one pod (its ranks share a PID namespace).
    pub gpus_per_node: u32,
    /// Serving groups (the LeaderWorkerSet's replicas).
    pub replicas: u32,
    pub network: Network,
    /// The extended resource of the RDMA device plugin, e.g. `rdma/ib`, `rdma/roce_gdr`;
    /// None exactly when `network` is none.
    pub rdma_resource: Option<String>,
    pub rdma_per_node: u32,
    /// RoCE's GID index for NVSHMEM and NCCL (NVSHMEM_IB_GID_INDEX, NCCL_IB_GID_INDEX).
    pub gid_index: Option<u32>,
    /// The interface NCCL's and NVSHMEM's bootstrap sockets use.
    pub socket_ifname: Option<String>,
    /// The payload, as an argv.
    pub command: Vec<String>,
    /// Extra environment of every container, in name order.
    pub env: BTreeMap<String, String>,
    pub shm_size: Quantity,
    pub ibgda_access: IbgdaAccess,
    pub run_as_root: bool,
    pub host_network: bool,
    pub node_selector: BTreeMap<String, String>,
    pub image_pull_secret: Option<String>,
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub ephemeral_storage: Option<Quantity>,
    pub restart_policy: GroupRestart,
    pub master_port: u16,
    /// The gate's limit: each of its Jobs is stopped after this many seconds.
    pub gate_deadline_seconds: u32,
    pub slurm: Slurm,
}
