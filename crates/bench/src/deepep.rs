//! `bench deepep`: DeepEP's build through commstack against DeepEP's own documented
//! `python setup.py build`, on the same machine with the same inputs (target: at most
//! 1.0x).
//!
//! The graph is built up to the DeepEP step first (its inputs: the build venv, NVSHMEM,
//! the toolchain, the locked source). Then, `trials` times, interleaved (the order
//! alternates, so a slow minute of a shared machine falls on both ways):
//! - **commstack**: the DeepEP store step forced (`build deepep --force`, that step only:
//!   the venv, NVSHMEM and the drop-in are found in the store), timed whole: the source
//!   placed, the views, `setup.py bdist_wheel`, the canonical wheel, its checks.
//! - **setup.py**: a fresh copy of the same source, `python setup.py build` with the
//!   environment the step's build report recorded (the same venv python, CUDA_HOME, nvcc,
//!   CC/CXX, NVSHMEM_DIR, NCCL_DIR, TORCH_CUDA_ARCH_LIST, MAX_JOBS, CPATH, LIBRARY_PATH),
//!   each path seen through the step's fixed build directory mapped back to where it
//!   really is, less what only commstack adds (the reproducibility flags: prefix maps,
//!   nvcc's -objtemp, the rpath-rewriting linker, SOURCE_DATE_EPOCH).
//!
//! Each trial prints both times, the span of ninja's compile jobs in each (from the ninja
//! logs), and commstack's time outside setup.py: where the difference goes.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use commstack_deepep::BuildReport;
use commstack_deepep::reproducible::Relocated;
use commstack_steps::ctx::Ctx;
use commstack_steps::graph::StepId;
use commstack_steps::options::{BuildOptions, GraphOptions, SourceFetch};
use commstack_steps::settings::Settings;

use crate::stats::median;

/// What `bench deepep` is asked for.
pub struct Request {
    /// Trials, each both ways (at least 1).
    pub trials: usize,
    /// Where the locked sources come from, for the graph built first.
    pub fetch: SourceFetch,
    /// MAX_JOBS for both ways (None: the CPU count, as `build` uses).
    pub jobs: Option<usize>,
}

/// One way, timed.
struct Timed {
    seconds: f64,
    /// CPU seconds (user + system) of the build: its processes and, for commstack's
    /// in-process step, the bench's own. Other work on a shared machine moves the wall
    /// time, much less this.
    cpu_seconds: f64,
    /// From ninja's first compile job's start to its last job's end.
    ninja_seconds: Option<f64>,
    /// commstack only: setup.py bdist_wheel's own time (the rest is the step's).
    setup_py_seconds: Option<f64>,
    /// commstack only: the step's phases (the build report's), for where the time went.
    phases: Vec<(String, f64)>,
}

/// Builds the graph up to DeepEP, then times both ways `req.trials` times and prints a
/// table for docs/benchmarks.md; exit status 1 when the median ratio is over 1.0x.
pub fn bench_deepep(ctx: &Ctx, req: &Request) -> Result<ExitCode> {
    let args = BuildOptions {
        fetch: req.fetch.clone(),
        jobs: req.jobs,
        ..Default::default()
    };
    let graph = GraphOptions {
        locked: true,
        until: Some(StepId::Deepep),
        ..Default::default()
    };
    let made = commstack_pipeline::command::build(ctx, &graph, &args)?;
    if made.exit != ExitCode::SUCCESS {
        bail!(
            "the build up to deepep failed: see {}",
            made.summary_file.display()
        );
    }
    let output = |step: StepId| {
        made.rows
            .iter()
            .find(|r| r.step == step)
            .and_then(|r| r.output.clone())
            .with_context(|| format!("the build made no {step}"))
    };
    let mut forced = args.clone();
    forced.force = true;
    forced.deepep.nvshmem = Some(output(StepId::Nvshmem)?);
    forced.deepep.nvshmem_wheel = Some(output(StepId::Dropin)?);
    let settings = Settings::resolve(ctx, &forced)?;
    settings.check_deepep_needs()?;
    let scratch = ctx.home.join("bench").join("deepep");
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;

    println!(
        "| trial | order | commstack (`build deepep --force`) | its setup.py bdist_wheel | its ninja span | its CPU | `python setup.py build` | its ninja span | its CPU | ratio | CPU ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows: Vec<(Timed, Timed)> = Vec::new();
    for trial in 0..req.trials.max(1) {
        // Alternate which way goes first: a machine that slows down (or warms its page
        // cache) during a trial then favours neither.
        let commstack_first = trial % 2 == 0;
        let (ours, theirs) = if commstack_first {
            let ours = time_commstack(ctx, &settings, &forced)?;
            let theirs = time_setup_py(ctx, &ours.1, &scratch, trial)?;
            (ours.0, theirs)
        } else {
            // The documented build needs a report first: the step already made (it
            // is forced, so made again right after, from the same inputs).
            let step = step_dir(&output(StepId::Deepep)?)?;
            let report = commstack_deepep::build::load_report(&step)?;
            let theirs = time_setup_py(ctx, &report, &scratch, trial)?;
            (time_commstack(ctx, &settings, &forced)?.0, theirs)
        };
        println!(
            "| {} | {} | {:.1} s | {} | {} | {:.1} s | {:.1} s | {} | {:.1} s | {:.3}x | {:.3}x |",
            trial + 1,
            if commstack_first {
                "commstack, setup.py"
            } else {
                "setup.py, commstack"
            },
            ours.seconds,
            secs(ours.setup_py_seconds),
            secs(ours.ninja_seconds),
            ours.cpu_seconds,
            theirs.seconds,
            secs(theirs.ninja_seconds),
            theirs.cpu_seconds,
            ours.seconds / theirs.seconds,
            ours.cpu_seconds / theirs.cpu_seconds
        );
        eprintln!(
            "bench: trial {} commstack's phases: {}",
            trial + 1,
            ours.phases
                .iter()
                .map(|(n, s)| format!("{n} {s:.1} s"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push((ours, theirs));
    }
    println!(
        "commstack's step, median of each phase: {}",
        phase_medians(&rows).join(", ")
    );
    let ratio = median(rows.iter().map(|(o, t)| o.seconds / t.seconds));
    let ours = median(rows.iter().map(|(o, _)| o.seconds));
    let theirs = median(rows.iter().map(|(_, t)| t.seconds));
    let cpu_ratio = median(rows.iter().map(|(o, t)| o.cpu_seconds / t.cpu_seconds));
    let med =
        |f: &dyn Fn(&(Timed, Timed)) -> Option<f64>| secs(Some(median(rows.iter().filter_map(f))));
    println!(
        "| **median** | | {ours:.1} s | {} | {} | {} | {theirs:.1} s | {} | {} | **{ratio:.3}x** | {cpu_ratio:.3}x |",
        med(&|(o, _)| o.setup_py_seconds),
        med(&|(o, _)| o.ninja_seconds),
        med(&|(o, _)| Some(o.cpu_seconds)),
        med(&|(_, t)| t.ninja_seconds),
        med(&|(_, t)| Some(t.cpu_seconds)),
    );
    println!(
        "verdict (median of the trials' ratios; target <= 1.0x): {ratio:.3}x, {}; the ratio of the medians is {:.3}x",
        if ratio <= 1.0 { "met" } else { "NOT met" },
        ours / theirs
    );
    let _ = fs::remove_dir_all(&scratch);
    Ok(if ratio <= 1.0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Each phase of commstack's step (as its build report names them) with its median over
/// the trials, `name N.N s`.
fn phase_medians(rows: &[(Timed, Timed)]) -> Vec<String> {
    let phase_names: Vec<String> = rows
        .first()
        .map(|(o, _)| o.phases.iter().map(|(n, _)| n.clone()).collect())
        .unwrap_or_default();
    phase_names
        .iter()
        .map(|name| {
            let m =
                median(rows.iter().filter_map(|(o, _)| {
                    o.phases.iter().find(|(n, _)| n == name).map(|(_, s)| *s)
                }));
            format!("{name} {m:.1} s")
        })
        .collect()
}

/// User and system CPU seconds of this process and of its waited-for children so far
/// (their descendants included, as each waits for its own: setup.py, ninja, nvcc, gcc).
fn cpu_seconds() -> f64 {
    let sum = |who| {
        // SAFETY: getrusage only writes the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(u.ru_utime) + tv(u.ru_stime)
    };
    sum(libc::RUSAGE_SELF) + sum(libc::RUSAGE_CHILDREN)
}

fn secs(s: Option<f64>) -> String {
    match s {
        Some(s) if s.is_finite() => format!("{s:.1} s"),
        _ => "-".into(),
    }
}

/// The DeepEP store step holding `wheel` (`<step>/dist/<wheel>`).
fn step_dir(wheel: &Path) -> Result<PathBuf> {
    wheel
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .with_context(|| format!("{} is not in a step's dist/", wheel.display()))
}

/// commstack's DeepEP step, forced: returns its time and the build report it wrote.
fn time_commstack(
    ctx: &Ctx,
    settings: &Settings,
    args: &BuildOptions,
) -> Result<(Timed, BuildReport)> {
    let quiet = |_: &str| {};
    let (t, cpu) = (Instant::now(), cpu_seconds());
    let made = commstack_steps::flow::deepep::deepep_step(ctx, settings, args, &quiet, &quiet)?;
    let (seconds, cpu_seconds) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    if !made.built_now {
        bail!(
            "the forced DeepEP step was not built again ({}): nothing was timed",
            made.step_dir.display()
        );
    }
    let report = commstack_deepep::build::load_report(&made.step_dir)?;
    let ninja = ninja_span(&made.step_dir.join("logs"));
    Ok((
        Timed {
            seconds,
            cpu_seconds,
            ninja_seconds: ninja,
            setup_py_seconds: Some(report.build_seconds),
            phases: report.phase_seconds.clone(),
        },
        report,
    ))
}

/// DeepEP's documented `python setup.py build` in a fresh copy of the locked source,
/// with the inputs `report` recorded.
fn time_setup_py(ctx: &Ctx, report: &BuildReport, scratch: &Path, trial: usize) -> Result<Timed> {
    let dir = scratch.join(format!("setup-py-{}", trial + 1));
    let _ = fs::remove_dir_all(&dir);
    let (src, home, tmp) = (dir.join("src"), dir.join("home"), dir.join("tmp"));
    for d in [&home, &tmp] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    // The source as the step placed it: the lock's archive with its submodules.
    let lock = commstack_steps::flow::lock::read_lock(ctx)?;
    let source = commstack_steps::flow::deepep::deepep_source(ctx, &lock, None)?;
    source.materialize(&src)?;
    let views = &report.reproducibility.relocated;
    let fixed = &report.reproducibility.fixed_build_dir;
    let env = documented_env(&report.environment.vars, fixed, views, &home, &tmp, &dir)?;
    let python = map_views(&report.python.executable.display().to_string(), views);
    let log = dir.join("setup-py-build.log");
    let out = fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let (t, cpu) = (Instant::now(), cpu_seconds());
    let status = Command::new(&python)
        .args(["setup.py", "build"])
        .current_dir(&src)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("cannot run {python}"))?;
    let (seconds, cpu_seconds) = (t.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    if !status.success() {
        bail!(
            "DeepEP's `{python} setup.py build` failed ({status}); its log: {} (the bench keeps it; run the command there again by hand with that environment)",
            log.display()
        );
    }
    let ext = built_extension(&src.join("build"))?;
    let ninja = ninja_in(&src.join("build"));
    // The extension is what both ways compile: the documented build must have made it.
    eprintln!(
        "bench: setup.py build made {} in {seconds:.1} s",
        ext.display()
    );
    fs::remove_dir_all(&dir).ok();
    Ok(Timed {
        seconds,
        cpu_seconds,
        ninja_seconds: ninja,
        setup_py_seconds: None,
        phases: Vec::new(),
    })
}

/// The variables only commstack's step sets, for reproducible bytes: the documented
/// build runs without them.
const COMMSTACK_ONLY: [&str; 4] = [
    "CPPFLAGS",          // -ffile-prefix-map for each input
    "NVCC_APPEND_FLAGS", // -objtemp and the same prefix maps for nvcc
    "LDFLAGS",           // -B<ld wrapper>: the rpath rewrite
    "SOURCE_DATE_EPOCH",
];

/// The environment of the documented build: the step's recorded environment `vars` with
/// every path through a view of the fixed build directory `fixed` mapped back to its
/// target, HOME, TMPDIR and git's ceiling in `home`, `tmp` and `top`, less
/// [`COMMSTACK_ONLY`] and the ninja front on PATH. A value still naming the fixed directory is an error (a variable
/// this bench does not know).
pub fn documented_env(
    vars: &BTreeMap<String, String>,
    fixed: &Path,
    views: &[Relocated],
    home: &Path,
    tmp: &Path,
    top: &Path,
) -> Result<BTreeMap<String, String>> {
    let fixed = fixed.display().to_string();
    let mut env = BTreeMap::new();
    for (k, v) in vars {
        if COMMSTACK_ONLY.contains(&k.as_str()) {
            continue;
        }
        let v = match k.as_str() {
            // The ninja front (job order) is commstack's: the documented build runs ninja.
            "PATH" => {
                let front = Path::new(&fixed).join(commstack_deepep::schedule::NINJA_FRONT_DIR);
                let rest = std::env::split_paths(v).filter(|d| *d != front);
                map_views(&std::env::join_paths(rest)?.to_string_lossy(), views)
            }
            "HOME" => home.display().to_string(),
            "TMPDIR" => tmp.display().to_string(),
            "GIT_CEILING_DIRECTORIES" => top.display().to_string(),
            _ => map_views(v, views),
        };
        if v.contains(&fixed) {
            bail!(
                "{k}={v} names commstack's build directory {fixed}: the bench does not know what the documented build should use instead (add it to commstack_bench::deepep)"
            );
        }
        env.insert(k.clone(), v);
    }
    Ok(env)
}

/// `value` with each view's path (`<fixed>/deps/<name>`) replaced by its target; the
/// longest link first, so a view never matches a prefix of another's name.
fn map_views(value: &str, views: &[Relocated]) -> String {
    let mut views: Vec<_> = views.iter().collect();
    views.sort_by_key(|r| std::cmp::Reverse(r.link.as_os_str().len()));
    let mut out = value.to_string();
    for r in views {
        out = replace_path(
            &out,
            &r.link.display().to_string(),
            &r.target.display().to_string(),
        );
    }
    out
}

/// `from` replaced by `to` where it is a whole path or a path's leading directories.
fn replace_path(value: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        let whole = after.is_empty() || after.starts_with(['/', ':', ' ']);
        out.push_str(&rest[..i]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `build/lib.*/deep_ep/_C*.so`: what setup.py build made.
fn built_extension(build: &Path) -> Result<PathBuf> {
    for entry in fs::read_dir(build).with_context(|| format!("no {}", build.display()))? {
        let dir = entry?.path().join("deep_ep");
        if let Ok(rd) = fs::read_dir(&dir) {
            for f in rd.filter_map(|e| e.ok()) {
                let name = f.file_name().to_string_lossy().to_string();
                if name.starts_with("_C") && name.ends_with(".so") {
                    return Ok(f.path());
                }
            }
        }
    }
    bail!(
        "setup.py build exited 0 but left no deep_ep/_C*.so under {}",
        build.display()
    )
}

/// The span of the first `.ninja_log` under `dir` (torch's build_ext writes one).
fn ninja_in(dir: &Path) -> Option<f64> {
    walkdir(dir)
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| n == ".ninja_log"))
        .and_then(|p| span(&p))
}

/// The span of the step's kept ninja logs (`logs/ninja/*.ninja_log`).
fn ninja_span(logs: &Path) -> Option<f64> {
    walkdir(logs)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "ninja_log"))
        .and_then(|p| span(&p))
}

fn span(log: &Path) -> Option<f64> {
    let text = fs::read_to_string(log).ok()?;
    let parsed = commstack_timings::parse_ninja_log(&text).ok()?;
    let start = parsed.jobs.iter().map(|j| j.start_ms).min()?;
    let end = parsed.jobs.iter().map(|j| j.end_ms).max()?;
    Some((end - start) as f64 / 1000.0)
}

/// Every file under `dir`, in name order.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        entries.sort();
        for p in entries.into_iter().rev() {
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, target: &str) -> Relocated {
        Relocated {
            name: name.into(),
            link: PathBuf::from(format!("/var/tmp/commstack-build/deepep-k/deps/{name}")),
            target: PathBuf::from(target),
            headers_copied: 0,
        }
    }

    #[test]
    fn the_documented_build_sees_the_real_inputs_without_commstacks_own_flags() {
        let fixed = Path::new("/var/tmp/commstack-build/deepep-k");
        let views = [
            view("python", "/h/store/steps/venv-1"),
            view("toolchain", "/h/store/steps/toolchain-2"),
            view("nvshmem", "/h/store/steps/nvshmem-3/install"),
            // A name that starts another's: must not be mapped inside "nvshmem".
            view("nv", "/elsewhere"),
        ];
        let d = "/var/tmp/commstack-build/deepep-k";
        let vars: BTreeMap<String, String> = [
            (
                "PATH",
                format!("{d}/ninja-front:{d}/deps/python/bin:{d}/deps/toolchain/bin:/usr/bin"),
            ),
            ("CUDA_HOME", format!("{d}/deps/toolchain/nvidia/cu13")),
            ("NVSHMEM_DIR", format!("{d}/deps/nvshmem")),
            (
                "NCCL_DIR",
                format!("{d}/deps/python/lib/python3.11/site-packages/nvidia/nccl"),
            ),
            ("MAX_JOBS", "2".into()),
            ("HOME", format!("{d}/home")),
            ("TMPDIR", format!("{d}/tmp")),
            ("GIT_CEILING_DIRECTORIES", d.into()),
            ("CPPFLAGS", format!("-ffile-prefix-map={d}/src=/deepep")),
            ("NVCC_APPEND_FLAGS", "-objtemp".into()),
            ("LDFLAGS", format!("-B{d}/ld/")),
            ("SOURCE_DATE_EPOCH", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (home, tmp, top) = (Path::new("/s/home"), Path::new("/s/tmp"), Path::new("/s"));
        let env = documented_env(&vars, fixed, &views, home, tmp, top).unwrap();
        assert_eq!(
            env["PATH"],
            "/h/store/steps/venv-1/bin:/h/store/steps/toolchain-2/bin:/usr/bin"
        );
        assert_eq!(env["CUDA_HOME"], "/h/store/steps/toolchain-2/nvidia/cu13");
        assert_eq!(env["NVSHMEM_DIR"], "/h/store/steps/nvshmem-3/install");
        assert_eq!(
            env["NCCL_DIR"],
            "/h/store/steps/venv-1/lib/python3.11/site-packages/nvidia/nccl"
        );
        assert_eq!(env["MAX_JOBS"], "2");
        assert_eq!(env["HOME"], "/s/home");
        assert_eq!(env["TMPDIR"], "/s/tmp");
        assert_eq!(env["GIT_CEILING_DIRECTORIES"], "/s");
        for k in COMMSTACK_ONLY {
            assert!(
                !env.contains_key(k),
                "{k} must not reach the documented build"
            );
        }

        // A variable naming the build directory in a way the bench cannot map is refused,
        // naming it.
        let mut odd = vars.clone();
        odd.insert("CFLAGS".into(), format!("-I{d}/src/extra"));
        let err = documented_env(&odd, fixed, &views, home, tmp, top)
            .unwrap_err()
            .to_string();
        assert!(err.contains("CFLAGS=") && err.contains(d), "{err}");
    }
}
