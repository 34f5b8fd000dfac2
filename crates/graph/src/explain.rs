//! Why a step runs, in words (`--dry-run` and the run's first line of each step).

use crate::record::Change;
use crate::step::StepId;

/// `nvshmem, kernels`.
pub(crate) fn names<S: StepId>(steps: &[S]) -> String {
    steps
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a keyed step runs: the upstream steps that run, the inputs that changed.
pub(crate) fn explain<S: StepId>(
    changed: &[Change],
    upstream_runs: &[S],
    recorded: bool,
) -> String {
    let own: Vec<String> = changed
        .iter()
        .filter(|c| {
            !upstream_runs
                .iter()
                .any(|u| c.path == format!("after.{}", u.name()))
        })
        .map(Change::describe)
        .collect();
    let mut parts = Vec::new();
    if !upstream_runs.is_empty() {
        parts.push(format!("after {}", names(upstream_runs)));
    }
    if !own.is_empty() {
        parts.push(own.join("; "));
    }
    if parts.is_empty() {
        parts.push(match recorded {
            false => "not built yet".into(),
            true if changed.is_empty() => {
                "its output is not in the store (removed by `store gc`?)".into()
            }
            true => "after its inputs changed".into(),
        });
    }
    parts.join("; ")
}
