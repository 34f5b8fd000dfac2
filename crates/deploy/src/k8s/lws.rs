//! The serving group: a LeaderWorkerSet of `nodes` pods per group, one per node, its
//! leader's address, group size and worker index wired into the bootstrap of torch
//! (MASTER_ADDR, NNODES/NODE_RANK, torchrun's PET_*), DeepEP (WORLD_SIZE and RANK count
//! nodes, as its launch scripts read them) and commstack's self-test.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use commstack_stack::deploy::GroupRestart;

use crate::k8s::crd::*;
use crate::k8s::pod::{self, PodParts, var};
use crate::shape::Shape;

/// The bootstrap from the variables LWS puts first in every container
/// (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX), so `$(...)` expands.
pub fn bootstrap_env(shape: &Shape) -> Vec<EnvVar> {
    let g = shape.deploy.gpus_per_node.to_string();
    let port = shape.deploy.master_port.to_string();
    vec![
        var("MASTER_ADDR", "$(LWS_LEADER_ADDRESS)"),
        var("MASTER_PORT", port.clone()),
        var("NNODES", "$(LWS_GROUP_SIZE)"),
        var("NODE_RANK", "$(LWS_WORKER_INDEX)"),
        var("NPROC_PER_NODE", g.clone()),
        var("WORLD_SIZE", "$(LWS_GROUP_SIZE)"),
        var("RANK", "$(LWS_WORKER_INDEX)"),
        var("PET_NNODES", "$(LWS_GROUP_SIZE)"),
        var("PET_NODE_RANK", "$(LWS_WORKER_INDEX)"),
        var("PET_NPROC_PER_NODE", g),
        var("PET_MASTER_ADDR", "$(LWS_LEADER_ADDRESS)"),
        var("PET_MASTER_PORT", port),
        var(
            "COMMSTACK_RDZV_ADDR",
            format!("$(LWS_LEADER_ADDRESS):{}", shape.rdzv_port()),
        ),
    ]
}

pub fn leader_worker_set(shape: &Shape) -> LeaderWorkerSet {
    let d = shape.deploy;
    let mut env = bootstrap_env(shape);
    env.extend(shape.fixed_env().into_iter().map(|(k, v)| var(&k, v)));
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/name".to_string(), d.name.clone()),
        (
            "app.kubernetes.io/component".to_string(),
            "serve".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "commstack".to_string(),
        ),
    ]
    .into();
    let template = pod::template(
        shape,
        PodParts {
            container: "main".into(),
            command: d.command.clone(),
            env,
            labels: labels.clone(),
            spread_by: [(LWS_NAME_LABEL.to_string(), d.name.clone())].into(),
            // LWS runs each group's pods as StatefulSets: their pods restart Always; the
            // group's reaction to a restart is restartPolicy below.
            restart_policy: "Always",
        },
    );
    LeaderWorkerSet {
        api_version: LWS_API_VERSION,
        kind: "LeaderWorkerSet",
        metadata: ObjectMeta {
            name: Some(d.name.clone()),
            namespace: Some(d.namespace.clone()),
            labels: Some(labels),
            annotations: Some(
                [(
                    "commstack.dev/image-digest".to_string(),
                    shape.image.digest(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: LeaderWorkerSetSpec {
            replicas: d.replicas as i32,
            leader_worker_template: LeaderWorkerTemplate {
                leader_template: None,
                worker_template: template,
                size: d.nodes as i32,
                restart_policy: match d.restart_policy {
                    GroupRestart::RecreateGroupAfterStart => {
                        LwsRestartPolicy::RecreateGroupAfterStart
                    }
                    GroupRestart::RecreateGroupOnPodRestart => {
                        LwsRestartPolicy::RecreateGroupOnPodRestart
                    }
                    GroupRestart::None => LwsRestartPolicy::None,
                },
            },
            // One group at a time, never an extra one: a group holds whole nodes.
            rollout_strategy: RolloutStrategy {
                type_: RolloutStrategyType::RollingUpdate,
                rolling_update_configuration: RollingUpdateConfiguration {
                    max_unavailable: 1,
                    max_surge: 0,
                },
            },
            // The workers start with the leader, not after it is Ready: a server is Ready
            // only once every rank has joined, so LeaderReady would wait forever.
            startup_policy: StartupPolicy::LeaderCreated,
        },
    }
}
