//! commstack-adopt: adopting an existing Python environment (an NGC container, a machine's own torch
//! environment): compare it with the lock and the rules ([`compare`]), plan the
//! installation of the stack's drop-in NVSHMEM and DeepEP ([`plan`]), apply it with a
//! backup and undo it exactly ([`apply`]), then prove the result with the verify crate's
//! runtime check ([`runtime_check`]).

mod apply;
mod compare;
mod plan;

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use commstack_elf::NvshmemVersion;
use commstack_stack::Lock;
use commstack_verify::Expectations;
use commstack_verify::runtime::{RuntimeFindings, check_runtime, run_probe};

pub use apply::{MANIFEST, Manifest, Moved, State, apply, env_dir, generations, undo};
pub use compare::{Comparison, Ours, Row, RuleLine, Severity, compare};
pub use plan::{INSTALLER, Plan, PlanStep, clean, plan, record_files, targets_of};

/// What the runtime check expects of an environment holding the stack: the lock's NCCL
/// pin and NVSHMEM version, our libnvshmem_host in site-packages/nvidia/nvshmem (where
/// the drop-in puts it), torch and deep_ep imported.
pub fn expectations(lock: &Lock, site_packages: &Path) -> Result<Expectations> {
    let mut e = Expectations::new();
    let nccl = &lock.resolved.nccl;
    e.nccl_version = Some(
        nccl.version
            .to_string()
            .parse()
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("the lock's NCCL pin {:?}", nccl.to_string()))?,
    );
    if !lock.resolved.nvshmem.is_empty() {
        e.nvshmem_version = Some(
            lock.resolved
                .nvshmem
                .parse::<NvshmemVersion>()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .with_context(|| {
                    format!("the lock's NVSHMEM version {:?}", lock.resolved.nvshmem)
                })?,
        );
    }
    e.nvshmem_prefix = Some(site_packages.join("nvidia/nvshmem"));
    Ok(e)
}

/// The verify crate's runtime level against `python`: `import torch, deep_ep`, then one
/// libnvshmem_host (ours, NCCL off) and one libnccl (the pinned version) must be mapped.
pub fn runtime_check(
    python: &Path,
    expect: &Expectations,
    timeout: Duration,
) -> Result<RuntimeFindings> {
    let probe = run_probe(python, &expect.import_modules, &[], timeout)?;
    Ok(check_runtime(&probe, expect))
}
