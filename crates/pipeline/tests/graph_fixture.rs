//! The build graph's invalidation and crash resume, on a CPU machine, in seconds.
//!
//! The keys are the production ones: [`Fixture`] takes `skipped()` and `inputs()` from a
//! real [`StackSteps`] over the Debian-bookworm stack, so what is tested is how the stack,
//! its lock and this machine's probes compose each step's key. Only the recipes are
//! small: each writes a file made from the step's inputs and its upstream outputs, in a
//! content-addressed store step of its own, as the crates' real steps do.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use StepId::*;
use anyhow::{Context, Result, anyhow, bail};
use commstack_digest::{canonical_json, sha256_hex};
use commstack_pipeline::check::{BuiltStep, StepCheck, Variations, compare, scratch_home};
use commstack_stack::{Lock as LockFile, Stack};
use commstack_steps::ctx::Ctx;
use commstack_steps::graph::Record;
use commstack_steps::graph::{
    Done, Engine, Planned, RunReport, Selection, Status, StepId, StepResult, Steps,
};
use commstack_steps::options::BuildOptions;
use commstack_steps::options::GlobalOptions;
use commstack_steps::stack_steps::{ImageOptions, StackSteps};
use commstack_store::{META_FILE, StepKey, Store};
use serde_json::json;

/// Set (to the scenario directory) only for the child process of the check test.
const CHECK_CHILD_ENV: &str = "COMMSTACK_GRAPH_FIXTURE_CHECK_CHILD";
const CHECK_CHILD_TEST: &str = "check_child_builds_again_in_the_scratch_home";

/// Set (to the scenario directory) only for the child process of the SIGKILL test.
const CHILD_ENV: &str = "COMMSTACK_GRAPH_FIXTURE_CHILD";
const CHILD_TEST: &str = "sigkill_child_builds_until_killed";

/// Another known DeepEP V1 revision (crates/stack/src/known-sources.toml): DeepEP v1.2.1.
const OTHER_DEEPEP_REV: &str = "9af0e0d0e74f3577af1979c9b9e1ac2cad0104ee";
const OTHER_DEEPEP_TREE: &str =
    "sha256:dc9b2a11e854eecac4f37d4ef092cdff169fb1115d5d09189fcfe8962aeac075";

/// Every step after the lock, in graph order: what a first build runs.
const AFTER_LOCK: [StepId; 13] = [
    Fetch,
    Toolchain,
    NvshmemSource,
    Nvshmem,
    Dropin,
    Kernels,
    Deepep,
    Wheelhouse,
    Base,
    Image,
    Verify,
    Load,
    Runtime,
];

// ---------------------------------------------------------------------------------------
// The stack files
// ---------------------------------------------------------------------------------------

/// The Debian-bookworm stack (the one with an `[image]` section) and its lock: at
/// stacks/bookworm.* today, at stack.* once it becomes the default.
fn bookworm() -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (toml, lock) in [
        ("stack.toml", "stack.lock"),
        ("stacks/bookworm.toml", "stacks/bookworm.lock"),
    ] {
        let Ok(text) = std::fs::read_to_string(root.join(toml)) else {
            continue;
        };
        if text.lines().any(|l| l.trim() == "[image]") {
            let lock = std::fs::read_to_string(root.join(lock))
                .unwrap_or_else(|e| panic!("{lock} beside {toml}: {e}"));
            return (text, lock);
        }
    }
    panic!("no stack with an [image] section at stack.toml or stacks/bookworm.toml");
}

/// `text` with the one occurrence of `from` replaced (a test edit that silently matched
/// nothing would test nothing).
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "{from:?} once in the text");
    text.replacen(from, to, 1)
}

/// Writes `<dir>/stack.toml` and a fresh `<dir>/stack.lock` for it without the network,
/// as `cargo xtask lock` would: the bookworm lock, with the edited manifest's fingerprint
/// and echo, and `edit` for what a re-resolution would change.
fn write_stack(dir: &Path, toml: &str, edit: impl FnOnce(&mut LockFile)) -> PathBuf {
    let (_, old_lock) = bookworm();
    let path = dir.join("stack.toml");
    let lock_path = dir.join("stack.lock");
    let stack = Stack::parse(&path, toml).unwrap_or_else(|d| panic!("{d}"));
    let mut lock = LockFile::parse(&lock_path, &old_lock).unwrap_or_else(|d| panic!("{d}"));
    lock.inputs.stack = stack.fingerprint();
    lock.manifest = stack.echo();
    edit(&mut lock);
    let text = lock.render(Some(&old_lock));
    let stale = LockFile::parse(&lock_path, &text)
        .unwrap_or_else(|d| panic!("{d}"))
        .staleness(&stack);
    assert!(stale.is_empty(), "the written lock is stale: {stale:?}");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(&path, toml).unwrap();
    std::fs::write(&lock_path, text).unwrap();
    path
}

/// The bookworm stack as it is.
fn write_bookworm(dir: &Path) -> PathBuf {
    write_stack(dir, &bookworm().0, |_| {})
}

/// The bookworm stack with IBGDA off.
fn write_no_ibgda(dir: &Path) -> PathBuf {
    let toml = replace_once(&bookworm().0, "\nibgda = true", "\nibgda = false");
    write_stack(dir, &toml, |_| {})
}

/// The bookworm stack at another DeepEP revision, in stack.toml and in the lock's source.
fn write_other_deepep(dir: &Path) -> PathBuf {
    let (toml, _) = bookworm();
    let stack = Stack::parse(Path::new("stack.toml"), &toml).unwrap_or_else(|d| panic!("{d}"));
    let old = stack.deepep.rev.clone();
    assert!(
        !OTHER_DEEPEP_REV.starts_with(&old),
        "the stack is at {old} already"
    );
    let toml = replace_once(
        &toml,
        &format!("rev = \"{old}\""),
        &format!("rev = \"{}\"", &OTHER_DEEPEP_REV[..7]),
    );
    write_stack(dir, &toml, |lock| {
        lock.resolved.deepep_rev = OTHER_DEEPEP_REV.into();
        let source = lock
            .sources
            .iter_mut()
            .find(|s| s.name == "deepep")
            .expect("the lock has a deepep source");
        source.rev = Some(OTHER_DEEPEP_REV.into());
        source.version = format!("0+g{}", &OTHER_DEEPEP_REV[..12]);
        source.url =
            format!("https://github.com/deepseek-ai/DeepEP/archive/{OTHER_DEEPEP_REV}.tar.gz");
        source.filename = format!("DeepEP-{OTHER_DEEPEP_REV}.tar.gz");
        source.tree = Some(OTHER_DEEPEP_TREE.into());
        source.origin = "known-source table: DeepEP v1.2.1".into();
    })
}

// ---------------------------------------------------------------------------------------
// The fixture recipes
// ---------------------------------------------------------------------------------------

struct Fixture<'a> {
    stack: StackSteps<'a>,
    /// The recipes' own content-addressed steps (`fixture-<step>`), beside the graph's.
    store: Store,
    /// Where fetch and load leave their markers (the download cache and Docker, here).
    markers: PathBuf,
    /// What `run` was called for, in order (a Mutex: two steps may run at once).
    ran: Mutex<Vec<StepId>>,
    /// The SIGKILL child: NVSHMEM's recipe writes half its output, creates this file and
    /// sleeps until killed.
    hang: Option<PathBuf>,
    /// The check's injected nondeterminism: this step's recipe also writes the time.
    inject_time: Option<StepId>,
    /// `--force` reaches the recipes' own steps, as it reaches the crates' in production.
    force: bool,
    /// Verify and load wait for each other here (the concurrency tests).
    meeting: Option<Meeting>,
}

/// Where verify and load meet: each tells the other it has started, then waits for the
/// other's word, 10 s at most. Run one after the other, the first waits in vain and fails
/// (rather than hanging, as a `Barrier` would).
struct Meeting {
    /// (tell the other, hear the other) for verify, and for load.
    verify: (Sender<()>, Mutex<Receiver<()>>),
    load: (Sender<()>, Mutex<Receiver<()>>),
    /// The step that fails once both have met.
    fail: Option<StepId>,
}

impl Meeting {
    fn new(fail: Option<StepId>) -> Meeting {
        let (to_load, load_hears) = std::sync::mpsc::channel();
        let (to_verify, verify_hears) = std::sync::mpsc::channel();
        Meeting {
            verify: (to_load, Mutex::new(verify_hears)),
            load: (to_verify, Mutex::new(load_hears)),
            fail,
        }
    }

    fn meet(&self, step: StepId) -> Result<()> {
        let (tell, hear) = match step {
            Verify => &self.verify,
            Load => &self.load,
            _ => return Ok(()),
        };
        tell.send(())?;
        hear.lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| anyhow!("{step} waited for the other step in vain ({e}): they did not run at the same time"))?;
        if self.fail == Some(step) {
            bail!("{step} fails, as the test asks");
        }
        Ok(())
    }
}

/// The outputs a step's recipe reads: its dependencies', through fetch and load, whose
/// outputs (the download cache, Docker) are not files of their own.
fn data_deps(step: StepId) -> Vec<StepId> {
    step.deps()
        .iter()
        .flat_map(|&d| match d.keyed() {
            true => vec![d],
            false => data_deps(d),
        })
        .collect()
}

fn sha256_of(done: &Done, step: StepId) -> Result<String> {
    let path = done
        .get(&step)
        .and_then(|r| r.output.clone())
        .with_context(|| format!("step {step} has no output"))?;
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(sha256_hex(bytes))
}

impl Fixture<'_> {
    fn loaded_marker(&self, done: &Done) -> Result<PathBuf> {
        Ok(self
            .markers
            .join(format!("loaded-{}", sha256_of(done, Image)?)))
    }

    /// A keyed step's recipe: a file of its inputs and its upstream outputs' sha256.
    fn recipe(&self, step: StepId, done: &Done) -> Result<StepResult> {
        let mut text = format!("{step}\n{}\n", canonical_json(&self.stack.inputs(step)?));
        for dep in data_deps(step) {
            text.push_str(&format!("{dep} {}\n", sha256_of(done, dep)?));
        }
        let inputs = json!({ "text": text });
        let key = StepKey::new(&format!("fixture-{step}"), &inputs);
        let file = format!("{step}.out");
        let made = self.store.run(&key, &inputs, self.force, |dir| {
            let out = dir.out.join(&file);
            if step == Nvshmem
                && let Some(started) = &self.hang
            {
                std::fs::write(&out, &text.as_bytes()[..text.len() / 2])?;
                std::fs::write(started, "")?;
                std::thread::sleep(Duration::from_secs(300));
                bail!("the SIGKILL test's child was not killed");
            }
            std::fs::write(&out, &text)?;
            if self.inject_time == Some(step) {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
                std::fs::write(&out, format!("{text}built at {}\n", now.as_nanos()))?;
            }
            Ok(())
        })?;
        Ok(StepResult {
            output: Some(made.path().join(file)),
            facts: json!({ "bytes": text.len() }),
        })
    }
}

impl Steps<StepId> for Fixture<'_> {
    fn skipped(&self, step: StepId) -> Option<String> {
        self.stack.skipped(step)
    }

    fn inputs(&self, step: StepId) -> Result<serde_json::Value> {
        self.stack.inputs(step)
    }

    fn pending(&self, step: StepId, done: &Done) -> Result<Option<String>> {
        Ok(match step {
            // The caller of the graph makes the lock fresh (here: write_stack).
            Lock => None,
            Fetch => (!self.markers.join("fetched").exists()).then(|| "not fetched".into()),
            Load => (!self.loaded_marker(done)?.exists()).then(|| "not loaded".into()),
            _ => bail!("step {step} is keyed"),
        })
    }

    fn run(&self, step: StepId, done: &Done, _say: &dyn Fn(&str)) -> Result<StepResult> {
        self.ran.lock().unwrap().push(step);
        if let Some(meeting) = &self.meeting {
            meeting.meet(step)?;
        }
        let marker = match step {
            Lock => bail!("the lock is made before the graph runs"),
            Fetch => self.markers.join("fetched"),
            Load => self.loaded_marker(done)?,
            _ => return self.recipe(step, done),
        };
        std::fs::create_dir_all(&self.markers)?;
        std::fs::write(&marker, step.name())?;
        Ok(StepResult {
            output: Some(marker),
            facts: serde_json::Value::Null,
        })
    }

    fn shipped(&self, step: StepId, result: &StepResult) -> Option<PathBuf> {
        step.keyed().then(|| result.output.clone()).flatten()
    }
}

// ---------------------------------------------------------------------------------------
// One build: `cargo xtask build` with the fixture recipes
// ---------------------------------------------------------------------------------------

struct Built {
    /// The plan, as `--dry-run` prints it.
    plan: Vec<Planned>,
    /// The steps whose recipe ran, in order.
    ran: Vec<StepId>,
    /// The output bytes of every keyed step (reused or built).
    outputs: BTreeMap<StepId, Vec<u8>>,
    /// Each step and its key, as the summary lists them.
    rows: Vec<BuiltStep>,
}

impl Built {
    fn planned(&self, step: StepId) -> &Planned {
        self.plan
            .iter()
            .find(|p| p.step == step)
            .expect("every step is planned")
    }

    /// Why the plan runs `step` (it fails when the step is reused or skipped).
    fn reason(&self, step: StepId) -> &str {
        match &self.planned(step).status {
            Status::Run { reason, .. } => reason,
            other => panic!("{step} is planned {other:?}, not to run"),
        }
    }

    fn planned_to_run(&self) -> Vec<StepId> {
        self.plan
            .iter()
            .filter(|p| matches!(p.status, Status::Run { .. }))
            .map(|p| p.step)
            .collect()
    }

    /// The change of the input at `path` the plan names for `step`: (old, new).
    fn change(&self, step: StepId, path: &str) -> (serde_json::Value, serde_json::Value) {
        let Status::Run { changed, .. } = &self.planned(step).status else {
            panic!("{step} is not planned to run");
        };
        let c = changed
            .iter()
            .find(|c| c.path == path)
            .unwrap_or_else(|| panic!("{step}: no change of {path} in {changed:?}"));
        (
            c.old.clone().unwrap_or_default(),
            c.new.clone().unwrap_or_default(),
        )
    }

    /// The plan as `--dry-run` prints it, for assertion messages.
    fn dry_run(&self) -> String {
        self.plan
            .iter()
            .map(|p| match &p.status {
                Status::Reused => format!("{:<14} reused", p.step.name()),
                Status::Run { reason, .. } => format!("{:<14} runs: {reason}", p.step.name()),
                Status::Skipped { reason } => format!("{:<14} skipped: {reason}", p.step.name()),
                Status::Substitute { from } => {
                    format!("{:<14} substituted from {from}", p.step.name())
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn build(stack: &Path, home: &Path, hang: Option<PathBuf>) -> Result<Built> {
    build_opts(stack, home, hang, false, None)
}

fn ctx_for(stack: &Path, home: &Path) -> Result<Ctx> {
    Ctx::new(GlobalOptions {
        stack: Some(stack.to_path_buf()),
        home: Some(home.to_path_buf()),
        quiet: true,
    })
}

fn fixture<'a>(ctx: &'a Ctx, home: &Path, inject_time: Option<StepId>) -> Result<Fixture<'a>> {
    Ok(Fixture {
        stack: StackSteps::new(ctx, BuildOptions::default(), ImageOptions { gpus: false })?,
        store: Store::open(ctx.store_dir())?,
        markers: home.join("fixture"),
        ran: Mutex::new(Vec::new()),
        hang: None,
        inject_time,
        force: false,
        meeting: None,
    })
}

/// `force`: what `cargo xtask build --force` asks of the engine; `inject_time`: the step
/// whose output also records the time.
fn build_opts(
    stack: &Path,
    home: &Path,
    hang: Option<PathBuf>,
    force: bool,
    inject_time: Option<StepId>,
) -> Result<Built> {
    let ctx = ctx_for(stack, home)?;
    let fixture = Fixture {
        hang,
        force,
        ..fixture(&ctx, home, inject_time)?
    };
    let (planned, report) = plan_and_run(&ctx, &fixture, home, force)?;
    if let Some((step, err, log)) = report.failed {
        bail!("step {step} failed ({}): {err:#}", log.display());
    }
    let rows = report.rows.iter().map(BuiltStep::from).collect();
    let mut ran = fixture.ran.into_inner().unwrap();
    // Verify and load run at once and call their recipes in either order: only that pair
    // is put in graph order, so every other order is still checked.
    if let Some(i) = ran
        .windows(2)
        .position(|w| w == [StepId::Load, StepId::Verify])
    {
        ran.swap(i, i + 1);
    }
    let built: Vec<StepId> = report
        .rows
        .iter()
        .filter(|r| r.outcome == "built")
        .map(|r| r.step)
        .collect();
    assert_eq!(
        built, ran,
        "the summary's built steps are those whose recipe ran"
    );
    let mut outputs = BTreeMap::new();
    for row in report.rows.iter().filter(|r| r.step.keyed()) {
        let path = row
            .output
            .as_ref()
            .with_context(|| format!("{} has no output", row.step))?;
        outputs.insert(row.step, std::fs::read(path)?);
    }
    Ok(Built {
        plan: planned,
        ran,
        outputs,
        rows,
    })
}

/// The engine over `fixture`: plans every step and runs them.
fn plan_and_run(
    ctx: &Ctx,
    fixture: &Fixture,
    home: &Path,
    force: bool,
) -> Result<(Vec<Planned>, RunReport)> {
    let store = Store::open(ctx.store_dir())?;
    let record = Record::open(home.join("pipeline/inputs.json"))?;
    let engine = Engine {
        store: &store,
        record: &record,
        log_dir: home.join("pipeline/logs"),
        quiet: true,
        force,
        until_command: "cargo xtask build --until".into(),
        substitute: None,
        allow_unsigned: false,
        unsigned_help: String::new(),
    };
    let plan = engine.plan(fixture, Selection::All)?;
    let planned = plan.steps.clone();
    Ok((planned, engine.run(fixture, plan)?))
}

/// Every step that runs has a reason that names what changed: an input, or the
/// upstream step that runs before it.
fn assert_reasons_name_the_change(b: &Built) {
    for p in &b.plan {
        if let Status::Run { reason, .. } = &p.status {
            assert!(
                reason.starts_with("after ") || reason.starts_with("input "),
                "{} runs for {reason:?}, which names no changed input:\n{}",
                p.step,
                b.dry_run()
            );
        }
    }
}

fn assert_first_build(b: &Built) {
    assert_eq!(
        b.ran,
        AFTER_LOCK,
        "a first build runs every step:\n{}",
        b.dry_run()
    );
    assert_eq!(b.planned_to_run(), AFTER_LOCK);
    assert_eq!(b.planned(Lock).status, Status::Reused, "the lock is fresh");
}

fn assert_nothing_runs(b: &Built) {
    assert_eq!(
        b.planned_to_run(),
        Vec::<StepId>::new(),
        "an unchanged stack plans nothing to run:\n{}",
        b.dry_run()
    );
    assert_eq!(
        b.ran,
        Vec::<StepId>::new(),
        "an unchanged stack rebuilds nothing"
    );
}

// ---------------------------------------------------------------------------------------
// Invalidation
// ---------------------------------------------------------------------------------------

#[test]
fn force_runs_every_keyed_step_again_with_the_same_outputs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack = write_bookworm(&dir.path().join("stack"));
    let home = dir.path().join("home");
    let first = build(&stack, &home, None)?;
    let forced = build_opts(&stack, &home, None, true, None)?;
    // Every keyed step runs; fetch (the cache) is still done; load follows the image.
    let expected: Vec<StepId> = AFTER_LOCK.into_iter().filter(|s| *s != Fetch).collect();
    assert_eq!(forced.ran, expected, "{}", forced.dry_run());
    for p in &forced.plan {
        if p.step.keyed() {
            assert_eq!(
                p.status,
                Status::Run {
                    reason: "--force".into(),
                    changed: Vec::new()
                },
                "{}",
                forced.dry_run()
            );
        }
    }
    assert_eq!(forced.outputs, first.outputs);
    assert_nothing_runs(&build(&stack, &home, None)?);
    Ok(())
}

#[test]
fn unchanged_stack_rebuilds_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack = write_bookworm(&dir.path().join("stack"));
    let home = dir.path().join("home");

    let first = build(&stack, &home, None)?;
    assert_first_build(&first);

    let again = build(&stack, &home, None)?;
    assert_nothing_runs(&again);
    assert_eq!(again.outputs, first.outputs);

    // The same stack rewritten (new mtime, same bytes) is still unchanged.
    write_bookworm(&dir.path().join("stack"));
    assert_nothing_runs(&build(&stack, &home, None)?);
    Ok(())
}

#[test]
fn changed_nvshmem_option_rebuilds_nvshmem_and_what_follows_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack_dir = dir.path().join("stack");
    let stack = write_bookworm(&stack_dir);
    let home = dir.path().join("home");
    let first = build(&stack, &home, None)?;
    assert_first_build(&first);

    write_no_ibgda(&stack_dir);
    let b = build(&stack, &home, None)?;
    let rebuilt = [
        Nvshmem, Dropin, Kernels, Deepep, Wheelhouse, Image, Verify, Load, Runtime,
    ];
    assert_eq!(
        b.planned_to_run(),
        rebuilt,
        "the dry run of ibgda = false:\n{}",
        b.dry_run()
    );
    assert_eq!(b.ran, rebuilt);
    for step in [Lock, Fetch, Toolchain, NvshmemSource, Base] {
        assert_eq!(
            b.planned(step).status,
            Status::Reused,
            "{step}:\n{}",
            b.dry_run()
        );
        assert_eq!(b.outputs.get(&step), first.outputs.get(&step), "{step}");
    }
    // --dry-run names the changed input, and the step each later one runs after.
    let nvshmem = b.reason(Nvshmem);
    assert!(
        nvshmem.starts_with("input ") && nvshmem.contains("ibgda changed: true -> false"),
        "nvshmem runs for {nvshmem:?}"
    );
    let (old, new) = b.change(Nvshmem, "options.ibgda");
    assert_eq!((old, new), (json!(true), json!(false)));
    assert!(
        b.reason(Dropin).starts_with("after nvshmem"),
        "{}",
        b.reason(Dropin)
    );
    assert!(
        b.reason(Kernels).starts_with("after nvshmem"),
        "{}",
        b.reason(Kernels)
    );
    assert!(
        b.reason(Deepep).starts_with("after nvshmem"),
        "{}",
        b.reason(Deepep)
    );
    assert!(
        b.reason(Wheelhouse).starts_with("after deepep"),
        "{}",
        b.reason(Wheelhouse)
    );
    assert_reasons_name_the_change(&b);
    for step in rebuilt.into_iter().filter(|s| s.keyed()) {
        assert_ne!(b.outputs[&step], first.outputs[&step], "{step}'s output");
    }

    // Back to IBGDA on: the store still has every output of the first build.
    write_bookworm(&stack_dir);
    let back = build(&stack, &home, None)?;
    assert_nothing_runs(&back);
    assert_eq!(back.outputs, first.outputs);
    Ok(())
}

#[test]
fn changed_deepep_revision_rebuilds_deepep_wheelhouse_and_image_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack_dir = dir.path().join("stack");
    let stack = write_bookworm(&stack_dir);
    let home = dir.path().join("home");
    let first = build(&stack, &home, None)?;
    assert_first_build(&first);

    write_other_deepep(&stack_dir);
    let b = build(&stack, &home, None)?;
    let rebuilt = [Deepep, Wheelhouse, Image, Verify, Load, Runtime];
    assert_eq!(
        b.planned_to_run(),
        rebuilt,
        "the dry run of another DeepEP revision:\n{}",
        b.dry_run()
    );
    assert_eq!(b.ran, rebuilt);
    for step in [
        Lock,
        Fetch,
        Toolchain,
        NvshmemSource,
        Nvshmem,
        Dropin,
        Kernels,
        Base,
    ] {
        assert_eq!(
            b.planned(step).status,
            Status::Reused,
            "{step}:\n{}",
            b.dry_run()
        );
        assert_eq!(b.outputs.get(&step), first.outputs.get(&step), "{step}");
    }
    let deepep = b.reason(Deepep);
    assert!(
        deepep.starts_with("input ") && deepep.contains("input source.rev changed"),
        "deepep runs for {deepep:?}"
    );
    let (old, new) = b.change(Deepep, "source.rev");
    assert!(old.as_str().is_some_and(|r| r != OTHER_DEEPEP_REV), "{old}");
    assert_eq!(new, json!(OTHER_DEEPEP_REV));
    assert_eq!(b.change(Deepep, "source.tree").1, json!(OTHER_DEEPEP_TREE));
    assert!(
        b.reason(Wheelhouse).starts_with("after deepep"),
        "{}",
        b.reason(Wheelhouse)
    );
    assert!(
        b.reason(Image).starts_with("after wheelhouse"),
        "{}",
        b.reason(Image)
    );
    assert_reasons_name_the_change(&b);

    write_bookworm(&stack_dir);
    let back = build(&stack, &home, None)?;
    assert_nothing_runs(&back);
    assert_eq!(back.outputs, first.outputs);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Two steps at the same time: verify (on this machine) while the image loads
// ---------------------------------------------------------------------------------------

/// A first build whose verify and load recipes wait for each other (10 s at most), with
/// `fail` failing once they have met: the stack, the home and the run's report.
fn build_meeting(dir: &Path, fail: Option<StepId>) -> Result<(PathBuf, PathBuf, RunReport)> {
    let stack = write_bookworm(&dir.join("stack"));
    let home = dir.join("home");
    let ctx = ctx_for(&stack, &home)?;
    let fixture = Fixture {
        meeting: Some(Meeting::new(fail)),
        ..fixture(&ctx, &home, None)?
    };
    let (_, report) = plan_and_run(&ctx, &fixture, &home, false)?;
    Ok((stack, home, report))
}

fn outcomes(report: &RunReport) -> Vec<(StepId, &'static str)> {
    report.rows.iter().map(|r| (r.step, r.outcome)).collect()
}

#[test]
fn verify_and_load_run_at_the_same_time() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (_, home, report) = build_meeting(dir.path(), None)?;
    // One after the other, the first of them would wait 10 s for the other and fail.
    if let Some((step, err, _)) = &report.failed {
        panic!("step {step} failed: {err:#}");
    }
    let built: Vec<StepId> = report
        .rows
        .iter()
        .filter(|r| r.outcome == "built")
        .map(|r| r.step)
        .collect();
    assert_eq!(built, AFTER_LOCK, "every row, in graph order");
    // Their rows say so (summary.json, build --timings): overlapping times, each naming
    // the other; runtime starts after both ended.
    let row = |s: StepId| report.rows.iter().find(|r| r.step == s).unwrap();
    let (v, l, rt) = (row(Verify), row(Load), row(Runtime));
    assert_eq!((v.beside, l.beside), (Some(Load), Some(Verify)));
    assert!(v.start < l.end && l.start < v.end, "{v:?} {l:?}");
    assert!(
        rt.start >= v.end.max(l.end) && rt.beside.is_none(),
        "{rt:?}"
    );
    // Each has its own log.
    for step in [Verify, Load] {
        assert!(home.join(format!("pipeline/logs/{step}.log")).is_file());
    }
    Ok(())
}

#[test]
fn a_failure_of_one_of_two_at_once_stops_the_run_and_the_other_is_kept() -> Result<()> {
    // Verify runs on the engine's thread, load on the one it starts: both ways.
    for (fail, other) in [(Verify, Load), (Load, Verify)] {
        let dir = tempfile::tempdir()?;
        let (stack, home, report) = build_meeting(dir.path(), Some(fail))?;
        let (step, err, log) = report
            .failed
            .as_ref()
            .unwrap_or_else(|| panic!("{fail} was to fail: {:?}", outcomes(&report)));
        assert_eq!(*step, fail);
        assert!(
            format!("{err:#}").contains("fails, as the test asks"),
            "{err:#}"
        );
        let logged = std::fs::read_to_string(log)?;
        assert!(logged.contains("fails, as the test asks"), "{logged}");
        let end: Vec<(StepId, &str)> = outcomes(&report)
            .into_iter()
            .filter(|(s, _)| *s >= Image)
            .collect();
        let mut expected = vec![(Image, "built"), (Verify, "built"), (Load, "built")];
        expected.retain(|(s, _)| *s != fail);
        expected.push((fail, "failed"));
        expected.sort();
        expected.push((Runtime, "not-run"));
        assert_eq!(
            end, expected,
            "{fail} fails, {other} finishes, runtime does not run"
        );

        // The same command resumes at the failed step: the other is done.
        let rerun = build(&stack, &home, None)?;
        assert_eq!(
            rerun.planned_to_run(),
            [fail, Runtime],
            "{}",
            rerun.dry_run()
        );
        assert_eq!(rerun.planned(other).status, Status::Reused);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// build --check: the second build in a child process with the variations
// ---------------------------------------------------------------------------------------

/// The child process of the check tests: builds the scenario's stack again with --force
/// in the scratch home, and prints what it saw of the variations and its rows as JSON.
/// Not a test of its own (ignored); it fails when run outside those tests.
#[test]
#[ignore = "the child process of the check tests"]
fn check_child_builds_again_in_the_scratch_home() {
    let dir = PathBuf::from(std::env::var_os(CHECK_CHILD_ENV).unwrap_or_else(|| {
        panic!("{CHECK_CHILD_ENV} is not set: this is the check test's child process, not a test")
    }));
    let inject = std::fs::read_to_string(dir.join("inject"))
        .ok()
        .map(|s| match s.trim() {
            "deepep" => Deepep,
            other => panic!("no injection for {other}"),
        });
    let built = build_opts(
        &dir.join("stack/stack.toml"),
        &dir.join("scratch"),
        None,
        true,
        inject,
    )
    .expect("the second build");
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .unwrap()
        .trim()
        .to_string();
    let seen = json!({
        "tz": std::env::var("TZ").ok(),
        "lc_all": std::env::var("LC_ALL").ok(),
        "umask": umask,
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim(),
        "pid": std::process::id(),
        "rows": built.rows,
    });
    println!("CHECK-CHILD {seen}");
}

/// `build --check` on the fixture: the first build here, the second in a child process
/// with the variations, then the comparison. The directory holds diffoscope's reports.
fn check_fixture(
    inject: Option<StepId>,
) -> Result<(tempfile::TempDir, Vec<StepCheck>, serde_json::Value)> {
    let dir = tempfile::tempdir()?;
    let stack = write_bookworm(&dir.path().join("stack"));
    let home = dir.path().join("home");
    let first = build_opts(&stack, &home, None, false, inject)?;
    if let Some(step) = inject {
        std::fs::write(dir.path().join("inject"), step.name())?;
    }
    let scratch = dir.path().join("scratch");
    scratch_home(&home, &scratch)?;
    let variations = Variations::for_check(2);
    let args: Vec<std::ffi::OsString> = ["--exact", CHECK_CHILD_TEST, "--ignored", "--nocapture"]
        .iter()
        .map(Into::into)
        .collect();
    let (mut cmd, varied) = variations.command(&std::env::current_exe()?, &args);
    let out = cmd
        .env(CHECK_CHILD_ENV, dir.path())
        .stdin(Stdio::null())
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: serde_json::Value = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHECK-CHILD "))
        .map(serde_json::from_str)
        .transpose()?
        .with_context(|| {
            format!(
                "the child printed no result ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let second: Vec<BuiltStep> = serde_json::from_value(seen["rows"].clone())?;
    let ctx = ctx_for(&stack, &home)?;
    let steps = fixture(&ctx, &home, None)?;
    let checks = compare(
        &steps,
        &first.rows,
        &home.join("store"),
        &second,
        &scratch.join("store"),
        &dir.path().join("reports"),
    )?;
    let mut seen = seen;
    seen["varied"] = json!(varied);
    seen["parent_pid"] = json!(std::process::id());
    Ok((dir, checks, seen))
}

#[test]
fn check_rebuilds_every_step_with_the_variations_and_finds_the_same_bytes() -> Result<()> {
    let (_dir, checks, seen) = check_fixture(None)?;
    // The variations reached the second build.
    assert_eq!(seen["tz"], "NPT-5:45", "{seen}");
    assert_eq!(seen["lc_all"], "C", "{seen}");
    assert_eq!(seen["umask"], "0027", "{seen}");
    assert_ne!(seen["pid"], seen["parent_pid"]);
    let varied = seen["varied"].to_string();
    match varied.contains("hostname not varied") {
        true => eprintln!("note: {varied}"),
        false => assert_eq!(seen["hostname"], "commstack-check", "{seen}"),
    }
    // Every keyed step was built again and compared, and all are identical.
    let compared: Vec<StepId> = checks.iter().map(|c| c.step).collect();
    let keyed: Vec<StepId> = AFTER_LOCK.iter().copied().filter(|s| s.keyed()).collect();
    assert_eq!(compared, keyed);
    for c in &checks {
        assert!(c.passed(), "{:?}", c);
        assert_eq!(c.files, 1, "{c:?}");
    }
    Ok(())
}

#[test]
fn check_names_the_file_a_step_writes_the_time_into() -> Result<()> {
    let (_dir, checks, _) = check_fixture(Some(Deepep))?;
    let failed: Vec<&StepCheck> = checks.iter().filter(|c| !c.passed()).collect();
    assert_eq!(
        failed.first().map(|c| c.step),
        Some(Deepep),
        "the first step that differs is the one that records the time: {checks:#?}"
    );
    let deepep = failed[0];
    assert_eq!(
        deepep.other_key, None,
        "the keys are equal; the bytes are not"
    );
    assert_eq!(deepep.differences.len(), 1, "{deepep:?}");
    let (file, what) = &deepep.differences[0];
    assert_eq!(file, "deepep.out");
    assert!(what.starts_with("content (sha256 "), "{what}");
    // Where diffoscope is installed, its report names the line that moved.
    if commstack_toolchain::find_in_path("diffoscope", None).is_some() {
        let report = std::fs::read_to_string(&deepep.reports[0])?;
        assert!(report.contains("built at"), "{report}");
    }
    // What reads DeepEP's output differs after it; nothing before it does.
    for c in &checks {
        if c.step < Deepep {
            assert!(c.passed(), "{c:?}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// SIGKILL during NVSHMEM's build
// ---------------------------------------------------------------------------------------

/// The child process of `sigkill_during_nvshmem_leaves_nothing_done_and_the_rerun_resumes`:
/// builds the scenario's stack with an NVSHMEM recipe that hangs halfway, to be killed.
/// Not a test of its own (ignored); it fails when run outside that test.
#[test]
#[ignore = "the child process of the SIGKILL test"]
fn sigkill_child_builds_until_killed() {
    let dir = PathBuf::from(std::env::var_os(CHILD_ENV).unwrap_or_else(|| {
        panic!("{CHILD_ENV} is not set: this is the SIGKILL test's child process, not a test")
    }));
    let built = build(
        &dir.join("stack/stack.toml"),
        &dir.join("home"),
        Some(dir.join("started")),
    );
    panic!(
        "the build returned instead of hanging in nvshmem: {:?}",
        built.map(|b| b.ran)
    );
}

/// Every file named `name` under `dir`.
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_file() && e.file_name() == name)
        .map(|e| e.into_path())
        .collect()
}

#[test]
fn sigkill_during_nvshmem_leaves_nothing_done_and_the_rerun_resumes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack = write_bookworm(&dir.path().join("stack"));
    let home = dir.path().join("home");
    let started = dir.path().join("started");
    let log = dir.path().join("child.log");

    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", CHILD_TEST, "--ignored", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.path().join("child.err"))?)
        .spawn()?;
    let child_output = || {
        let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("child.log"), read("child.err"))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !started.exists() {
        if let Some(status) = child.try_wait()? {
            panic!(
                "the child ended ({status}) before NVSHMEM's build:\n{}",
                child_output()
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "the child did not reach NVSHMEM's build in 120 s:\n{}",
                child_output()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = libc::pid_t::try_from(child.id())?;
    // SAFETY: kill(2) on the child we spawned and have not waited for yet.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = child.wait()?;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");

    // No step after the last complete one is marked done, NVSHMEM's or any later one.
    let store = home.join("store");
    let mut done: Vec<String> = std::fs::read_dir(store.join("steps"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?
        .into_iter()
        .filter(|p| p.join(META_FILE).is_file())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name[..name.rfind('-').unwrap()].to_string()
        })
        .collect();
    done.sort();
    assert_eq!(
        done,
        [
            "fixture-nvshmem-source",
            "fixture-toolchain",
            "pipeline-nvshmem-source",
            "pipeline-toolchain",
        ],
        "the steps marked done after the kill"
    );
    let partial = find_files(&home, "nvshmem.out");
    assert!(
        !partial.is_empty(),
        "the child wrote part of NVSHMEM's output"
    );
    for p in &partial {
        assert!(
            p.starts_with(store.join("tmp")),
            "a partial output outside tmp/: {}",
            p.display()
        );
    }
    let record = Record::open(home.join("pipeline/inputs.json"))?;
    assert!(record.has(Toolchain) && !record.has(Nvshmem));

    // The rerun resumes at NVSHMEM.
    let rerun = build(&stack, &home, None)?;
    let resumed = [
        Nvshmem, Dropin, Kernels, Deepep, Wheelhouse, Base, Image, Verify, Load, Runtime,
    ];
    assert_eq!(
        rerun.planned_to_run(),
        resumed,
        "the rerun's plan:\n{}",
        rerun.dry_run()
    );
    assert_eq!(rerun.ran, resumed);
    for step in [Lock, Fetch, Toolchain, NvshmemSource] {
        assert_eq!(rerun.planned(step).status, Status::Reused, "{step}");
    }

    // ... and ends with the outputs of a build that was never interrupted.
    let fresh = build(&stack, &dir.path().join("fresh-home"), None)?;
    assert_first_build(&fresh);
    assert_eq!(
        rerun.outputs.keys().collect::<Vec<_>>(),
        AFTER_LOCK.iter().filter(|s| s.keyed()).collect::<Vec<_>>()
    );
    assert_eq!(rerun.outputs, fresh.outputs);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The dry run's words
// ---------------------------------------------------------------------------------------

/// Inputs hold paths, probe errors and environment values, which may be non-ASCII: a
/// shortened value is cut on a character boundary, not in the middle of one.
#[test]
fn changed_inputs_are_shortened_on_character_boundaries() {
    use commstack_steps::graph::Change;
    // 'é' is two bytes: cutting by bytes at 12 or 57 would fall inside one.
    let string = json!(format!("/home/x{}", "é".repeat(20)));
    let object = json!({ "prefix": format!("/home/{}", "é".repeat(60)) });
    for value in [string, object] {
        let change = Change {
            path: "base_python".into(),
            old: Some(value),
            new: None,
        };
        let said = change.describe();
        assert!(said.starts_with("input base_python changed: "), "{said}");
        assert!(
            said.ends_with("... -> absent") || said.ends_with("\" -> absent"),
            "{said}"
        );
    }
}
