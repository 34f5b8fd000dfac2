//! LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, LWS v0.10) and JobSet
//! (jobset.x-k8s.io/v1alpha2, JobSet v0.12) as typed structs, written from their CRDs'
//! openAPIV3Schema (pinned in crates/deploy/schemas/): the fields deploy sets, with the
//! names and enumerations of the schema. Pod and Job templates are k8s-openapi's types.

use k8s_openapi::api::batch::v1::JobTemplateSpec;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// The pinned schemas, relative to the crate (what CI validates against).
pub const LWS_CRD: &str = "schemas/leaderworkerset.x-k8s.io_leaderworkersets.v0.10.0.yaml";
pub const JOBSET_CRD: &str = "schemas/jobset.x-k8s.io_jobsets.v0.12.0.yaml";

pub const LWS_API_VERSION: &str = "leaderworkerset.x-k8s.io/v1";
pub const JOBSET_API_VERSION: &str = "jobset.x-k8s.io/v1alpha2";

/// The label LWS puts on every pod of a set (`leaderworkerset.sigs.k8s.io/name`).
pub const LWS_NAME_LABEL: &str = "leaderworkerset.sigs.k8s.io/name";
/// The labels JobSet puts on every pod of a set and of one replicated job.
pub const JOBSET_NAME_LABEL: &str = "jobset.sigs.k8s.io/jobset-name";
pub const JOBSET_RJOB_LABEL: &str = "jobset.sigs.k8s.io/replicatedjob-name";

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSet {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: LeaderWorkerSetSpec,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetSpec {
    /// Groups (minimum 0).
    pub replicas: i32,
    pub leader_worker_template: LeaderWorkerTemplate,
    pub rollout_strategy: RolloutStrategy,
    pub startup_policy: StartupPolicy,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerTemplate {
    /// The leader's template when it differs from the workers' (absent: the workers').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader_template: Option<PodTemplateSpec>,
    pub worker_template: PodTemplateSpec,
    /// Pods per group, the leader included.
    pub size: i32,
    pub restart_policy: LwsRestartPolicy,
}

/// `restartPolicy`'s enumeration (`Default` is deprecated and left out).
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LwsRestartPolicy {
    RecreateGroupOnPodRestart,
    RecreateGroupAfterStart,
    None,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupPolicy {
    LeaderCreated,
    LeaderReady,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    #[serde(rename = "type")]
    pub type_: RolloutStrategyType,
    pub rolling_update_configuration: RollingUpdateConfiguration,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutStrategyType {
    RollingUpdate,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdateConfiguration {
    /// Groups that may be down during an update (an int-or-string in the schema).
    pub max_unavailable: i32,
    /// Extra groups created during an update.
    pub max_surge: i32,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct JobSet {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: ObjectMeta,
    pub spec: JobSetSpec,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    pub replicated_jobs: Vec<ReplicatedJob>,
    pub network: Network,
    pub success_policy: SuccessPolicy,
    pub failure_policy: FailurePolicy,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    pub name: String,
    /// Jobs made from the template.
    pub replicas: i32,
    pub template: JobTemplateSpec,
    /// The replicated jobs this one waits for (the schema allows one entry).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<DependsOn>,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct DependsOn {
    pub name: String,
    pub status: DependsOnStatus,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependsOnStatus {
    Ready,
    Complete,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    #[serde(rename = "enableDNSHostnames")]
    pub enable_dns_hostnames: bool,
    pub publish_not_ready_addresses: bool,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct SuccessPolicy {
    pub operator: Operator,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    All,
    Any,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicy {
    pub max_restarts: i32,
    pub rules: Vec<FailurePolicyRule>,
}

#[derive(Serialize, Debug, Clone)]
#[serde(rename_all = "camelCase")]
pub struct FailurePolicyRule {
    /// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`.
    pub name: String,
    pub action: FailurePolicyAction,
}

#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicyAction {
    FailJobSet,
    RestartJobSet,
}
