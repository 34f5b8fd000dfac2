//! `adopt --python PATH`: bring an existing Python environment (an NGC container, a
//! machine's own torch environment) onto the stack: compare it with the lock and the
//! rules, install the stack's drop-in NVSHMEM and DeepEP with a backup, prove the result
//! with the runtime check; undo restores the environment exactly.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use commstack_adopt::{self as adopt, Ours, Severity};
use commstack_deepep::LockedWheel;
use commstack_deepep::python::PythonEnv;
use commstack_deepep::wheelhouse::Wheelhouse;
use commstack_steps::ctx::Ctx;
use commstack_steps::flow::deepep::{AdoptPointer, POINTER_FILE};
use commstack_steps::flow::lock::read_lock;
use commstack_verify::Status;
use commstack_verify::runtime::RuntimeFindings;

/// Which of the stack's wheels to install (both when None).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// Only DeepEP: NVIDIA's NVSHMEM stays (the runtime check must then fail: the trap).
    Deepep,
    /// Only the drop-in NVSHMEM.
    Nvshmem,
}

/// What `adopt` is asked to do (the flags of the same names).
#[derive(Clone, Debug)]
pub struct AdoptRequest {
    pub python: PathBuf,
    pub dry_run: bool,
    pub undo: bool,
    pub check: bool,
    pub only: Option<Only>,
    pub wheelhouse: Option<PathBuf>,
    pub force: bool,
    pub no_verify: bool,
    /// How long the runtime check may take, in seconds.
    pub timeout: u64,
}

/// Compares, installs (with a backup) and proves, or undoes; the exit code says how it went.
pub fn adopt(ctx: &Ctx, args: &AdoptRequest) -> Result<ExitCode> {
    let env = PythonEnv::probe(&args.python)?;
    let root = adopt::env_dir(&ctx.home, &env);
    if args.undo {
        return undo(args, &root);
    }

    let stack = commstack_steps::util::read_stack(&ctx.stack_path)?;
    let lock = read_lock(ctx)?;
    let pointer = read_pointer(&root);
    let house = match (&args.wheelhouse, &pointer) {
        (Some(dir), _) => Some(Wheelhouse::open(dir)?),
        (None, Some(p)) => Some(Wheelhouse::open(&p.wheelhouse)?),
        (None, None) => None,
    };
    let dropin = house.as_ref().and_then(Wheelhouse::dropin);
    let deepep = house.as_ref().and_then(Wheelhouse::deepep);
    let nccl = house.as_ref().and_then(Wheelhouse::nccl_dropin);
    let ours = Ours {
        dropin: dropin.as_ref(),
        nccl: nccl.as_ref(),
        deepep: deepep.as_ref(),
        nvshmem_version: pointer.as_ref().and_then(|p| p.nvshmem_version.as_deref()),
        rdc_fix: pointer.as_ref().and_then(|p| p.rdc_fix),
    };
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    print!("{}", cmp.render());
    let dups = env.duplicates();
    if !dups.is_empty() {
        println!(
            "  note: installed more than once along sys.path (the first copy wins): {}",
            dups.join(", ")
        );
    }

    if args.check {
        return runtime(args, &env, &lock, &root);
    }
    let wanted: Vec<LockedWheel> = match args.only {
        // NCCL first: DeepEP V2 was built against it.
        None => [nccl.clone(), dropin.clone(), deepep.clone()]
            .into_iter()
            .flatten()
            .collect(),
        Some(Only::Deepep) => deepep.clone().into_iter().collect(),
        Some(Only::Nvshmem) => dropin.clone().into_iter().collect(),
    };
    let expected = match args.only {
        Some(_) => 1,
        None => 2 + usize::from(nccl.is_some()),
    };
    if wanted.len() < expected {
        let msg = format!(
            "no wheelhouse with the stack's wheels for this environment: run `cargo xtask build deepep --python {}` first (or pass --wheelhouse DIR)",
            args.python.display()
        );
        if args.dry_run {
            println!("{msg}");
            return Ok(if cmp.errors().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        bail!(msg);
    }
    let plan = adopt::plan(&env, &wanted)?;
    println!("plan:");
    // --dry-run names every path it would touch; a real run keeps to the summary.
    match args.dry_run {
        true => print!("{}", plan.render()),
        false => print!("{}", plan.render_summary()),
    }
    if args.dry_run {
        println!("(dry run: nothing changed)");
        return Ok(if cmp.errors().is_empty() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    if cmp.worst() == Severity::Error && !args.force {
        bail!(
            "the environment does not match the stack ({}): adopting would not make it work. Fix those, or pass --force",
            cmp.errors()
                .iter()
                .map(|r| r.what.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if plan.is_noop() {
        println!("already adopted: nothing to install");
    } else {
        let generation = adopt::apply(&plan, &env, &root)?;
        println!(
            "installed; backup in {} (undo with `cargo xtask adopt --python {} --undo`)",
            generation.display(),
            args.python.display()
        );
    }
    if args.no_verify {
        return Ok(ExitCode::SUCCESS);
    }
    let env = PythonEnv::probe(&args.python)?;
    runtime(args, &env, &lock, &root)
}

/// `--undo`: every backup generation back, newest first; then what is installed now.
fn undo(args: &AdoptRequest, root: &Path) -> Result<ExitCode> {
    let undone = adopt::undo(root)?;
    if undone.is_empty() {
        println!(
            "nothing to undo for {} ({})",
            args.python.display(),
            root.display()
        );
    }
    for g in &undone {
        println!("restored from {}", g.display());
    }
    let env = PythonEnv::probe(&args.python)?;
    for name in [
        "nvidia-nccl-cu13",
        "nvidia-nccl-cu12",
        "nvidia-nvshmem-cu13",
        "nvidia-nvshmem-cu12",
        "deep-ep",
    ] {
        if let Some(d) = env.dist(name) {
            println!("  now: {} {}", d.name, d.version);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn read_pointer(root: &Path) -> Option<AdoptPointer> {
    let text = std::fs::read_to_string(root.join(POINTER_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The verify crate's runtime check; the findings are also written beside the backups.
fn runtime(
    args: &AdoptRequest,
    env: &PythonEnv,
    lock: &commstack_stack::Lock,
    root: &Path,
) -> Result<ExitCode> {
    let expect = adopt::expectations(lock, env.site_packages())?;
    println!(
        "runtime check (import {}):",
        expect.import_modules.join(", ")
    );
    let findings = adopt::runtime_check(&args.python, &expect, Duration::from_secs(args.timeout))?;
    print_findings(&findings);
    std::fs::create_dir_all(root)?;
    let path = root.join(format!(
        "runtime-{}.json",
        jiff::Timestamp::now().as_second()
    ));
    std::fs::write(&path, serde_json::to_string_pretty(&findings)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("findings: {}", path.display());
    Ok(match findings.status() {
        Status::Passed => ExitCode::SUCCESS,
        Status::Failed => ExitCode::FAILURE,
        Status::NotRun => ExitCode::from(2),
    })
}

fn print_findings(f: &RuntimeFindings) {
    for c in &f.checks {
        let mark = match c.status {
            Status::Passed => "pass",
            Status::Failed => "FAIL",
            Status::NotRun => "not run",
        };
        println!(
            "  [{mark}] {}: {}",
            c.name,
            c.detail.lines().next().unwrap_or_default()
        );
        for more in c.detail.lines().skip(1) {
            println!("         {more}");
        }
        if c.status != Status::Passed
            && let Some(fix) = &c.fix
        {
            println!("         fix: {fix}");
        }
    }
    println!("  => {}", f.status());
}
