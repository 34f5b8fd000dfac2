//! The one reader of the stack's lock, and the one mapping from the lock's model to the
//! artifacts the fetcher downloads.

use std::sync::Once;

use anyhow::{Context, Result};
use commstack_fetch::Artifact;
use commstack_stack::Lock;

use crate::ctx::Ctx;

/// The stack's lock, with an error that says how to make one. Every command reads it here.
/// A lock that no longer matches its manifest is still used, with a warning.
pub fn read_lock(ctx: &Ctx) -> Result<Lock> {
    let path = ctx.lock_path();
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read the lock {}: run `cargo xtask lock` first (or pass --stack FILE)",
            path.display()
        )
    })?;
    let lock = Lock::parse(&path, &text)?;
    warn_if_stale(ctx, &lock);
    Ok(lock)
}

/// Stale-lock warnings on stderr, once per process (one command reads the lock in several
/// steps). Refusing a stale lock is for a later issue.
fn warn_if_stale(ctx: &Ctx, lock: &Lock) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| match crate::util::read_stack(&ctx.stack_path) {
        Ok(stack) => {
            for why in lock.staleness(&stack) {
                eprintln!(
                    "warning: {} is stale: {why} (run `cargo xtask lock`)",
                    ctx.lock_path().display()
                );
            }
        }
        Err(err) => eprintln!(
            "warning: cannot check {} against its manifest: {err:#}",
            ctx.lock_path().display()
        ),
    });
}

/// A part of the lock, by the role its artifacts play.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Sources,
    Toolchain,
    Wheels,
    Replaced,
}

impl Part {
    fn of(role: commstack_stack::lock::Role) -> Part {
        use commstack_stack::lock::Role;
        match role {
            Role::Source => Part::Sources,
            Role::Toolchain => Part::Toolchain,
            Role::Package => Part::Wheels,
            Role::Replaced => Part::Replaced,
        }
    }
}

/// Every artifact of the stack's lock (sources, toolchain wheels, packages).
pub fn locked_artifacts(ctx: &Ctx) -> Result<Vec<Artifact>> {
    let lock = read_lock(ctx)?;
    artifacts_of_lock(&lock).with_context(|| format!("in {}", ctx.lock_path().display()))
}

/// The one mapping from the lock's model to what the fetcher needs.
pub fn artifacts_of_lock(lock: &commstack_stack::Lock) -> Result<Vec<Artifact>> {
    artifacts_of_parts(lock, &[])
}

/// The lock's artifacts of the given parts (all of them when `parts` is empty).
pub fn artifacts_of_parts(lock: &commstack_stack::Lock, parts: &[Part]) -> Result<Vec<Artifact>> {
    lock.artifacts()
        .into_iter()
        .filter(|a| parts.is_empty() || parts.contains(&Part::of(a.role)))
        .map(|a| {
            let artifact = Artifact {
                name: a.name,
                filename: a.filename,
                urls: vec![a.url],
                sha256: a.sha256,
                size: a.size,
                tree_sha256: a.tree,
            };
            // An unpinned entry is not an error here: the fetch reports it beside the others.
            artifact.validate().map_err(anyhow::Error::msg)?;
            Ok(artifact)
        })
        .collect()
}
