//! The one reader of the stack's lock, and the one mapping from the lock's model to the
//! artifacts the fetcher downloads.

use anyhow::{Context, Result, bail};
use commstack_fetch::Artifact;
use commstack_stack::Lock;

use crate::ctx::Ctx;
use crate::options::Part;

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

/// The part of the lock an artifact of `role` belongs to.
fn part_of(role: commstack_stack::lock::Role) -> Part {
    use commstack_stack::lock::Role;
    match role {
        Role::Source => Part::Sources,
        Role::Toolchain => Part::Toolchain,
        Role::Package => Part::Wheels,
        Role::Replaced => Part::Replaced,
        Role::Deb => Part::Debs,
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
        .filter(|a| parts.is_empty() || parts.contains(&part_of(a.role)))
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

/// `lock`'s fetcher: the sources neither the known table nor the previous lock has
/// hashes for, through commstack-fetch with the command's mirrors and
/// `--accept-tree-match` (docs/sources.md).
struct LockFetcher {
    options: commstack_fetch::FetchOptions,
}

impl commstack_lock::SourceFetcher for LockFetcher {
    fn fetch<'a>(
        &'a self,
        requests: &'a [commstack_lock::SourceRequest],
    ) -> commstack_lock::SeenFuture<'a> {
        Box::pin(async move {
            let artifacts: Vec<Artifact> = requests
                .iter()
                .map(|r| {
                    let a = Artifact {
                        name: r.name.clone(),
                        filename: r.filename.clone(),
                        urls: vec![r.url.clone()],
                        sha256: r.sha256.clone(),
                        size: None,
                        tree_sha256: r.tree.clone(),
                    };
                    a.validate().map_err(anyhow::Error::msg)?;
                    Ok(a)
                })
                .collect::<Result<_>>()?;
            let seen = commstack_fetch::fetch_for_lock(&artifacts, &self.options)
                .await
                .context("fetching the sources the lock has no hashes for")?;
            Ok(seen
                .into_iter()
                .map(|s| commstack_lock::SourceSeen {
                    sha256: s.sha256,
                    tree: s.tree_sha256,
                    from: s.from,
                    gitmodules: s.gitmodules,
                })
                .collect())
        })
    }
}

/// Resolves the manifest into its lock against the index and writes stack.lock and its
/// requirements file (together, atomically); `previous` is the old lock's text, whose
/// comments are kept; `fetch` says where the sources it has not seen come from. Prints
/// what was locked, and always the sources trusted on first use.
pub fn resolve_and_write(
    ctx: &Ctx,
    stack: &commstack_stack::Stack,
    previous: Option<&str>,
    fetch: &crate::options::SourceFetch,
) -> Result<Lock> {
    let lock_path = ctx.lock_path();
    let req_path = requirements_path(ctx);
    let quiet = ctx.quiet;
    let progress = move |m: &str| {
        if !quiet {
            eprintln!("  {m}");
        }
    };
    let cache = ctx.cache_dir().join("pypi-metadata");
    // The lock being replaced: the base's index must not be older than the one it records.
    let replaced = previous.map(|text| commstack_lock::PreviousLock {
        path: &lock_path,
        text,
    });
    let fetcher = LockFetcher {
        options: crate::flow::fetch_options::base_options(
            ctx,
            &fetch.mirror,
            fetch.offline,
            fetch.accept_tree_match,
        )?,
    };
    let locked = crate::util::runtime()?.block_on(commstack_lock::lock_with(
        stack,
        Some(cache),
        replaced,
        &progress,
        &fetcher,
    ))?;
    for warning in &locked.warnings {
        eprintln!("{}", commstack_digest::terminal_safe_capped(warning, 4096));
    }
    let lock = locked.lock;
    let text = lock.render(previous);
    commstack_store::write_all_atomically(&[
        (&lock_path, &text),
        (&req_path, &lock.requirements_txt()),
    ])?;

    let r = &lock.resolved;
    crate::out!(
        "locked {} in {:.1} s ({} requests): {} packages for {} {}, {} toolchain wheels, {} sources",
        ctx.stack_path.display(),
        locked.seconds,
        locked.requests,
        lock.packages.len(),
        r.python_tag,
        r.platform,
        lock.toolchain.len(),
        lock.sources.len()
    );
    crate::out!("  torch {}  CUDA {}  {}", r.torch, r.cuda, r.nccl);
    if let Some(o) = &r.nccl_override {
        crate::out!(
            "  NCCL {} in place of torch's pin {}: {}",
            r.nccl,
            o.torch_pin,
            o.reason
        );
    }
    crate::out!(
        "  NVSHMEM {} from source (replaces {}), DeepEP {} ({})",
        r.nvshmem,
        r.nvshmem_pin
            .as_ref()
            .map_or("nothing".to_string(), |p| p.to_string()),
        &r.deepep_rev[..r.deepep_rev.len().min(12)],
        r.deepep_api.as_str()
    );
    for s in &lock.sources {
        crate::out!("  source {} ({}): {}", s.name, s.filename, s.origin);
    }
    if let Some(base) = &lock.base {
        crate::out!(
            "  base: {} Debian packages of {} {} {} (index of {}, epoch {})",
            lock.debs.len(),
            base.distribution,
            base.suite,
            base.architecture,
            base.release_date,
            base.epoch
        );
    }
    crate::out!("  wrote {} and {}", lock_path.display(), req_path.display());
    Ok(lock)
}

/// `stack.toml` -> `requirements.lock`; `stacks/x.toml` -> `stacks/x.requirements.lock`.
pub fn requirements_path(ctx: &Ctx) -> std::path::PathBuf {
    let stem = ctx
        .stack_path
        .file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .to_string();
    let name = if stem == "stack" {
        "requirements.lock".to_string()
    } else {
        format!("{stem}.requirements.lock")
    };
    ctx.stack_path.with_file_name(name)
}

/// What is wrong with the stack's lock files: (the lock's text if any, the problems).
/// No problems: stack.lock parses, matches the manifest and the rules, and the
/// requirements file matches it.
pub fn lock_problems(
    ctx: &Ctx,
    stack: &commstack_stack::Stack,
) -> Result<(Option<String>, Vec<String>)> {
    let path = ctx.lock_path();
    let previous = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let problems = match previous.as_deref().map(|t| Lock::parse(&path, t)) {
        None => vec![format!("{} does not exist", path.display())],
        Some(Err(d)) => vec![d.to_string()],
        Some(Ok(lock)) => {
            let mut problems = lock.staleness(stack);
            let req_path = requirements_path(ctx);
            let reqs = std::fs::read_to_string(&req_path).unwrap_or_default();
            if reqs != lock.requirements_txt() {
                problems.push(format!(
                    "{} does not match {}",
                    req_path.display(),
                    path.display()
                ));
            }
            problems
        }
    };
    Ok((previous, problems))
}
