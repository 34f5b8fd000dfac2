#!/bin/sh
# Rendered by `cargo xtask deploy render --target k8s`: the gate, then the serving group.
# Needs kubectl with access to namespace inference, and the JobSet and LeaderWorkerSet
# controllers installed (docs/deploy.md).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
# A finished JobSet is not run again by `apply`: start the gate afresh.
kubectl -n inference delete jobset ep-single-gate --ignore-not-found --wait=true
kubectl apply -k "$here/gate"
echo "waiting for the gate jobset/ep-single-gate (at most 7800 s)"
waited=0
while :; do
    state=$(kubectl -n inference get jobset ep-single-gate -o jsonpath='{.status.terminalState}')
    case "$state" in
        Completed) break ;;
        Failed)
            echo "the gate failed: the serving group is not applied. Its logs:" >&2
            echo "  kubectl -n inference logs --prefix --all-containers -l jobset.sigs.k8s.io/jobset-name=ep-single-gate > gate.log" >&2
            echo "  cargo xtask logscan gate.log" >&2
            exit 1 ;;
    esac
    if [ "$waited" -ge 7800 ]; then
        echo "the gate did not finish in 7800 s: the serving group is not applied" >&2
        exit 1
    fi
    sleep 10
    waited=$((waited + 10))
done
echo "the gate passed: applying the serving group"
kubectl apply -k "$here/serve"
