//! `cargo xtask build deepep`: DeepEP from the locked revision, built against the stack's
//! NVSHMEM and torch into a wheel, then the wheelhouse images are made from.
//!
//! Two modes: managed (default: a build venv made from the lock's wheels in the fetch
//! cache) and adopt (`--python PATH`: an existing environment's torch). Every step is in
//! the store; a second run with the same inputs does nothing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_adopt::env_dir;
use commstack_deepep::build::{BuildRequest, PythonTarget, build};
use commstack_deepep::venv::{managed_venv, runtime_wheels};
use commstack_deepep::wheelhouse::{Wheelhouse, WheelhouseKind, assemble_wheelhouse};
use commstack_deepep::{LockedWheel, NvshmemInput, SourceInput};
use commstack_fetch::{Artifact, FetchOptions};
use commstack_nvshmem::{build_dropin_wheel, dropin_distribution};
use commstack_stack::{CudaArch, Lock};
use commstack_store::{Outcome, Store};
use serde::{Deserialize, Serialize};

use crate::ctx::Ctx;
use crate::flow::nccl::NcclMade;
use crate::flow::toolchain::resolve;
use crate::options::BuildOptions;
use crate::settings::Settings;

/// What `build deepep --python P` leaves for `adopt --python P`:
/// `<home>/adopt/<env-id>/build.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AdoptPointer {
    pub python: PathBuf,
    pub wheelhouse: PathBuf,
    pub build_step: PathBuf,
    pub nvshmem_version: Option<String>,
    pub rdc_fix: Option<bool>,
}

pub const POINTER_FILE: &str = "build.json";

pub fn run(ctx: &Ctx, args: &BuildOptions) -> Result<ExitCode> {
    build_deepep(ctx, args).map(|_| ExitCode::SUCCESS)
}

/// `build deepep`: DeepEP and the wheelhouse (and in adopt mode the pointer `adopt`
/// reads); returns the wheelhouse's step directory.
pub fn build_deepep(ctx: &Ctx, args: &BuildOptions) -> Result<PathBuf> {
    let started = Instant::now();
    let say = |line: &str| ctx.say(line);
    let settings = Settings::resolve(ctx, args)?;
    settings.print_notes();
    settings.check_deepep_needs()?;
    let made = deepep_step(ctx, &settings, args, &say, &|l: &str| crate::out!("{l}"))?;
    let house = wheelhouse_step(
        ctx,
        made.kind,
        &made.runtime,
        &made.dropin,
        &made.wheel,
        args.force,
        &|l: &str| crate::out!("{l}"),
    )?;
    if let Some(p) = &args.deepep.python {
        let dir = env_dir(&ctx.home, &made.python.env);
        std::fs::create_dir_all(&dir)?;
        let pointer = AdoptPointer {
            python: p.clone(),
            wheelhouse: house.dir.clone(),
            build_step: made.step_dir.clone(),
            nvshmem_version: made.nvshmem_version.clone(),
            rdc_fix: made.rdc_fix,
        };
        commstack_store::write_all_atomically(&[(
            &dir.join(POINTER_FILE),
            &serde_json::to_string_pretty(&pointer)?,
        )])?;
        crate::out!(
            "next: cargo xtask adopt --python {} (installs the drop-in NVSHMEM and DeepEP, with a backup)",
            p.display()
        );
    }
    say(&format!("done in {:.2} s", started.elapsed().as_secs_f64()));
    Ok(house.dir)
}

/// What [`deepep_step`] made: DeepEP's wheel, and what the wheelhouse is made of.
pub struct DeepepMade {
    pub wheel: LockedWheel,
    pub dropin: LockedWheel,
    pub runtime: Vec<LockedWheel>,
    pub kind: WheelhouseKind,
    pub python: PythonTarget,
    /// DeepEP's build step in the store.
    pub step_dir: PathBuf,
    /// Whether that build ran now (not found in the store).
    pub built_now: bool,
    pub nvshmem_version: Option<String>,
    pub rdc_fix: Option<bool>,
}

/// DeepEP built (or found) in the store against the stack's NVSHMEM, in the managed
/// build venv (or, with `--python`, an existing environment).
pub fn deepep_step(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
    say: &dyn Fn(&str),
    result: &dyn Fn(&str),
) -> Result<DeepepMade> {
    let d = &args.deepep;
    let (stack, lock) = (&settings.stack, &settings.lock);
    let archs = &settings.cuda_archs;
    let store = Store::open(ctx.store_dir())?;
    let tc = resolve(ctx, &args.toolchain, false, say)?;
    say(&format!("toolchain: {}", tc.describe()));

    let nvshmem = nvshmem_input(&store, d.nvshmem.as_deref(), lock, archs)?;
    say(&format!(
        "nvshmem: {} (NVSHMEM {}, {})",
        nvshmem.prefix.display(),
        nvshmem.version().unwrap_or_else(|| "?".into()),
        nvshmem.identity
    ));
    let dropin = dropin_wheel(&store, &nvshmem, d.nvshmem_wheel.as_deref(), settings)?;
    say(&format!("drop-in: {}", dropin.path.display()));

    let (python, runtime, kind, nccl) = python_target(ctx, settings, args, &tc, &dropin, say)?;
    say(&format!(
        "python: {} ({} mode; Python {}, torch {}, CUDA {})",
        python.env.python.display(),
        python.mode,
        python.env.version,
        python.env.torch_version().unwrap_or("absent"),
        python.env.torch_cuda().unwrap_or("none")
    ));

    let source = deepep_source(ctx, lock, args.source.as_deref())?;
    if !source.is_locked() {
        crate::util::warn_once(say, &format!("WARNING deepep: {}", source.provenance));
    }
    let req = BuildRequest {
        api: stack.deepep.api,
        source: &source,
        nvshmem: &nvshmem,
        python: &python,
        toolchain: &tc,
        cuda_archs: archs,
        jobs: settings.jobs,
        allow_missing_rdc_fix: settings.allow_missing_rdc_fix,
        nccl_override: d.nccl_dir.as_deref(),
        allow_second_nccl: settings.allow_second_nccl,
        nccl_dropin: nccl.as_ref().map(|n| n.prefix.as_path()),
        rdma_core: args.rdma_core.as_deref(),
        source_date_epoch: source_date_epoch(lock),
        home: Some(&ctx.home),
        progress: say,
    };
    let built = build(&store, &req, args.force)?;
    match &built.outcome {
        Outcome::Cached { path } => result(&format!(
            "deepep: already built with these inputs, nothing to do: {}",
            path.display()
        )),
        Outcome::Built { path, seconds } => result(&format!(
            "deepep: built in {seconds:.1} s: {}",
            path.display()
        )),
    }
    let r = &built.report;
    result(&format!(
        "wheel: {} (needs {}; TORCH_CUDA_ARCH_LIST={}, RDC fix {}, NVSHMEM {} NCCL={})",
        built.wheel.display(),
        r.wheel.needed.join(", "),
        r.torch_cuda_arch_list,
        match r.rdc_fix {
            Some(true) => "present",
            Some(false) => "ABSENT (allowed)",
            None => "n/a",
        },
        r.nvshmem.version.as_deref().unwrap_or("?"),
        match r.nvshmem.use_nccl {
            Some(false) => "OFF",
            _ => "?",
        }
    ));
    Ok(DeepepMade {
        wheel: LockedWheel {
            name: commstack_wheel::normalize_name(&r.wheel.name),
            version: r.wheel.version.clone(),
            filename: r.wheel.filename.clone(),
            sha256: r.wheel.sha256.clone(),
            path: built.wheel.clone(),
        },
        dropin,
        runtime,
        kind,
        python,
        step_dir: built.outcome.path().to_path_buf(),
        built_now: !built.outcome.was_cached(),
        nvshmem_version: r.nvshmem.version.clone(),
        rdc_fix: r.rdc_fix,
    })
}

/// Where DeepEP is built and what its wheelhouse holds: the environment to adopt and an
/// overlay (the drop-in, and with `[nccl] from-source` the NCCL drop-in built here), or
/// the managed build venv and every runtime wheel.
fn python_target(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
    tc: &commstack_toolchain::Toolchain,
    dropin: &LockedWheel,
    say: &dyn Fn(&str),
) -> Result<(
    PythonTarget,
    Vec<LockedWheel>,
    WheelhouseKind,
    Option<NcclMade>,
)> {
    let lock = &settings.lock;
    let store = Store::open(ctx.store_dir())?;
    let d = &args.deepep;
    // Adopt mode with [nccl] from-source: the NCCL drop-in joins the overlay.
    let nccl = match &d.python {
        Some(_) => crate::flow::nccl::nccl_dropin_step(ctx, settings, args, tc, say)?,
        None => None,
    };
    let (python, runtime, kind) = match &d.python {
        Some(p) => {
            let target = PythonTarget::adopted(p)?;
            let mut overlay = vec![dropin.clone()];
            overlay.extend(nccl.as_ref().map(|n| n.wheel.clone()));
            (target, overlay, WheelhouseKind::Overlay)
        }
        None => {
            let cache = commstack_fetch::Cache::new(ctx.cache_dir());
            let wheels = runtime_wheels(lock, &cache, std::slice::from_ref(dropin))?;
            let base = base_python(lock, d.base_python.as_deref())?;
            let minor = python_minor(&lock.resolved.python_tag)?;
            let venv = managed_venv(&store, &base, &minor, &wheels, false)?;
            report_step(say, "build venv", &venv.outcome);
            (PythonTarget::managed(&venv)?, wheels, WheelhouseKind::Full)
        }
    };
    Ok((python, runtime, kind, nccl))
}

/// The wheelhouse of what [`deepep_step`] made (the runtime wheels, the drop-in, DeepEP).
pub fn wheelhouse_step(
    ctx: &Ctx,
    kind: WheelhouseKind,
    runtime: &[LockedWheel],
    dropin: &LockedWheel,
    deepep: &LockedWheel,
    force: bool,
    result: &dyn Fn(&str),
) -> Result<Wheelhouse> {
    let store = Store::open(ctx.store_dir())?;
    let house = assemble_wheelhouse(&store, kind, runtime, dropin, deepep, force)?;
    result(&format!(
        "wheelhouse{}: {} ({} wheels; {})",
        if house.outcome.was_cached() {
            " (cached)"
        } else {
            ""
        },
        house.dir.display(),
        house.manifest.wheels.len(),
        house.manifest.install
    ));
    Ok(house)
}

/// The interpreter the managed build venv is made from: `--base-python`, else
/// python3.X on PATH for the lock's target.
pub fn base_python(lock: &Lock, explicit: Option<&Path>) -> Result<PathBuf> {
    let minor = python_minor(&lock.resolved.python_tag)?;
    match explicit {
        Some(p) => Ok(p.to_path_buf()),
        None => commstack_toolchain::find_in_path(&format!("python{minor}"), None).with_context(|| {
            format!("no python{minor} on PATH: the lock targets Python {minor}; install it (Debian 12: apt-get install python3), or build DeepEP alone with `cargo xtask build deepep --base-python PATH` (or --python PATH to adopt an existing environment)")
        }),
    }
}

fn report_step(say: &dyn Fn(&str), what: &str, outcome: &Outcome) {
    match outcome {
        Outcome::Cached { path } => say(&format!("{what}: in the store ({})", path.display())),
        Outcome::Built { path, seconds } => say(&format!(
            "{what}: made in {seconds:.1} s ({})",
            path.display()
        )),
    }
}

/// `cp312` -> `3.12`.
fn python_minor(tag: &str) -> Result<String> {
    let digits = tag
        .strip_prefix("cp")
        .filter(|d| d.len() >= 2 && d.chars().all(|c| c.is_ascii_digit()));
    let d = digits.with_context(|| format!("the lock's python tag {tag:?} is not like cp312"))?;
    Ok(format!("{}.{}", &d[..1], &d[1..]))
}

/// `--nvshmem DIR`, else the store's NVSHMEM build of the lock's version for `archs`.
fn nvshmem_input(
    store: &Store,
    explicit: Option<&Path>,
    lock: &Lock,
    archs: &[CudaArch],
) -> Result<NvshmemInput> {
    let input = match explicit {
        Some(p) => NvshmemInput::open(p)?,
        None => {
            let found =
                commstack_deepep::nvshmem::find_in_store(store, &lock.resolved.nvshmem, archs)?;
            let Some(newest) = found.first() else {
                bail!(
                    "the store {} has no NVSHMEM {} build for CUDA archs {}: run `cargo xtask build nvshmem` first, or pass --nvshmem DIR",
                    store.root().display(),
                    lock.resolved.nvshmem,
                    archs
                        .iter()
                        .map(CudaArch::cmake)
                        .collect::<Vec<_>>()
                        .join(",")
                );
            };
            if found.len() > 1 {
                eprintln!(
                    "note: {} NVSHMEM {} builds in the store; using the newest, {} (pass --nvshmem to choose)",
                    found.len(),
                    lock.resolved.nvshmem,
                    newest.display()
                );
            }
            NvshmemInput::open(newest)?
        }
    };
    if let Some(built) = &input.built
        && built.report.options.cuda_archs != archs
    {
        bail!(
            "the NVSHMEM build {} has device code for {:?}, DeepEP is asked for {:?}: libnvshmem_device.a must hold the archs DeepEP compiles for",
            built.prefix.display(),
            built.report.options.cuda_archs,
            archs
        );
    }
    Ok(input)
}

/// The drop-in wheel: `--nvshmem-wheel`, else made (or found) from the NVSHMEM build step.
fn dropin_wheel(
    store: &Store,
    nvshmem: &NvshmemInput,
    explicit: Option<&Path>,
    settings: &Settings,
) -> Result<LockedWheel> {
    let stack = &settings.stack;
    let pin = settings
        .torch_pin
        .clone()
        .context("the lock pins no NVSHMEM wheel for torch (\"\")")?;
    let distribution = dropin_distribution(stack.torch.cuda_major as u32);
    let wheel = match explicit {
        Some(p) => LockedWheel::from_file(p)?,
        None => {
            let built = nvshmem.built.as_ref().with_context(|| {
                format!(
                    "{} is an install prefix, not an NVSHMEM build step: pass the drop-in wheel with --nvshmem-wheel, or the step with --nvshmem",
                    nvshmem.prefix.display()
                )
            })?;
            let spec = settings.dropin_spec(pin.clone());
            let (dropin, _) = build_dropin_wheel(store, built, &spec, false)?;
            LockedWheel {
                name: commstack_wheel::normalize_name(&dropin.distribution),
                version: dropin.version.clone(),
                filename: dropin.filename.clone(),
                sha256: dropin.sha256.clone(),
                path: dropin.wheel.clone(),
            }
        }
    };
    // The drop-in carries torch's pinned version (PEP 440: `3.4.5+commstack.g...` is
    // `3.4.5`), compared as the lock's rule compares them.
    let public: Option<pep440_rs::Version> =
        wheel.version.split('+').next().and_then(|v| v.parse().ok());
    let pinned = pin
        .parse()
        .map(|v| commstack_stack::Pin::new(distribution.clone(), v));
    let same_version = match (&public, &pinned) {
        (Some(v), Ok(p)) => commstack_stack::rules::nvshmem_matches_torch_pin(v, p).is_ok(),
        _ => false,
    };
    if wheel.name != distribution || !same_version || !wheel.version.contains("+commstack.") {
        bail!(
            "{} is {} {}, not the stack's drop-in {distribution}=={pin}+commstack.*",
            wheel.path.display(),
            wheel.name,
            wheel.version
        );
    }
    Ok(wheel)
}

/// `--source PATH` (hashed, compared with the lock), else the lock's archive from the
/// fetch cache (verified by its hashes when it was fetched, held to its recorded sha256
/// since, and by its tree again as it is unpacked: `SourceInput::materialize`), with the
/// locked submodules (`deepep:<path>`), each from the cache the same way. A `--source`
/// is taken as it is, submodules and all.
pub fn deepep_source(ctx: &Ctx, lock: &Lock, explicit: Option<&Path>) -> Result<SourceInput> {
    let locked = lock
        .sources
        .iter()
        .find(|s| s.name == "deepep")
        .with_context(|| {
            format!(
                "{} has no deepep source: run `cargo xtask lock`",
                ctx.lock_path().display()
            )
        })?;
    let rev = locked
        .rev
        .clone()
        .unwrap_or_else(|| lock.resolved.deepep_rev.clone());
    if let Some(p) = explicit {
        return SourceInput::from_path(p, locked.tree.as_deref(), &rev);
    }
    let (path, sha256, tree) = cached_source(ctx, locked)?;
    let mut submodules = Vec::new();
    for sub in lock
        .sources
        .iter()
        .filter(|s| s.name.starts_with("deepep:"))
    {
        let (archive, sha256, tree) = cached_source(ctx, sub)?;
        submodules.push(commstack_deepep::SubmoduleInput {
            path: sub.path.clone().with_context(|| {
                format!(
                    "{}: source {} has no path",
                    ctx.lock_path().display(),
                    sub.name
                )
            })?,
            archive,
            tree_sha256: tree,
            rev: sub.rev.clone().unwrap_or_default(),
            sha256,
        });
    }
    Ok(SourceInput {
        sha256,
        path,
        tree_sha256: tree,
        rev,
        provenance: "locked".into(),
        submodules,
    })
}

/// A locked source archive from the fetch cache, offline, held to the lock's hashes:
/// (its path, the sha256 of its bytes, its tree hash).
fn cached_source(
    ctx: &Ctx,
    locked: &commstack_stack::lock::Source,
) -> Result<(PathBuf, Option<String>, String)> {
    let tree = locked
        .tree
        .clone()
        .with_context(|| format!("the lock pins the {} source by no tree hash", locked.name))?;
    let artifact = Artifact {
        name: locked.name.clone(),
        filename: locked.filename.clone(),
        urls: vec![locked.url.clone()],
        sha256: locked.sha256.clone(),
        size: None,
        tree_sha256: Some(tree.clone()),
    };
    artifact.validate().map_err(anyhow::Error::msg)?;
    let mut options = FetchOptions::new(ctx.cache_dir());
    options.offline = true;
    options.progress = false;
    let fetched = commstack_fetch::fetch_all(&[artifact], &options).with_context(|| {
        format!(
            "the source {} ({}) is not in the download cache: run `cargo xtask fetch --only sources` (or pass --source DIR|ARCHIVE)",
            locked.name, locked.filename
        )
    })?;
    let f = fetched
        .into_iter()
        .next()
        .context("fetch returned nothing")?;
    Ok((f.path.clone(), f.sha256().map(str::to_string), tree))
}

/// The wheel's times: the lock's epoch where it has one (a stack with [base]), else a
/// fixed default. Part of the graph's DeepEP key too, so a relock that moves only the
/// epoch rebuilds the wheel.
pub(crate) fn source_date_epoch(lock: &commstack_stack::Lock) -> u64 {
    lock.base.as_ref().map_or(
        commstack_deepep::reproducible::DEFAULT_SOURCE_DATE_EPOCH,
        |b| b.epoch,
    )
}
