//! The gate before the rollout: a JobSet that runs the image's preflight on every node
//! (one pod per node, holding what the serving pod will hold), then, only if every one
//! passed, the self-test across all nodes and DeepEP's tests for this shape. It fails
//! instead of looping: no Job retries (backoffLimit 0), no JobSet restart (maxRestarts 0,
//! and a rule that fails the set on any Job failure), and a deadline on each Job. A gate in
//! an init container of the LeaderWorkerSet would put the group into a recreate loop
//! instead (LWS's design notes say so).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{JobSpec, JobTemplateSpec};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::k8s::crd::*;
use crate::k8s::pod::{self, PodParts, var};
use crate::shape::Shape;

pub const PREFLIGHT_JOB: &str = "preflight";
pub const TESTS_JOB: &str = "selftest";

pub fn gate_name(shape: &Shape) -> String {
    format!("{}-gate", shape.deploy.name)
}

/// The bootstrap of the test Job: an Indexed Job's pod knows its index from an
/// annotation; the leader is pod 0 of Job 0, by the host name JobSet gives it.
fn tests_env(shape: &Shape) -> Vec<EnvVar> {
    let name = gate_name(shape);
    let leader = format!("{name}-{TESTS_JOB}-0-0.{name}");
    let nodes = shape.deploy.nodes.to_string();
    let g = shape.deploy.gpus_per_node.to_string();
    let port = shape.deploy.master_port.to_string();
    let index = EnvVar {
        name: "NODE_RANK".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    .into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    vec![
        index,
        var("MASTER_ADDR", leader.clone()),
        var("MASTER_PORT", port.clone()),
        var("NNODES", nodes.clone()),
        var("NPROC_PER_NODE", g.clone()),
        var("WORLD_SIZE", nodes.clone()),
        var("RANK", "$(NODE_RANK)"),
        var("PET_NNODES", nodes),
        var("PET_NODE_RANK", "$(NODE_RANK)"),
        var("PET_NPROC_PER_NODE", g),
        var("PET_MASTER_ADDR", leader.clone()),
        var("PET_MASTER_PORT", port),
        var(
            "COMMSTACK_RDZV_ADDR",
            format!("{leader}:{}", shape.rdzv_port()),
        ),
    ]
}

fn job(
    shape: &Shape,
    rjob: &str,
    parallel: u32,
    command: Vec<String>,
    env: Vec<EnvVar>,
) -> JobTemplateSpec {
    let d = shape.deploy;
    let name = gate_name(shape);
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/name".to_string(), d.name.clone()),
        (
            "app.kubernetes.io/component".to_string(),
            format!("gate-{rjob}"),
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
            container: rjob.into(),
            command,
            env,
            labels,
            spread_by: [
                (JOBSET_NAME_LABEL.to_string(), name),
                (JOBSET_RJOB_LABEL.to_string(), rjob.to_string()),
            ]
            .into(),
            restart_policy: "Never",
        },
    );
    JobTemplateSpec {
        metadata: None,
        spec: Some(JobSpec {
            parallelism: Some(parallel as i32),
            completions: Some(parallel as i32),
            // Indexed: each pod knows its node rank, and JobSet names it by the index.
            completion_mode: Some("Indexed".into()),
            backoff_limit: Some(0),
            active_deadline_seconds: Some(d.gate_deadline_seconds.into()),
            template,
            ..JobSpec::default()
        }),
    }
}

pub fn job_set(shape: &Shape) -> JobSet {
    let d = shape.deploy;
    let name = gate_name(shape);
    let mut preflight_env = vec![
        var("NNODES", d.nodes.to_string()),
        var("NPROC_PER_NODE", d.gpus_per_node.to_string()),
    ];
    preflight_env.extend(shape.fixed_env().into_iter().map(|(k, v)| var(&k, v)));
    let mut env = tests_env(shape);
    env.extend(shape.fixed_env().into_iter().map(|(k, v)| var(&k, v)));
    let tests_command = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        shape.gate_tests_script(),
    ];
    JobSet {
        api_version: JOBSET_API_VERSION,
        kind: "JobSet",
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(d.namespace.clone()),
            labels: Some(
                [
                    ("app.kubernetes.io/name".to_string(), d.name.clone()),
                    (
                        "app.kubernetes.io/component".to_string(),
                        "gate".to_string(),
                    ),
                    (
                        "app.kubernetes.io/managed-by".to_string(),
                        "commstack".to_string(),
                    ),
                ]
                .into(),
            ),
            annotations: Some(
                [(
                    "commstack.dev/image-digest".to_string(),
                    shape.image.digest(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: JobSetSpec {
            replicated_jobs: vec![
                // One Job per node, each a single pod: the preflight sees the node's
                // GPUs, RDMA devices, limits and /dev/shm as the serving pod will.
                ReplicatedJob {
                    name: PREFLIGHT_JOB.into(),
                    replicas: d.nodes as i32,
                    template: job(shape, PREFLIGHT_JOB, 1, shape.preflight(), preflight_env),
                    depends_on: Vec::new(),
                },
                // Created only once every preflight Job completed.
                ReplicatedJob {
                    name: TESTS_JOB.into(),
                    replicas: 1,
                    template: job(shape, TESTS_JOB, d.nodes, tests_command, env),
                    depends_on: vec![DependsOn {
                        name: PREFLIGHT_JOB.into(),
                        status: DependsOnStatus::Complete,
                    }],
                },
            ],
            // Pods reach the test's leader by name before it is Ready.
            network: Network {
                enable_dns_hostnames: true,
                publish_not_ready_addresses: true,
            },
            success_policy: SuccessPolicy {
                operator: Operator::All,
            },
            failure_policy: FailurePolicy {
                max_restarts: 0,
                rules: vec![FailurePolicyRule {
                    name: "FailOnAnyJobFailure".into(),
                    action: FailurePolicyAction::FailJobSet,
                }],
            },
        },
    }
}
