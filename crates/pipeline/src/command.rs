//! `cargo xtask build` (the whole graph, or `--until` / `--only` a step) and `build
//! image`: the lock first, then the plan, the run, and the summary.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use commstack_steps::ctx::Ctx;
use commstack_steps::graph::Record;
use commstack_steps::graph::{Engine, Plan, Ran, Selection, Status, StepId};
use commstack_steps::options::{BuildOptions, GraphOptions};
use commstack_steps::stack_steps::{ImageOptions, StackSteps};

/// What to do about an output in the store that entered without a trusted signature.
pub const UNSIGNED_HELP: &str = "pass --allow-unsigned to use it, or remove every such output with `cargo xtask store gc --unsigned` and build again (each is then built here, or pulled signed)";

/// What a build run left, for the summary and for benchmarks.
pub struct Built {
    pub rows: Vec<Ran>,
    pub exit: ExitCode,
    pub summary_file: PathBuf,
}

#[derive(Serialize)]
struct Summary<'a> {
    stack: String,
    lock: String,
    ok: bool,
    seconds: f64,
    /// When the command started (RFC 3339, UTC); each step's start and end count from
    /// the graph's run, which begins after the lock and the plan.
    started: String,
    /// Seconds from the command's start to the graph's run (the lock, the plan).
    run_offset: f64,
    steps: &'a [Ran],
    /// The steps whose outputs entered without a trusted signature (`--allow-unsigned`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unsigned: Vec<StepId>,
    verify: Vec<VerifyLevel>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<Failure>,
}

#[derive(Serialize)]
struct VerifyLevel {
    level: String,
    /// passed, failed, ..., or "not run"
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
}

#[derive(Serialize)]
struct Failure {
    step: StepId,
    log: PathBuf,
    error: Vec<String>,
}

/// `<home>/pipeline/<first 16 hex of sha256(absolute stack path)>/`: the record of step
/// inputs, the step logs and the last summary of one stack file.
pub(crate) fn stack_dir(ctx: &Ctx) -> Result<PathBuf> {
    // Canonical: `kernels/../stack.toml` and `stack.toml` are one stack.
    let abs = ctx
        .stack_path
        .canonicalize()
        .or_else(|_| std::path::absolute(&ctx.stack_path))
        .with_context(|| format!("{}", ctx.stack_path.display()))?;
    let id = commstack_digest::sha256_hex(abs.to_string_lossy().as_bytes());
    Ok(ctx.home.join("pipeline").join(&id[..16]))
}

/// The lock first: fresh, resolved again (unless --locked), or, in a dry run, what would
/// change. Returns None when a dry run stops here, else why the lock was resolved again
/// (None inside: it was fresh).
fn ensure_lock(
    ctx: &Ctx,
    graph: &GraphOptions,
    fetch: &commstack_steps::options::SourceFetch,
) -> Result<Option<Option<String>>> {
    let stack = commstack_steps::util::read_stack(&ctx.stack_path)?;
    let path = ctx.lock_path();
    let (previous, stale) = commstack_steps::flow::lock::lock_problems(ctx, &stack)?;
    if stale.is_empty() {
        return Ok(Some(None));
    }
    if graph.locked {
        bail!(
            "{} does not match {} and --locked refuses to change it:\n  {}\nrun `cargo xtask{} lock`, review and commit the lock, then build",
            path.display(),
            ctx.stack_path.display(),
            stale.join("\n  "),
            ctx.stack_flag()
        );
    }
    if graph.dry_run {
        commstack_steps::out!(
            "lock           runs: {} (the steps after it are planned once it is resolved)",
            stale.join("; ")
        );
        return Ok(None);
    }
    eprintln!("lock: {}: resolving again", stale.join("; "));
    commstack_steps::flow::lock::resolve_and_write(ctx, &stack, previous.as_deref(), fetch)?;
    Ok(Some(Some(stale.join("; "))))
}

/// Refuses, before anything runs, what the selection cannot give: DeepEP on an NVSHMEM
/// without IBGDA, an image target of a stack without [image], `--oci`/`--context` without the image step or into an existing
/// directory.
fn preflight(steps: &StackSteps, graph: &GraphOptions, selection: Selection) -> Result<()> {
    use commstack_steps::graph::Steps;
    let target = match selection {
        Selection::Until(s) | Selection::Only(s) => Some(s),
        Selection::All => None,
    };
    if let Some(t) = target
        && let Some(why) = steps.skipped(t)
    {
        bail!("cannot build {t}: {why}");
    }
    if target.is_none_or(|t| t.with_ancestors().contains(&StepId::Deepep)) {
        steps.settings.check_deepep_needs()?;
    }
    let image_selected = target.is_none_or(|t| t.with_ancestors().contains(&StepId::Image));
    for (flag, dir) in [("--oci", &graph.oci), ("--context", &graph.context)] {
        let Some(dir) = dir else { continue };
        if !image_selected || steps.skipped(StepId::Image).is_some() {
            bail!("{flag} needs the image step, which this build does not make");
        }
        if dir.exists() {
            bail!(
                "{flag} {}: it exists; give a directory that does not",
                dir.display()
            );
        }
    }
    Ok(())
}

/// `cargo xtask build`: the lock, then the graph's steps of the selection, then the
/// summary (a table, and JSON in `<home>/pipeline/<stack>/summary.json`); with --check,
/// the second build and the comparison.
pub fn build(ctx: &Ctx, graph: &GraphOptions, args: &BuildOptions) -> Result<Built> {
    if graph.check {
        return check(ctx, graph, args);
    }
    let started = Instant::now();
    let started_at = jiff::Timestamp::now();
    let dir = stack_dir(ctx)?;
    let summary_file = dir.join("summary.json");
    if graph.json {
        commstack_steps::util::results_to_stderr();
    }
    let Some(relocked) = ensure_lock(ctx, graph, &args.fetch)? else {
        return Ok(Built {
            rows: Vec::new(),
            exit: ExitCode::SUCCESS,
            summary_file,
        });
    };
    let mut steps = StackSteps::new(ctx, args.clone(), ImageOptions { gpus: graph.gpus })?;
    steps.lock_resolved = relocked;
    steps.settings.print_notes();
    let store = commstack_store::Store::open(ctx.store_dir())?;
    let record = Record::open(dir.join("inputs.json"))?;
    let mut substituter = substituter(ctx, graph, args, &steps)?;
    if let Some(s) = &mut substituter {
        s.feed_layers_to(steps.early_load.clone());
    }
    let engine = Engine {
        store: &store,
        record: &record,
        log_dir: dir.join("logs"),
        quiet: ctx.quiet,
        force: args.force,
        until_command: format!("cargo xtask{} build --until", ctx.stack_flag()),
        substitute: substituter
            .as_ref()
            .map(|s| s as &dyn commstack_graph::Substitute<StepId>),
        allow_unsigned: graph.cache.allow_unsigned,
        unsigned_help: UNSIGNED_HELP.to_string(),
    };
    let selection = match (graph.until, graph.only) {
        (Some(s), _) => Selection::Until(s),
        (None, Some(s)) => Selection::Only(s),
        (None, None) => Selection::All,
    };
    preflight(&steps, graph, selection)?;
    let plan = engine.plan(&steps, selection)?;
    // The image pulled and then loaded: the load begins during the pull.
    if plan.substitutes_then_runs(StepId::Image, StepId::Load) {
        steps.early_load.arm();
    }
    if graph.dry_run {
        print_plan(&plan, graph.json)?;
        return Ok(Built {
            rows: Vec::new(),
            exit: ExitCode::SUCCESS,
            summary_file,
        });
    }
    let run_offset = started.elapsed().as_secs_f64();
    let report = engine.run(&steps, plan)?;
    let failed = failure(&report.failed);
    let exit = match failed {
        None => ExitCode::SUCCESS,
        Some(_) => ExitCode::FAILURE,
    };
    if failed.is_none() && (graph.oci.is_some() || graph.context.is_some()) {
        let image = report
            .rows
            .iter()
            .find(|r| r.step == StepId::Image)
            .and_then(|r| r.output.clone())
            .context("--oci and --context need the image step: it was not part of this run")?;
        let image = commstack_image::Image::open(&image)?;
        commstack_steps::flow::image::export(
            &store,
            &image,
            graph.oci.as_deref(),
            graph.context.as_deref(),
        )?;
    }
    let summary = Summary {
        stack: ctx.stack_path.display().to_string(),
        lock: ctx.lock_path().display().to_string(),
        ok: failed.is_none(),
        seconds: started.elapsed().as_secs_f64(),
        started: started_at.round(jiff::Unit::Second)?.to_string(),
        run_offset,
        verify: verify_levels(&report.rows, graph.gpus),
        unsigned: report
            .rows
            .iter()
            .filter(|r| r.unsigned.is_some())
            .map(|r| r.step)
            .collect(),
        steps: &report.rows,
        failed,
    };
    write_summary(graph, &summary, &summary_file)?;
    Ok(Built {
        rows: report.rows,
        exit,
        summary_file,
    })
}

/// The failed step's row of the summary: its error's first lines, made safe for a terminal.
fn failure(failed: &Option<(StepId, anyhow::Error, PathBuf)>) -> Option<Failure> {
    let (step, err, log) = failed.as_ref()?;
    let error: Vec<String> = format!("{err:#}")
        .lines()
        .take(20)
        .map(|l| commstack_digest::terminal_safe(l).into_owned())
        .collect();
    Some(Failure {
        step: *step,
        log: log.clone(),
        error,
    })
}

/// summary.json (atomically), the table or the JSON on stdout, and with --timings the
/// timings page beside summary.json.
fn write_summary(graph: &GraphOptions, summary: &Summary, summary_file: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(summary)?;
    if let Some(dir) = summary_file.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    commstack_store::write_all_atomically(&[(summary_file, &json)])?;
    match graph.json {
        true => println!("{json}"),
        false => print_summary(summary, summary_file),
    }
    if graph.timings {
        let page = commstack_timings::write_beside(summary_file).with_context(|| {
            format!(
                "writing the timings page of {} (the build itself is done: its summary is there)",
                summary_file.display()
            )
        })?;
        eprintln!("timings: {}", page.display());
    }
    Ok(())
}

/// The binary cache of `--substitute REGISTRY`, else of stack.toml's [cache] registry;
/// none with `--no-substitute` or `--force` (which builds every selected step again).
fn substituter(
    ctx: &Ctx,
    graph: &GraphOptions,
    args: &BuildOptions,
    steps: &StackSteps,
) -> Result<Option<commstack_binary_cache::pull::Substituter>> {
    let cache = &steps.settings.stack.cache;
    let registry = match (
        &graph.cache.substitute,
        graph.cache.no_substitute || args.force,
    ) {
        (_, true) => return Ok(None),
        (Some(r), false) if args.fetch.offline => bail!(
            "--substitute {r} reads a registry, and --offline opens no network connection: leave out one of them"
        ),
        (Some(r), false) => r.clone(),
        // Offline, stack.toml's cache is not asked: everything is built here.
        (None, false) => match &cache.registry {
            Some(r) if !args.fetch.offline => r.clone(),
            _ => return Ok(None),
        },
    };
    let request = commstack_binary_cache::pull::SubstituteRequest {
        registry,
        trusted_keys: cache.trusted_keys.clone(),
        allow_unsigned: graph.cache.allow_unsigned,
        ca_file: graph.cache.ca_file.clone(),
        progress: !ctx.quiet,
    };
    commstack_binary_cache::pull::Substituter::new(&request, &ctx.stack_path).map(Some)
}

/// The verify levels that ran with their verdicts, and those that did not and why: the
/// static level from the verify step (on this machine), runtime and selftest from the
/// runtime step (in the loaded image, with --gpus).
fn verify_levels(rows: &[Ran], gpus: bool) -> Vec<VerifyLevel> {
    let mut out = Vec::new();
    for (level, step) in [
        ("static", StepId::Verify),
        ("runtime", StepId::Runtime),
        ("selftest", StepId::Runtime),
    ] {
        let row = rows.iter().find(|r| r.step == step);
        let ran: Vec<(String, String)> = row
            .and_then(|r| r.facts.get("levels"))
            .and_then(|l| serde_json::from_value(l.clone()).ok())
            .unwrap_or_default();
        // The verify tool lists the levels it was not asked for as "not-run".
        let status = ran
            .iter()
            .find(|(l, s)| l == level && s != "not-run")
            .map(|(_, s)| s.clone());
        let why = match (&status, row.map(|r| r.outcome)) {
            (Some(_), _) => None,
            (None, None) => Some(format!("the {step} step was not part of this run")),
            (None, Some("skipped")) => row.and_then(|r| r.reason.clone()),
            (None, Some("reused" | "built" | "substituted")) if step == StepId::Runtime && !gpus => Some(
                "needs NVIDIA GPUs and the NVIDIA container runtime: run `cargo xtask build --gpus` on a GPU machine"
                    .to_string(),
            ),
            (None, Some("failed")) => Some(format!("the {step} step failed")),
            (None, Some(_)) => Some(format!("the build stopped before the {step} step")),
        };
        out.push(VerifyLevel {
            level: level.to_string(),
            status: status.unwrap_or_else(|| "not run".into()),
            why,
        });
    }
    out
}

fn print_plan(plan: &Plan, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(plan)?);
        return Ok(());
    }
    for p in &plan.steps {
        let key = p
            .key
            .as_deref()
            .and_then(|k| k.rsplit('-').next())
            .map(|h| h[..12.min(h.len())].to_string())
            .unwrap_or_else(|| "-".into());
        let status = match &p.status {
            Status::Reused => "reused".to_string(),
            Status::Run { reason, .. } => format!("runs: {reason}"),
            Status::Skipped { reason } => format!("skipped: {reason}"),
            Status::Substitute { from } => format!("substituted from {from}"),
        };
        let only = if p.selected {
            ""
        } else {
            " (needed by --only)"
        };
        let unsigned = match &p.unsigned {
            Some(why) => format!(" (UNSIGNED: {why})"),
            None => String::new(),
        };
        println!("{:<14} {key:<12} {status}{only}{unsigned}", p.step.name());
    }
    Ok(())
}

fn print_summary(summary: &Summary, file: &std::path::Path) {
    let color = std::io::stdout().is_terminal();
    println!();
    println!("{:<14} {:<11} {:>8}  output", "step", "", "time");
    for r in summary.steps {
        println!("{}", summary_row(r, color));
    }
    for v in &summary.verify {
        match &v.why {
            None => println!("verify {:<9} {}", v.level, v.status),
            Some(why) => println!("verify {:<9} {}: {why}", v.level, v.status),
        }
    }
    if let Some(line) = unsigned_line(&summary.unsigned) {
        println!("{line}");
    }
    if let Some(f) = &summary.failed {
        eprintln!("\nerror: step {} failed:", f.step);
        for line in &f.error {
            eprintln!("  {line}");
        }
        eprintln!("log: {}", f.log.display());
        eprintln!(
            "the steps before it are kept: run the same command again to resume at {}",
            f.step
        );
    }
    println!(
        "{} in {:.1} s; summary: {}",
        if summary.ok { "done" } else { "FAILED" },
        summary.seconds,
        file.display()
    );
}

/// A step's row of the summary table: its outcome, time and output; a substituted row
/// names where it came from (the cache's reference), and an output that entered without a
/// trusted signature says so.
fn summary_row(r: &Ran, color: bool) -> String {
    let outcome = match (r.outcome, color) {
        ("failed", true) => "\x1b[31mfailed\x1b[0m     ",
        (o, _) => o,
    };
    let from = match (r.outcome, &r.reason) {
        ("substituted", Some(from)) => format!(" (from {from})"),
        _ => String::new(),
    };
    let unsigned = match r.unsigned {
        Some(_) => " UNSIGNED",
        None => "",
    };
    format!(
        "{:<14} {outcome:<11} {:>7.1}s  {}{from}{unsigned}",
        r.step.name(),
        r.seconds,
        r.output
            .as_ref()
            .map(|o| o.display().to_string())
            .or_else(|| r.reason.clone().filter(|_| r.outcome == "skipped"))
            .unwrap_or_default()
    )
}

/// The line under the table when outputs entered without a trusted signature.
fn unsigned_line(steps: &[StepId]) -> Option<String> {
    (!steps.is_empty()).then(|| {
        format!(
            "UNSIGNED: {} entered without a trusted signature (--allow-unsigned); builds reuse them only with --allow-unsigned, `cargo xtask store gc --unsigned` removes them",
            steps.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
        )
    })
}

/// `build --check`: the build, then the same selection built again by a child process in
/// a fresh home with the variations, then the comparison of what each step ships.
fn check(ctx: &Ctx, graph: &GraphOptions, args: &BuildOptions) -> Result<Built> {
    use crate::check::{BuiltStep, Variations};
    let first_graph = GraphOptions {
        check: false,
        ..graph.clone()
    };
    let first = build(ctx, &first_graph, args)?;
    if first.rows.iter().any(|r| r.outcome == "failed") {
        return Ok(first);
    }
    let steps = StackSteps::new(ctx, args.clone(), ImageOptions { gpus: graph.gpus })?;
    let first_rows: Vec<BuiltStep> = first.rows.iter().map(BuiltStep::from).collect();
    let dir = stack_dir(ctx)?;
    let id = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let scratch = ctx.home.join("check").join(&id);
    crate::check::scratch_home(&ctx.home, &scratch)?;

    // The same command, built again: --force in the scratch home, stopping at the image
    // (verify, load and runtime ship nothing; Docker is shared).
    use commstack_steps::graph::Steps;
    let image_applies = steps.skipped(StepId::Image).is_none();
    let limit: Vec<String> = match (graph.only, graph.until) {
        (Some(s), _) => vec!["--only".into(), s.name().into()],
        (None, Some(StepId::Verify | StepId::Load | StepId::Runtime)) | (None, None)
            if image_applies =>
        {
            vec!["--until".into(), "image".into()]
        }
        (None, Some(s)) => vec!["--until".into(), s.name().into()],
        (None, None) => Vec::new(),
    };
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let variations = Variations::for_check(jobs);
    let mut child_args: Vec<std::ffi::OsString> = strip_args(std::env::args_os().skip(1));
    for a in limit {
        child_args.push(std::ffi::OsString::from(a));
    }
    for a in ["--force", "--locked", "--json", "--jobs"] {
        child_args.push(a.into());
    }
    child_args.push(variations.jobs.to_string().into());
    child_args.push("--home".into());
    child_args.push(scratch.clone().into_os_string());
    let exe = std::env::current_exe().context("cannot find this program to run it again")?;
    let (mut cmd, varied) = variations.command(&exe, &child_args);
    cmd.env("COMMSTACK_HOME", &scratch)
        .stdout(std::process::Stdio::piped());
    eprintln!(
        "
build --check: building again in {} with {}",
        scratch.display(),
        varied.join(", ")
    );
    let output = cmd
        .spawn()
        .and_then(|c| c.wait_with_output())
        .with_context(|| format!("cannot run {}", exe.display()))?;
    #[derive(serde::Deserialize)]
    struct ChildSummary {
        ok: bool,
        steps: Vec<BuiltStep>,
    }
    let summary: ChildSummary = serde_json::from_slice(&output.stdout).with_context(|| {
        format!(
            "the second build (exit {}) printed no summary: its log is above",
            output.status
        )
    })?;
    if !summary.ok {
        bail!(
            "the second build failed (its log is above; its home is {}), so nothing was compared",
            scratch.display()
        );
    }
    let checks = crate::check::compare(
        &steps,
        &first_rows,
        &ctx.store_dir(),
        &summary.steps,
        &scratch.join("store"),
        &scratch.join("diffoscope"),
    )?;
    crate::check::print(&checks, &varied);
    let report = scratch.join("check.json");
    std::fs::write(
        &report,
        serde_json::to_string_pretty(&serde_json::json!({
            "varied": varied,
            "variations": variations,
            "steps": checks,
        }))?,
    )
    .with_context(|| format!("cannot write {}", report.display()))?;
    let passed = checks.iter().all(|c| c.passed());
    eprintln!(
        "{}: {} step(s) compared; report: {}",
        match passed {
            true => "check passed",
            false => "CHECK FAILED",
        },
        checks.len(),
        report.display()
    );
    Ok(Built {
        rows: first.rows,
        exit: match passed {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        },
        summary_file: first.summary_file,
    })
}

/// This command's arguments without what the second build sets itself (`--check`, the
/// output and the selection flags, `--force`, `--jobs`, `--home`).
fn strip_args(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const FLAGS: [&str; 7] = [
        "--check",
        "--timings",
        "--json",
        "--force",
        "--dry-run",
        "--gpus",
        "--locked",
    ];
    const WITH_VALUE: [&str; 7] = [
        "--jobs",
        "-j",
        "--home",
        "--oci",
        "--context",
        "--until",
        "--only",
    ];
    let mut out = Vec::new();
    let mut skip_next = false;
    for a in args {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        let s = a.to_string_lossy();
        if FLAGS.contains(&s.as_ref()) {
            continue;
        }
        if WITH_VALUE.contains(&s.as_ref()) {
            skip_next = true;
            continue;
        }
        if WITH_VALUE
            .iter()
            .any(|f| s.starts_with(&format!("{f}=")) || (*f == "-j" && s.starts_with("-j")))
        {
            continue;
        }
        out.push(a);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unsigned_output_is_said_in_the_table_and_in_summary_json() {
        let row = |step, outcome, unsigned: Option<&str>| Ran {
            step,
            outcome,
            seconds: 1.0,
            start: 0.0,
            end: 1.0,
            wait: 0.0,
            beside: None,
            output: Some(PathBuf::from("/h/store/steps/x")),
            key: None,
            reason: Some("r/c:image-1@sha256:ab".into()),
            facts: serde_json::Value::Null,
            unsigned: unsigned.map(str::to_string),
        };
        let rows = [
            row(StepId::Base, "substituted", None),
            row(
                StepId::Image,
                "substituted",
                Some("pulled with --allow-unsigned: not signed"),
            ),
            row(
                StepId::Nvshmem,
                "reused",
                Some("pulled with --allow-unsigned: not signed"),
            ),
        ];
        assert!(!summary_row(&rows[0], false).contains("UNSIGNED"));
        assert!(summary_row(&rows[1], false).ends_with("(from r/c:image-1@sha256:ab) UNSIGNED"));
        assert!(summary_row(&rows[2], false).ends_with("/h/store/steps/x UNSIGNED"));
        let unsigned: Vec<StepId> = rows
            .iter()
            .filter(|r| r.unsigned.is_some())
            .map(|r| r.step)
            .collect();
        let line = unsigned_line(&unsigned).unwrap();
        assert!(
            line.contains("image, nvshmem") && line.contains("cargo xtask store gc --unsigned"),
            "{line}"
        );
        assert!(unsigned_line(&[]).is_none());
        let json = serde_json::to_value(Summary {
            stack: "stack.toml".into(),
            lock: "stack.lock".into(),
            ok: true,
            seconds: 1.0,
            started: "2026-12-04T20:00:00Z".into(),
            run_offset: 0.5,
            steps: &rows,
            unsigned,
            verify: Vec::new(),
            failed: None,
        })
        .unwrap();
        assert_eq!(json["unsigned"], serde_json::json!(["image", "nvshmem"]));
        assert!(json["steps"][0].get("unsigned").is_none());
        assert_eq!(
            json["steps"][1]["unsigned"],
            "pulled with --allow-unsigned: not signed"
        );
    }

    #[test]
    fn the_second_build_gets_the_same_arguments_but_its_own() {
        let args = [
            "build",
            "--check",
            "--mirror",
            "../m",
            "--jobs",
            "2",
            "--until=image",
            "-j3",
            "--accept-tree-match",
            "--home",
            "/h",
            "--json",
        ];
        let kept: Vec<String> = strip_args(args.iter().map(std::ffi::OsString::from))
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["build", "--mirror", "../m", "--accept-tree-match"]);
    }
}
