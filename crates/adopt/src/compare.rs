//! An existing environment against the lock and the compatibility rules: what it has,
//! what the stack wants, and what adopting it would change.

use std::str::FromStr;

use commstack_stack::lock::Resolved;
use commstack_stack::rules::{Facts, Status, check_resolved};
use commstack_stack::{Lock, Pin, Stack};
use pep440_rs::Version;
use serde::Serialize;

use commstack_deepep::python::{PythonEnv, normalize};
use commstack_deepep::venv::LockedWheel;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// As the stack wants it.
    Ok,
    /// Differs, and the stack accepts it (e.g. the same torch release from another index).
    Info,
    /// Adopting changes it (the drop-in NVSHMEM, DeepEP).
    Change,
    /// Differs in a way the stack cannot work with; adopting would not fix it.
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub what: String,
    pub env: String,
    pub stack: String,
    pub severity: Severity,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleLine {
    pub id: String,
    pub status: String,
    pub detail: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub python: String,
    pub site_packages: String,
    pub rows: Vec<Row>,
    /// The lock's other packages that the environment has at the locked version.
    pub others_same: usize,
    /// The lock's other packages that differ (adopting leaves them alone).
    pub others_differ: Vec<Row>,
    pub rules: Vec<RuleLine>,
}

impl Comparison {
    pub fn worst(&self) -> Severity {
        self.rows
            .iter()
            .chain(&self.others_differ)
            .map(|r| r.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }

    pub fn errors(&self) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.severity == Severity::Error)
            .collect()
    }

    /// A table for people.
    pub fn render(&self) -> String {
        let mut out = format!(
            "environment: {} (site-packages {})\n",
            self.python, self.site_packages
        );
        let w = self
            .rows
            .iter()
            .map(|r| r.what.len())
            .max()
            .unwrap_or(8)
            .max(8);
        let we = self
            .rows
            .iter()
            .map(|r| r.env.len())
            .max()
            .unwrap_or(8)
            .max(11);
        let ws = self
            .rows
            .iter()
            .map(|r| r.stack.len())
            .max()
            .unwrap_or(8)
            .max(5);
        out.push_str(&format!(
            "  {:<w$}  {:<we$}  {:<ws$}  {}\n",
            "", "environment", "stack", "verdict"
        ));
        for r in self.rows.iter().chain(&self.others_differ) {
            let verdict = match r.severity {
                Severity::Ok => "ok",
                Severity::Info => "differs (accepted)",
                Severity::Change => "WILL CHANGE",
                Severity::Error => "MISMATCH",
            };
            out.push_str(&format!(
                "  {:<w$}  {:<we$}  {:<ws$}  {verdict}",
                r.what, r.env, r.stack
            ));
            if !r.note.is_empty() {
                out.push_str(&format!(": {}", r.note));
            }
            out.push('\n');
        }
        out.push_str(&format!(
            "  ({} other locked package(s) at the locked version)\n",
            self.others_same
        ));
        for r in &self.rules {
            if r.status != "ok" && r.status != "not-applicable" {
                out.push_str(&format!("  rule {}: {}: {}\n", r.id, r.status, r.detail));
            }
        }
        out
    }
}

/// The stack's own builds, when known.
#[derive(Clone, Debug, Default)]
pub struct Ours<'a> {
    pub dropin: Option<&'a LockedWheel>,
    /// The stack's NCCL built from source (`[nccl] from-source`), which replaces the
    /// environment's.
    pub nccl: Option<&'a LockedWheel>,
    pub deepep: Option<&'a LockedWheel>,
    /// The NVSHMEM version the stack built.
    pub nvshmem_version: Option<&'a str>,
    /// Whether the DeepEP source has the RDC fix (from its build report).
    pub rdc_fix: Option<bool>,
}

fn parse(v: &str) -> Option<Version> {
    Version::from_str(v).ok()
}

fn same_release(a: &str, b: &str) -> Option<bool> {
    Some(parse(a)?.release() == parse(b)?.release())
}

/// Compare `env` with `lock` (and `stack`'s rules, given the environment's facts).
pub fn compare(env: &PythonEnv, lock: &Lock, stack: Option<&Stack>, ours: &Ours<'_>) -> Comparison {
    let r = &lock.resolved;
    let mut rows = vec![
        python_row(env, r),
        torch_row(env, r),
        cuda_row(env, r),
        nccl_row(env, &r.nccl, ours.nccl),
    ];
    rows.extend(
        r.nvshmem_pin
            .as_ref()
            .map(|pin| nvshmem_row(env, pin, ours)),
    );
    rows.push(deepep_row(env, r, ours));
    let (others_same, others_differ) = other_packages(env, lock, &rows);
    let rules = match stack {
        Some(stack) => check_rules(env, stack, ours, &mut rows),
        None => Vec::new(),
    };
    Comparison {
        python: env.python.display().to_string(),
        site_packages: env.site_packages().display().to_string(),
        rows,
        others_same,
        others_differ,
        rules,
    }
}

/// The interpreter: the stack's wheels are built for one CPython.
fn python_row(env: &PythonEnv, r: &Resolved) -> Row {
    let want_tag = &r.python_tag;
    Row {
        what: "python".into(),
        env: env.version.clone(),
        stack: want_tag.clone(),
        severity: if env.python_tag() == *want_tag {
            Severity::Ok
        } else {
            Severity::Error
        },
        note: if env.python_tag() == *want_tag {
            String::new()
        } else {
            format!(
                "the stack's wheels are built for {want_tag}; this interpreter is {}",
                env.python_tag()
            )
        },
    }
}

/// torch: the locked version, or the same release from another index.
fn torch_row(env: &PythonEnv, r: &Resolved) -> Row {
    let torch = env.torch_version().unwrap_or("absent").to_string();
    let (sev, note) = match (torch.as_str(), same_release(&torch, &r.torch)) {
        ("absent", _) => (
            Severity::Error,
            "no torch in this environment: adopt needs the torch the stack is built for"
                .to_string(),
        ),
        (t, _) if parse(t) == parse(&r.torch) => (Severity::Ok, String::new()),
        (t, Some(true)) => (
            Severity::Info,
            format!(
                "same release; local label {} (another index's build of it)",
                t.split_once('+').map(|x| x.1).unwrap_or("-")
            ),
        ),
        _ => (
            Severity::Error,
            format!(
                "DeepEP is built against torch {}'s headers and ABI",
                r.torch
            ),
        ),
    };
    Row {
        what: "torch".into(),
        env: torch,
        stack: r.torch.clone(),
        severity: sev,
        note,
    }
}

/// The CUDA torch is built for: major and minor must be the stack's.
fn cuda_row(env: &PythonEnv, r: &Resolved) -> Row {
    let cuda = env.torch_cuda().unwrap_or("none").to_string();
    let cuda_ok = parse(&cuda)
        .zip(parse(&r.cuda))
        .is_some_and(|(a, b)| a.release().get(..2) == b.release().get(..2));
    Row {
        what: "torch.version.cuda".into(),
        env: cuda.clone(),
        stack: r.cuda.clone(),
        severity: if cuda_ok {
            Severity::Ok
        } else {
            Severity::Error
        },
        note: if cuda_ok {
            String::new()
        } else {
            "torch's CUDA must be the stack's (nvcc, NVSHMEM and DeepEP use it)".into()
        },
    }
}

/// NCCL: the lock's (torch's pin, or `[nccl] version`); where the stack builds it from
/// source, its drop-in replaces the environment's.
fn nccl_row(env: &PythonEnv, nccl: &Pin, ours: Option<&LockedWheel>) -> Row {
    let want = nccl.version.to_string();
    let have = env.dist(&nccl.name).map(|d| d.version.clone());
    let have_v = have.as_deref().and_then(parse);
    let ours_v = ours.and_then(|w| parse(&w.version));
    let (severity, note, stack) = match ours {
        Some(w) if have_v.is_some() && have_v == ours_v => (
            Severity::Ok,
            "the stack's NCCL (built from source) is installed".to_string(),
            w.version.clone(),
        ),
        Some(w) if ours_v.as_ref().map(|v| v.release()) == Some(nccl.version.release()) => (
            Severity::Change,
            format!(
                "replaced by the stack's NCCL {want}, built from source ([nccl] from-source): one libnccl.so.2"
            ),
            w.version.clone(),
        ),
        Some(w) => (
            Severity::Error,
            format!(
                "the wheelhouse's NCCL {} is not the lock's {want}: run `cargo xtask build deepep --python {}` again",
                w.version,
                env.python.display()
            ),
            want.clone(),
        ),
        None if have_v.as_ref() == Some(&nccl.version) => {
            (Severity::Ok, String::new(), want.clone())
        }
        None => (
            Severity::Error,
            format!(
                "the runtime check requires ncclGetVersion == {want}; adopt changes NCCL only for a stack that builds it ([nccl] from-source = true)"
            ),
            want.clone(),
        ),
    };
    Row {
        what: nccl.name.clone(),
        env: have.unwrap_or_else(|| "absent".into()),
        stack,
        severity,
        note,
    }
}

/// NVSHMEM: replaced by the drop-in.
fn nvshmem_row(env: &PythonEnv, pin: &Pin, ours: &Ours<'_>) -> Row {
    let have = env.dist(&pin.name).map(|d| d.version.clone());
    let stack_v = ours
        .dropin
        .map(|d| d.version.clone())
        .unwrap_or_else(|| format!("{}+commstack.* (drop-in)", pin.version));
    let (sev, note) = match (&have, ours.dropin) {
        (Some(h), Some(d)) if parse(h) == parse(&d.version) => (Severity::Ok, "the stack's drop-in is installed".to_string()),
        (Some(h), _) if !h.contains("+commstack") => (
            Severity::Change,
            "NVIDIA's wheel (NVSHMEM_USE_NCCL=ON; torch maps it first): replaced by the stack's drop-in".into(),
        ),
        (Some(_), _) => (Severity::Change, "another commstack build: replaced by this stack's drop-in".into()),
        (None, _) => (Severity::Change, "absent: the drop-in is installed".into()),
    };
    Row {
        what: pin.name.clone(),
        env: have.unwrap_or_else(|| "absent".into()),
        stack: stack_v,
        severity: sev,
        note,
    }
}

/// DeepEP: the stack's build, when there is one.
fn deepep_row(env: &PythonEnv, r: &Resolved, ours: &Ours<'_>) -> Row {
    let have = env.dist("deep-ep").map(|d| d.version.clone());
    let want = ours.deepep.map(|d| d.version.clone()).unwrap_or_else(|| {
        format!(
            "{} ({})",
            r.deepep_rev.get(..7).unwrap_or(""),
            r.deepep_api.as_str()
        )
    });
    let (sev, note) = match (&have, ours.deepep) {
        (Some(h), Some(d)) if parse(h) == parse(&d.version) && deepep_record_matches(env, d) => {
            (Severity::Ok, "the stack's build is installed".to_string())
        }
        (Some(_), Some(_)) => (
            Severity::Change,
            "another build: replaced by the stack's".into(),
        ),
        (None, Some(_)) => (Severity::Change, "installed from the stack's build".into()),
        (_, None) => (
            Severity::Change,
            "not built yet: run `cargo xtask build deepep --python <this python>`".into(),
        ),
    };
    Row {
        what: "deep-ep".into(),
        env: have.unwrap_or_else(|| "absent".into()),
        stack: want,
        severity: sev,
        note,
    }
}

/// The lock's packages that `rows` does not cover: reported, never changed. Returns how
/// many are at the locked version and a row for each of the others.
fn other_packages(env: &PythonEnv, lock: &Lock, rows: &[Row]) -> (usize, Vec<Row>) {
    let mut others_same = 0;
    let mut others_differ = Vec::new();
    let named: Vec<String> = rows.iter().map(|r| normalize(&r.what)).collect();
    for w in &lock.packages {
        let n = normalize(&w.name);
        if named.contains(&n) || w.replaced_by.is_some() {
            continue;
        }
        match env.dist(&n) {
            Some(d) if parse(&d.version) == parse(&w.version) => others_same += 1,
            Some(d) => others_differ.push(Row {
                what: n,
                env: d.version.clone(),
                stack: w.version.clone(),
                severity: Severity::Info,
                note: String::new(),
            }),
            None => others_differ.push(Row {
                what: n,
                env: "absent".into(),
                stack: w.version.clone(),
                severity: Severity::Info,
                note: String::new(),
            }),
        }
    }
    (others_same, others_differ)
}

/// The stack's rules against the environment's facts; each violation also becomes an
/// error row.
fn check_rules(
    env: &PythonEnv,
    stack: &Stack,
    ours: &Ours<'_>,
    rows: &mut Vec<Row>,
) -> Vec<RuleLine> {
    let torch_nccl = env.torch_pin("nvidia-nccl-cu");
    // The NCCL the environment will hold: the stack's drop-in where it builds one
    // (adopt installs it), else the installed wheel of torch's NCCL name.
    let nccl = torch_nccl.as_ref().and_then(|pin| {
        let version = match ours.nccl {
            Some(w) => w.version.clone(),
            None => env.dist(&pin.name)?.version.clone(),
        };
        Some(Pin::new(pin.name.clone(), parse(&version)?))
    });
    let facts = Facts {
        torch_cuda: env.torch_cuda().and_then(parse),
        torch_nccl,
        nccl,
        nccl_wheel_libs: None,
        torch_nvshmem: env.torch_pin("nvidia-nvshmem-cu"),
        nvshmem_build: ours.nvshmem_version.and_then(parse),
        deepep_rdc_fix: ours.rdc_fix,
    };
    let outcomes = check_resolved(stack, &facts);
    for o in &outcomes {
        if o.status == Status::Violated {
            rows.push(Row {
                what: format!("rule {}", o.rule.as_str()),
                env: "violated".into(),
                stack: "ok".into(),
                severity: Severity::Error,
                note: o.detail.clone(),
            });
        }
    }
    outcomes
        .iter()
        .map(|o| RuleLine {
            id: o.rule.as_str().into(),
            status: serde_json::to_value(&o.status)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            detail: o.detail.clone(),
        })
        .collect()
}

/// Whether the installed deep-ep's RECORD lists the same files and hashes as the wheel's.
fn deepep_record_matches(env: &PythonEnv, wheel: &LockedWheel) -> bool {
    let Some(info) = env.dist("deep-ep").and_then(|d| d.dist_info.clone()) else {
        return false;
    };
    let Ok(installed) = std::fs::read(info.join("RECORD")) else {
        return false;
    };
    let Ok(w) = commstack_wheel::Wheel::open(&wheel.path) else {
        return false;
    };
    let Ok(installed) = commstack_wheel::parse_record(&installed) else {
        return false;
    };
    let key = |e: &commstack_wheel::RecordEntry| (e.path.clone(), e.hash.clone());
    let mut a: Vec<_> = installed
        .iter()
        .filter(|e| !e.path.ends_with("/INSTALLER") && !e.path.ends_with("/RECORD"))
        .map(key)
        .collect();
    let mut b: Vec<_> = w
        .record
        .iter()
        .filter(|e| !e.path.ends_with("/RECORD"))
        .map(key)
        .collect();
    a.sort();
    b.sort();
    a == b
}
