//! The one reader of the stack's lock, and the one mapping from the lock's model to the
//! artifacts the fetcher downloads.

use anyhow::{Context, Result, bail};
use commstack_fetch::Artifact;
use commstack_stack::Lock;

use crate::ctx::Ctx;

/// The stack's lock, checked against its manifest first. Every command reads it here, and
/// none uses a stale one: a manifest asking for another torch beside an old lock would
/// otherwise build the old stack without a word.
pub fn read_lock(ctx: &Ctx) -> Result<Lock> {
    let path = ctx.lock_path();
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read the lock {}: run `cargo xtask lock{}` first",
            path.display(),
            ctx.stack_flag()
        )
    })?;
    let lock = Lock::parse(&path, &text)?;
    let stack = crate::util::read_stack(&ctx.stack_path)?;
    let stale = lock.staleness(&stack);
    if !stale.is_empty() {
        bail!(
            "{} is stale, it no longer matches {}:\n  {}\nrun `cargo xtask lock{}` to resolve it again",
            path.display(),
            ctx.stack_path.display(),
            stale.join("\n  "),
            ctx.stack_flag()
        );
    }
    Ok(lock)
}

/// A part of the lock, by the role its artifacts play.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Sources,
    Toolchain,
    Wheels,
    Replaced,
    /// The Debian packages of the image's base.
    Debs,
}

impl Part {
    fn of(role: commstack_stack::lock::Role) -> Part {
        use commstack_stack::lock::Role;
        match role {
            Role::Source => Part::Sources,
            Role::Toolchain => Part::Toolchain,
            Role::Package => Part::Wheels,
            Role::Replaced => Part::Replaced,
            Role::Deb => Part::Debs,
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
