//! The pod every rendered object runs: one per node, holding all of the node's GPUs and
//! ranks (DeepEP V2's local ranks exchange memory with pidfd_getfd: one PID namespace),
//! the image by digest, the RDMA resource, the capabilities the transports need and a
//! fresh memory-backed /dev/shm.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, EmptyDirVolumeSource, EnvVar, LocalObjectReference,
    PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, ResourceRequirements,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use commstack_stack::deploy::IbgdaAccess;

use crate::shape::{JIT_CACHE_VAR, Shape};

/// One pod's container and how it is placed.
pub struct PodParts {
    pub container: String,
    pub command: Vec<String>,
    pub env: Vec<EnvVar>,
    /// Labels of the pod template.
    pub labels: BTreeMap<String, String>,
    /// Pods carrying these labels never share a node with this one.
    pub spread_by: BTreeMap<String, String>,
    /// `Always` for the serving group (a StatefulSet's pods), `Never` for the gate's Jobs.
    pub restart_policy: &'static str,
}

const GPU_RESOURCE: &str = "nvidia.com/gpu";
const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";

pub fn template(shape: &Shape, parts: PodParts) -> PodTemplateSpec {
    let d = shape.deploy;
    let mut volumes = vec![Volume {
        name: "dshm".into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(Quantity(d.shm_size.text.clone())),
        }),
        ..Volume::default()
    }];
    let mut mounts = vec![VolumeMount {
        name: "dshm".into(),
        mount_path: "/dev/shm".into(),
        ..VolumeMount::default()
    }];
    // DeepEP V2's JIT cache, where the image's environment says it is: a volume of its own.
    if let Some(cache) = shape.image_var(JIT_CACHE_VAR) {
        volumes.push(Volume {
            name: "ep-jit-cache".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: "ep-jit-cache".into(),
            mount_path: cache.into(),
            ..VolumeMount::default()
        });
    }
    let container = Container {
        name: parts.container,
        image: Some(shape.image.to_string()),
        // By digest the bytes never change: a node that has them never pulls again.
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(parts.command),
        env: Some(parts.env),
        resources: Some(resources(shape)),
        security_context: Some(security(shape)),
        volume_mounts: Some(mounts),
        ..Container::default()
    };
    let spread = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(parts.spread_by),
            ..LabelSelector::default()
        }),
        topology_key: HOSTNAME_TOPOLOGY.into(),
        ..PodAffinityTerm::default()
    };
    let spec = PodSpec {
        containers: vec![container],
        restart_policy: Some(parts.restart_policy.into()),
        volumes: Some(volumes),
        affinity: Some(Affinity {
            pod_anti_affinity: Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![spread]),
                ..PodAntiAffinity::default()
            }),
            ..Affinity::default()
        }),
        node_selector: (!d.node_selector.is_empty()).then(|| d.node_selector.clone()),
        image_pull_secrets: d
            .image_pull_secret
            .as_ref()
            .map(|name| vec![LocalObjectReference { name: name.clone() }]),
        host_network: d.host_network.then_some(true),
        // With the node's network, cluster DNS (the leader's name) needs this policy.
        dns_policy: d.host_network.then(|| "ClusterFirstWithHostNet".into()),
        ..PodSpec::default()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(parts.labels),
            ..ObjectMeta::default()
        }),
        spec: Some(spec),
    }
}

fn resources(shape: &Shape) -> ResourceRequirements {
    let d = shape.deploy;
    let mut r = BTreeMap::new();
    r.insert(
        GPU_RESOURCE.to_string(),
        Quantity(d.gpus_per_node.to_string()),
    );
    if let Some(rdma) = &d.rdma_resource {
        r.insert(rdma.clone(), Quantity(d.rdma_per_node.to_string()));
    }
    for (name, q) in [
        ("cpu", &d.cpu),
        ("memory", &d.memory),
        ("ephemeral-storage", &d.ephemeral_storage),
    ] {
        if let Some(q) = q {
            r.insert(name.to_string(), Quantity(q.text.clone()));
        }
    }
    // Requests equal limits: extended resources must, and the rest make the pod
    // Guaranteed (not evicted first under memory pressure).
    ResourceRequirements {
        limits: Some(r.clone()),
        requests: Some(r),
        ..ResourceRequirements::default()
    }
}

fn security(shape: &Shape) -> SecurityContext {
    let d = shape.deploy;
    // IPC_LOCK: RDMA registers (pins) memory beyond the default locked-memory limit.
    let mut add = vec!["IPC_LOCK".to_string()];
    if d.ibgda_access == IbgdaAccess::SysRawio {
        add.push("SYS_RAWIO".into());
    }
    SecurityContext {
        capabilities: Some(Capabilities {
            add: Some(add),
            ..Capabilities::default()
        }),
        privileged: (d.ibgda_access == IbgdaAccess::Privileged).then_some(true),
        run_as_user: d.run_as_root.then_some(0),
        run_as_non_root: Some(!d.run_as_root),
        ..SecurityContext::default()
    }
}

/// A literal variable.
pub fn var(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}
