//! What each step of a stack was last built from, so that a plan can name the input that
//! changed: `<home>/pipeline/<stack-id>/inputs.json`, rewritten (atomically) after every
//! step that runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::Serialize;

use crate::step::StepId;

/// One input that differs from the step's last run: its path in the inputs (`options.
/// switches.ibgda`, `after.nvshmem`) and both values.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Change {
    pub path: String,
    pub old: Option<serde_json::Value>,
    pub new: Option<serde_json::Value>,
}

impl Change {
    /// `source.rev: "567632dd5981" -> "0f5f3b2a1c3e"` (long strings shortened).
    pub fn describe(&self) -> String {
        let show = |v: &Option<serde_json::Value>| match v {
            None => "absent".to_string(),
            // Cut by characters: paths and messages need not be ASCII.
            Some(serde_json::Value::String(s)) if s.chars().count() > 24 => {
                format!("{:?}", s.chars().take(12).collect::<String>())
            }
            Some(v) => {
                let text = v.to_string();
                match text.chars().count() > 60 {
                    true => format!("{}...", text.chars().take(57).collect::<String>()),
                    false => text,
                }
            }
        };
        match self.path.strip_prefix("after.") {
            Some(step) => format!("{step}'s output changed"),
            None => format!(
                "input {} changed: {} -> {}",
                self.path,
                show(&self.old),
                show(&self.new)
            ),
        }
    }
}

pub struct Record {
    path: PathBuf,
    steps: Mutex<BTreeMap<String, serde_json::Value>>,
}

impl Record {
    /// The record at `path` (empty when the file does not exist yet).
    pub fn open(path: PathBuf) -> Result<Record> {
        let steps = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).with_context(|| {
                format!(
                    "{}: not a record of step inputs (delete it: it is rebuilt)",
                    path.display()
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(Record {
            path,
            steps: Mutex::new(steps),
        })
    }

    pub fn has<S: StepId>(&self, step: S) -> bool {
        self.steps
            .lock()
            .expect("record lock")
            .contains_key(step.name())
    }

    /// The inputs that differ from the step's last recorded run (none when never run).
    pub fn changes<S: StepId>(&self, step: S, inputs: &serde_json::Value) -> Vec<Change> {
        let steps = self.steps.lock().expect("record lock");
        let mut out = Vec::new();
        if let Some(old) = steps.get(step.name()) {
            diff("", old, inputs, &mut out);
        }
        out
    }

    /// Records the inputs a step was just built from.
    pub fn set<S: StepId>(&self, step: S, inputs: &serde_json::Value) -> Result<()> {
        let mut steps = self.steps.lock().expect("record lock");
        steps.insert(step.name().to_string(), inputs.clone());
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(&*steps)?;
        commstack_store::write_all_atomically(&[(&self.path, &text)])
    }
}

/// Every leaf where `old` and `new` differ; arrays compare whole (an arch list is one input).
fn diff(path: &str, old: &serde_json::Value, new: &serde_json::Value, out: &mut Vec<Change>) {
    use serde_json::Value::Object;
    let join = |k: &str| match path.is_empty() {
        true => k.to_string(),
        false => format!("{path}.{k}"),
    };
    match (old, new) {
        (Object(a), Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff(&join(k), x, y, out),
                    (x, y) => out.push(Change {
                        path: join(k),
                        old: x.cloned(),
                        new: y.cloned(),
                    }),
                }
            }
        }
        (a, b) if a != b => out.push(Change {
            path: path.to_string(),
            old: Some(a.clone()),
            new: Some(b.clone()),
        }),
        _ => {}
    }
}
