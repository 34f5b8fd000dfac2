//! The Kubernetes render: the gate (a JobSet) and the serving group (a LeaderWorkerSet),
//! each in a directory of its own with a kustomization.yaml listing it (so overlays can
//! patch either), and rollout.sh, which applies the gate, waits for its verdict, and only
//! then applies the serving group.

pub mod crd;
pub mod gate;
pub mod lws;
pub mod pod;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::rendered::Rendered;
use crate::shape::Shape;

/// The Kubernetes minor the core objects are typed for (k8s-openapi's feature) and CI
/// validates them against (kubernetes-validate).
pub const KUBERNETES_VERSION: &str = "1.33";

pub const GATE_FILE: &str = "gate/jobset.yaml";
pub const SERVE_FILE: &str = "serve/leaderworkerset.yaml";

/// YAML of one object, with a header naming what made it.
pub fn to_yaml(header: &str, object: &impl Serialize) -> Result<String> {
    let body = serde_norway::to_string(object).context("serialising a manifest")?;
    Ok(format!("{header}{body}"))
}

fn header(shape: &Shape, what: &str) -> String {
    format!(
        "# {what}\n# Rendered by `cargo xtask deploy render --target k8s` from {} ([deploy]) for\n# {}. Edit stack.toml and render again, or patch it with a kustomize overlay.\n",
        shape
            .stack
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        shape.image
    )
}

fn kustomization(resource: &str, what: &str) -> String {
    format!(
        "# {what}: `kubectl apply -k .` applies it; an overlay names this directory in its\n# `resources` and patches what it needs (tolerations, priority class, service account).\napiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {resource}\n"
    )
}

pub fn render(shape: &Shape) -> Result<Rendered> {
    let gate = gate::job_set(shape);
    let group = lws::leader_worker_set(shape);
    let gate_what = "The gate: the image's preflight on every node, then the self-test and DeepEP's tests across them; fails, never loops.";
    let serve_what = "The serving group: one pod per node holding all of its GPUs and ranks.";
    let files = vec![
        (
            GATE_FILE.to_string(),
            to_yaml(&header(shape, gate_what), &gate)?,
        ),
        (
            "gate/kustomization.yaml".into(),
            kustomization("jobset.yaml", "The gate (JobSet)"),
        ),
        (
            SERVE_FILE.to_string(),
            to_yaml(&header(shape, serve_what), &group)?,
        ),
        (
            "serve/kustomization.yaml".into(),
            kustomization(
                "leaderworkerset.yaml",
                "The serving group (LeaderWorkerSet)",
            ),
        ),
        ("rollout.sh".into(), rollout_script(shape)),
    ];
    Ok(Rendered { files })
}

/// Applies the gate, waits for its terminal state, and applies the serving group only
/// when it completed; on failure says how to collect and classify the gate's logs.
fn rollout_script(shape: &Shape) -> String {
    let d = shape.deploy;
    let gate = gate::gate_name(shape);
    let ns = &d.namespace;
    // The preflight, then the tests: each Job has the deadline; add a margin for pulls.
    let wait = 2 * d.gate_deadline_seconds + 600;
    format!(
        r#"#!/bin/sh
# Rendered by `cargo xtask deploy render --target k8s`: the gate, then the serving group.
# Needs kubectl with access to namespace {ns}, and the JobSet and LeaderWorkerSet
# controllers installed (docs/deploy.md).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# A finished JobSet is not run again by `apply`: start the gate afresh.
kubectl -n {ns} delete jobset {gate} --ignore-not-found --wait=true
kubectl apply -k "$here/gate"
echo "waiting for the gate jobset/{gate} (at most {wait} s)"
waited=0
while :; do
    state=$(kubectl -n {ns} get jobset {gate} -o jsonpath='{{.status.terminalState}}')
    case "$state" in
        Completed) break ;;
        Failed)
            echo "the gate failed: the serving group is not applied. Its logs:" >&2
            echo "  kubectl -n {ns} logs --prefix --all-containers -l {label}={gate} > gate.log" >&2
            echo "  cargo xtask logscan gate.log" >&2
            exit 1 ;;
    esac
    if [ "$waited" -ge {wait} ]; then
        echo "the gate did not finish in {wait} s: the serving group is not applied" >&2
        exit 1
    fi
    sleep 10
    waited=$((waited + 10))
done
echo "the gate passed: applying the serving group"
kubectl apply -k "$here/serve"
"#,
        label = crd::JOBSET_NAME_LABEL,
    )
}
