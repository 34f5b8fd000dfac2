//! `cargo xtask lock`: stack.toml -> stack.lock (+ requirements.lock).

use std::process::ExitCode;

use anyhow::Result;
use commstack_stack::Lock;

use commstack_steps::ctx::Ctx;
use commstack_steps::util;

/// Resolve the stack manifest into its lock: the target's Python closure (one wheel per
/// package, URL + sha256), torch's NCCL / NVSHMEM / CUDA pins, the NVSHMEM and DeepEP
/// sources, the toolchain wheels, and the compatibility rules it was checked against.
///
/// When the lock already matches the manifest and the rules, nothing is resolved and no
/// network is used. The lock keeps comments you add to it.
#[derive(clap::Args)]
pub struct Args {
    /// Only check, offline, that the lock and requirements file match the manifest and the
    /// rules; exit 1 with what differs if not.
    #[arg(long)]
    check: bool,
    /// With --check: also resolve the manifest again against the index (network) and
    /// compare every locked sha256 with what the index publishes now, and every source
    /// hash with the known table. Catches a lock whose hashes were edited consistently in
    /// stack.lock and requirements.lock, which the offline check cannot know.
    #[arg(long, requires = "check")]
    online: bool,
    /// Resolve again even when the lock is up to date (rewrites every hash from the index).
    #[arg(long, conflicts_with = "check")]
    force: bool,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let stack = util::read_stack(&ctx.stack_path)?;
    let lock_path = ctx.lock_path();
    // One answer to "is the lock current?" for `lock`, `lock --check` and `build`.
    let (previous, mut problems) = commstack_steps::flow::lock::lock_problems(ctx, &stack)?;

    if args.check {
        if args.online && problems.is_empty() {
            let lock = Lock::parse(&lock_path, previous.as_deref().unwrap_or_default())?;
            let text = previous.as_deref().unwrap_or_default();
            problems.extend(online_differences(ctx, &stack, &lock, text)?);
            if !problems.is_empty() {
                eprintln!("{} does not match the index:", lock_path.display());
                for p in problems {
                    eprintln!("  - {p}");
                }
                eprintln!(
                    "run `cargo xtask lock --force{}` to write what the index publishes, and review the diff",
                    ctx.stack_flag()
                );
                return Ok(ExitCode::FAILURE);
            }
        }
        if problems.is_empty() {
            println!(
                "{} matches {} and the rules{}",
                lock_path.display(),
                ctx.stack_path.display(),
                match args.online {
                    true => ", and every hash matches the index and the known sources",
                    false => "",
                }
            );
            return Ok(ExitCode::SUCCESS);
        }
        eprintln!("{} is out of date:", lock_path.display());
        for p in problems {
            eprintln!("  - {p}");
        }
        eprintln!("run `cargo xtask lock{}` to update it", ctx.stack_flag());
        return Ok(ExitCode::FAILURE);
    }

    if !args.force && problems.is_empty() {
        println!(
            "{} is up to date with {}: nothing to resolve",
            lock_path.display(),
            ctx.stack_path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }

    commstack_steps::flow::lock::resolve_and_write(ctx, &stack, previous.as_deref())?;
    Ok(ExitCode::SUCCESS)
}

/// Every locked artifact whose hash differs from a fresh resolution (the index's published
/// sha256, the known table's source hashes), or that one has and the other not.
fn online_differences(
    ctx: &Ctx,
    stack: &commstack_stack::Stack,
    lock: &Lock,
    lock_text: &str,
) -> Result<Vec<String>> {
    let quiet = ctx.quiet;
    let progress = move |m: &str| {
        if !quiet {
            eprintln!("  {m}");
        }
    };
    let cache = ctx.cache_dir().join("pypi-metadata");
    // The lock checked is the previous one: a mirror serving an older index is refused.
    let lock_path = ctx.lock_path();
    let previous = commstack_lock::PreviousLock {
        path: &lock_path,
        text: lock_text,
    };
    let fresh = util::runtime()?
        .block_on(commstack_lock::lock(
            stack,
            Some(cache),
            Some(previous),
            &progress,
        ))?
        .lock;
    let pins = |l: &Lock| -> Result<std::collections::BTreeMap<(String, String), String>> {
        Ok(commstack_steps::flow::lock::artifacts_of_lock(l)?
            .into_iter()
            .map(|a| {
                let pin = match &a.tree_sha256 {
                    Some(tree) => format!("{}, tree {tree}", a.pin()),
                    None => a.pin(),
                };
                ((a.name, a.filename), pin)
            })
            .collect())
    };
    let (ours, theirs) = (pins(lock)?, pins(&fresh)?);
    let name = ctx.lock_path().display().to_string();
    let mut out = Vec::new();
    for (key, pin) in &ours {
        match theirs.get(key) {
            Some(t) if t == pin => {}
            Some(t) => out.push(format!(
                "{} ({}): {name} pins {pin}, the index and known sources give {t}",
                key.0, key.1
            )),
            None => out.push(format!(
                "{} ({}): in {name}, not in a fresh resolution",
                key.0, key.1
            )),
        }
    }
    for key in theirs.keys().filter(|k| !ours.contains_key(*k)) {
        out.push(format!(
            "{} ({}): a fresh resolution has it, {name} does not",
            key.0, key.1
        ));
    }
    Ok(out)
}
