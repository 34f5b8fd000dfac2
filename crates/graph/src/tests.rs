//! The engine over a toy graph of its own, with a real store in a temporary directory:
//! `prepare` (outside the store) -> `compile` -> `link` -> `bundle`, then `check` (keyed)
//! and `ship` (outside the store), which read `bundle` and may run at the same time.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Result, bail};
use commstack_store::{StepKey, Store};
use serde::Serialize;

use crate::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Toy {
    Prepare,
    Compile,
    Link,
    Bundle,
    Check,
    Ship,
}

impl std::fmt::Display for Toy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl StepId for Toy {
    const ALL: &'static [Toy] = &[
        Toy::Prepare,
        Toy::Compile,
        Toy::Link,
        Toy::Bundle,
        Toy::Check,
        Toy::Ship,
    ];
    const STORE_PREFIX: &'static str = "toy";

    fn name(self) -> &'static str {
        match self {
            Toy::Prepare => "prepare",
            Toy::Compile => "compile",
            Toy::Link => "link",
            Toy::Bundle => "bundle",
            Toy::Check => "check",
            Toy::Ship => "ship",
        }
    }

    fn deps(self) -> &'static [Toy] {
        match self {
            Toy::Prepare => &[],
            Toy::Compile => &[Toy::Prepare],
            Toy::Link => &[Toy::Compile],
            Toy::Bundle => &[Toy::Link],
            Toy::Check | Toy::Ship => &[Toy::Bundle],
        }
    }

    fn keyed(self) -> bool {
        !matches!(self, Toy::Prepare | Toy::Ship)
    }

    fn runs_beside_others(self) -> bool {
        matches!(self, Toy::Check | Toy::Ship)
    }
}

/// Recipes: each keyed step writes a file of its input `value` and the outputs it reads;
/// `check` and `ship` meet (each waits for the other's hello) to prove they overlap.
struct ToySteps {
    value: String,
    ran: Mutex<Vec<Toy>>,
    hello: Mutex<BTreeMap<Toy, mpsc::Sender<()>>>,
    heard: Mutex<BTreeMap<Toy, mpsc::Receiver<()>>>,
    shipped_marker: PathBuf,
}

impl ToySteps {
    fn new(value: &str, dir: &std::path::Path) -> ToySteps {
        let (to_check, check_hears) = mpsc::channel();
        let (to_ship, ship_hears) = mpsc::channel();
        ToySteps {
            value: value.into(),
            ran: Mutex::default(),
            hello: Mutex::new(BTreeMap::from([
                (Toy::Check, to_ship),
                (Toy::Ship, to_check),
            ])),
            heard: Mutex::new(BTreeMap::from([
                (Toy::Check, check_hears),
                (Toy::Ship, ship_hears),
            ])),
            shipped_marker: dir.join("shipped"),
        }
    }

    fn ran(&self) -> Vec<Toy> {
        self.ran.lock().unwrap().clone()
    }
}

impl Steps<Toy> for ToySteps {
    fn skipped(&self, _: Toy) -> Option<String> {
        None
    }

    fn inputs(&self, step: Toy) -> Result<serde_json::Value> {
        Ok(match step {
            Toy::Compile => serde_json::json!({ "value": self.value }),
            _ => serde_json::json!({}),
        })
    }

    fn pending(&self, step: Toy, _: &Done<Toy>) -> Result<Option<String>> {
        Ok(match step {
            Toy::Ship => (!self.shipped_marker.exists()).then(|| "not shipped".into()),
            _ => None,
        })
    }

    fn run(&self, step: Toy, done: &Done<Toy>, say: &dyn Fn(&str)) -> Result<StepResult> {
        self.ran.lock().unwrap().push(step);
        say(&format!("running {step}"));
        if step.runs_beside_others() {
            let hello = self.hello.lock().unwrap().remove(&step).unwrap();
            let heard = self.heard.lock().unwrap().remove(&step).unwrap();
            hello.send(()).unwrap();
            if heard.recv_timeout(Duration::from_secs(20)).is_err() {
                bail!("{step} ran alone: the other step never started beside it");
            }
        }
        if step == Toy::Ship {
            std::fs::write(&self.shipped_marker, "")?;
        }
        if !step.keyed() {
            return Ok(StepResult::default());
        }
        let mut text = format!("{step}:{}", self.value);
        for d in step.deps() {
            if let Some(out) = done.get(d).and_then(|r| r.output.as_ref()) {
                text.push_str(&std::fs::read_to_string(out)?);
            }
        }
        let file = std::env::temp_dir().join(format!(
            "commstack-graph-toy-{}-{}",
            std::process::id(),
            commstack_digest::sha256_hex(text.as_bytes())
        ));
        std::fs::write(&file, text)?;
        Ok(StepResult {
            output: Some(file),
            facts: serde_json::json!({ "step": step.name() }),
        })
    }

    fn shipped(&self, _: Toy, result: &StepResult) -> Option<PathBuf> {
        result.output.clone()
    }
}

/// A cache that has `compile` and `link` under any key, and says what it was asked;
/// `unsigned`: what it gives entered without a trusted signature.
struct ToyCache {
    asked: Mutex<BTreeSet<Toy>>,
    has: BTreeSet<Toy>,
    unsigned: bool,
}

impl Substitute<Toy> for ToyCache {
    fn source(&self) -> String {
        "toy-cache".into()
    }

    fn decide(&self, step: Toy, _: &StepKey) -> Result<Decision> {
        self.asked.lock().unwrap().insert(step);
        Ok(match self.has.contains(&step) {
            true => Decision::Pull {
                from: format!("toy-cache:{step}"),
            },
            false => Decision::Build {
                why: Some("not in the binary cache toy-cache: built here".into()),
            },
        })
    }

    fn pull(&self, _: &Store, step: Toy, _: &StepKey, say: &dyn Fn(&str)) -> Result<Pulled> {
        say("pulled");
        let file = std::env::temp_dir().join(format!(
            "commstack-graph-toy-pulled-{}-{step}",
            std::process::id()
        ));
        std::fs::write(&file, format!("pulled {step}"))?;
        Ok(Pulled {
            stored: StoredResult {
                result: StepResult {
                    output: Some(file),
                    facts: serde_json::Value::Null,
                },
                shipped: None,
            },
            unsigned: self
                .unsigned
                .then(|| "signed by no trusted key".to_string()),
        })
    }
}

struct Home {
    dir: tempfile::TempDir,
    store: Store,
    record: Record,
}

fn home() -> Home {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    let record = Record::open(dir.path().join("inputs.json")).unwrap();
    Home { dir, store, record }
}

fn engine<'a>(h: &'a Home, cache: Option<&'a dyn Substitute<Toy>>) -> Engine<'a, Toy> {
    Engine {
        store: &h.store,
        record: &h.record,
        log_dir: h.dir.path().join("logs"),
        quiet: true,
        force: false,
        until_command: "toy build --until".into(),
        substitute: cache,
        allow_unsigned: false,
        unsigned_help: "allow it, or remove it".into(),
    }
}

fn statuses(plan: &Plan<Toy>) -> Vec<(Toy, &'static str)> {
    plan.steps
        .iter()
        .map(|p| {
            let s = match p.status {
                Status::Reused => "reused",
                Status::Run { .. } => "run",
                Status::Skipped { .. } => "skipped",
                Status::Substitute { .. } => "substitute",
            };
            (p.step, s)
        })
        .collect()
}

fn reason(plan: &Plan<Toy>, step: Toy) -> String {
    match &plan.steps.iter().find(|p| p.step == step).unwrap().status {
        Status::Run { reason, .. } => reason.clone(),
        other => panic!("{step} does not run: {other:?}"),
    }
}

#[test]
fn a_second_plan_reuses_every_step_and_a_changed_input_reruns_what_follows_it() {
    let h = home();
    let steps = ToySteps::new("one", h.dir.path());
    let e = engine(&h, None);
    let plan = e.plan(&steps, Selection::All).unwrap();
    assert!(reason(&plan, Toy::Compile).contains("not built yet"));
    let report = e.run(&steps, plan).unwrap();
    assert!(report.failed.is_none(), "{:?}", report.failed);
    assert_eq!(
        steps.ran().len(),
        5,
        "prepare is done already: {:?}",
        steps.ran()
    );

    let again = ToySteps::new("one", h.dir.path());
    let plan = e.plan(&again, Selection::All).unwrap();
    assert!(
        statuses(&plan).iter().all(|(_, s)| *s == "reused"),
        "{:?}",
        statuses(&plan)
    );

    let changed = ToySteps::new("two", h.dir.path());
    let plan = e.plan(&changed, Selection::All).unwrap();
    assert_eq!(
        reason(&plan, Toy::Compile),
        "input value changed: \"one\" -> \"two\""
    );
    assert_eq!(reason(&plan, Toy::Link), "after compile");
    assert_eq!(reason(&plan, Toy::Ship), "after bundle");
}

#[test]
fn check_and_ship_run_at_the_same_time() {
    let h = home();
    let steps = ToySteps::new("one", h.dir.path());
    let e = engine(&h, None);
    let report = e
        .run(&steps, e.plan(&steps, Selection::All).unwrap())
        .unwrap();
    // Each waits for the other's hello: run one after the other, both would fail.
    assert!(report.failed.is_none(), "{:?}", report.failed.map(|f| f.1));
    let outcomes: Vec<_> = report.rows.iter().map(|r| (r.step, r.outcome)).collect();
    assert!(outcomes.contains(&(Toy::Check, "built")) && outcomes.contains(&(Toy::Ship, "built")));
    // The rows carry when each ran: in graph order one after the other, check and ship
    // beside each other, each naming the other.
    let at = |s: Toy| report.rows.iter().find(|r| r.step == s).unwrap();
    for r in &report.rows {
        assert!(r.start <= r.end && r.wait >= 0.0, "{r:?}");
        assert!((r.end - r.start - r.seconds).abs() < 1e-6, "{r:?}");
    }
    for (before, after) in [(Toy::Compile, Toy::Link), (Toy::Link, Toy::Bundle)] {
        assert!(
            at(before).end <= at(after).start,
            "{:?} {:?}",
            at(before),
            at(after)
        );
    }
    let (check, ship) = (at(Toy::Check), at(Toy::Ship));
    assert_eq!(
        (check.beside, ship.beside),
        (Some(Toy::Ship), Some(Toy::Check))
    );
    assert!(
        check.start < ship.end && ship.start < check.end,
        "{check:?} {ship:?}"
    );
    assert!(at(Toy::Link).beside.is_none());
    let json = serde_json::to_value(check).unwrap();
    assert_eq!(json["beside"], "ship");
    assert!(json["start"].is_f64() && json["end"].is_f64() && json["wait"].is_f64());
}

#[test]
fn a_step_waits_from_when_the_steps_it_reads_ended_to_its_start() {
    let h = home();
    let steps = ToySteps::new("one", h.dir.path());
    let e = engine(&h, None);
    let plan = e.plan(&steps, Selection::All).unwrap();
    let p = |s: Toy| plan.steps.iter().find(|p| p.step == s).unwrap();
    let mut clock = crate::run::Clock::default();
    let row = |s: Toy| crate::run::row(p(s), "built", 0.0, None, None);
    let prepare = clock.passed(row(Toy::Prepare), 0.5);
    assert_eq!((prepare.start, prepare.end, prepare.wait), (0.5, 0.5, 0.0));
    // compile reads prepare (ended at 0.5) and started at 2.0: it waited 1.5 s.
    let compile = clock.made(row(Toy::Compile), (2.0, 10.0), None);
    assert_eq!((compile.start, compile.end, compile.wait), (2.0, 10.0, 1.5));
    let link = clock.made(row(Toy::Link), (10.0, 12.0), None);
    assert_eq!(link.wait, 0.0);
    // bundle's clock is not behind link's end: a wait is never negative.
    let bundle = clock.made(row(Toy::Bundle), (11.0, 13.0), Some(Toy::Ship));
    assert_eq!((bundle.wait, bundle.beside), (0.0, Some(Toy::Ship)));
}

#[test]
fn only_a_step_whose_inputs_are_not_done_names_the_command_that_makes_them() {
    let h = home();
    let steps = ToySteps::new("one", h.dir.path());
    let e = engine(&h, None);
    let plan = e.plan(&steps, Selection::Only(Toy::Link)).unwrap();
    let err = e.run(&steps, plan).err().expect("compile is not done");
    assert_eq!(
        err.to_string(),
        "--only link: it needs compile, which is not done (not built yet): run `toy build --until compile` (with the same settings) first"
    );
}

#[test]
fn the_cache_is_asked_only_for_what_is_needed_and_its_steps_are_pulled() {
    let h = home();
    let cache = ToyCache {
        asked: Mutex::default(),
        has: BTreeSet::from([Toy::Compile, Toy::Link]),
        unsigned: false,
    };
    let steps = ToySteps::new("one", h.dir.path());
    let e = engine(&h, Some(&cache));
    let plan = e.plan(&steps, Selection::Until(Toy::Bundle)).unwrap();
    // bundle runs here and reads link (pulled); compile, read only by link, is not needed.
    assert_eq!(
        statuses(&plan),
        [
            (Toy::Prepare, "reused"),
            (Toy::Compile, "skipped"),
            (Toy::Link, "substitute"),
            (Toy::Bundle, "run"),
        ]
    );
    assert_eq!(
        *cache.asked.lock().unwrap(),
        BTreeSet::from([Toy::Link, Toy::Bundle])
    );
    assert!(
        reason(&plan, Toy::Bundle).ends_with("; not in the binary cache toy-cache: built here")
    );
    let report = e.run(&steps, plan).unwrap();
    assert!(report.failed.is_none());
    assert_eq!(steps.ran(), [Toy::Bundle]);
    let rows: Vec<_> = report.rows.iter().map(|r| (r.step, r.outcome)).collect();
    assert!(rows.contains(&(Toy::Link, "substituted")), "{rows:?}");

    // Everything is in the store now: the cache is not asked again.
    cache.asked.lock().unwrap().clear();
    let plan = e.plan(&steps, Selection::Until(Toy::Bundle)).unwrap();
    assert!(
        cache.asked.lock().unwrap().is_empty(),
        "{:?}",
        statuses(&plan)
    );
}

#[test]
fn an_output_pulled_unsigned_is_marked_and_reused_only_when_allowed() {
    let h = home();
    let cache = ToyCache {
        asked: Mutex::default(),
        has: BTreeSet::from([Toy::Compile, Toy::Link]),
        unsigned: true,
    };
    let steps = ToySteps::new("one", h.dir.path());
    let mut e = engine(&h, Some(&cache));
    e.allow_unsigned = true;
    let report = e
        .run(&steps, e.plan(&steps, Selection::Until(Toy::Link)).unwrap())
        .unwrap();
    let link = report.rows.iter().find(|r| r.step == Toy::Link).unwrap();
    assert_eq!(link.unsigned.as_deref(), Some("signed by no trusted key"));

    // Not allowed: the marked output is not reused; the plan says why and what to do.
    let strict = engine(&h, None);
    let err = strict
        .plan(&steps, Selection::Until(Toy::Link))
        .expect_err("a marked output is refused");
    let err = err.to_string();
    assert!(
        err.contains("entered without a trusted signature (signed by no trusted key)")
            && err.ends_with("allow it, or remove it"),
        "{err}"
    );
    // Allowed: it is reused, and the plan still says so.
    let plan = e.plan(&steps, Selection::Until(Toy::Link)).unwrap();
    let p = plan.steps.iter().find(|p| p.step == Toy::Link).unwrap();
    assert_eq!(p.status, Status::Reused);
    assert_eq!(p.unsigned.as_deref(), Some("signed by no trusted key"));
}

#[test]
fn changes_name_the_leaf_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let record = Record::open(dir.path().join("inputs.json")).unwrap();
    let old = serde_json::json!({"options": {"ibgda": true, "archs": ["90"]}, "after": {"compile": "aa"}});
    assert!(record.changes(Toy::Link, &old).is_empty());
    assert!(!record.has(Toy::Link));
    record.set(Toy::Link, &old).unwrap();
    let new = serde_json::json!({"options": {"ibgda": false, "archs": ["90", "100"]}, "after": {"compile": "bb"}, "extra": 1});
    let reopened = Record::open(dir.path().join("inputs.json")).unwrap();
    let changes: Vec<String> = reopened
        .changes(Toy::Link, &new)
        .iter()
        .map(Change::describe)
        .collect();
    assert_eq!(
        changes,
        [
            "compile's output changed",
            "input extra changed: absent -> 1",
            "input options.archs changed: [\"90\"] -> [\"90\",\"100\"]",
            "input options.ibgda changed: true -> false",
        ]
    );
}

fn plan_of(steps: &[(Toy, Status, bool)]) -> Plan<Toy> {
    Plan {
        steps: steps
            .iter()
            .map(|(step, status, selected)| Planned {
                step: *step,
                key: None,
                status: status.clone(),
                selected: *selected,
                unsigned: None,
                inputs: None,
                store_key: None,
            })
            .collect(),
        done: Done::new(),
        only: None,
    }
}

#[test]
fn substitutes_then_runs_only_when_pulled_and_then_run() {
    let pulled = || Status::Substitute {
        from: "reg/repo:bundle-1@sha256:ab".into(),
    };
    let runs = || Status::Run {
        reason: "not shipped".into(),
        changed: Vec::new(),
    };
    let (bundle, ship) = (Toy::Bundle, Toy::Ship);
    let yes = plan_of(&[(bundle, pulled(), true), (ship, runs(), true)]);
    assert!(yes.substitutes_then_runs(bundle, ship));
    for no in [
        plan_of(&[(bundle, Status::Reused, true), (ship, runs(), true)]),
        plan_of(&[(bundle, runs(), true), (ship, runs(), true)]),
        plan_of(&[(bundle, pulled(), true), (ship, Status::Reused, true)]),
        plan_of(&[(bundle, pulled(), true)]),
        plan_of(&[(bundle, pulled(), false), (ship, runs(), true)]),
        plan_of(&[
            (bundle, pulled(), true),
            (
                ship,
                Status::Skipped {
                    reason: "nowhere".into(),
                },
                true,
            ),
        ]),
    ] {
        assert!(!no.substitutes_then_runs(bundle, ship), "{no:?}");
    }
}
