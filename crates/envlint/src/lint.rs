//! The checks: every setting of NVSHMEM's, NCCL's, DeepEP's (and UCX's) namespaces is
//! looked up in the catalog of this build, and its value read as its library reads it.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::catalog::{Catalog, Status};
use crate::input::{Place, Setting};
use crate::known::{self, Owner};
use crate::value;

/// What is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// No library of the stack reads this name.
    Unknown,
    /// A build-time option set at run time: it does nothing.
    BuildTime,
    /// A variable of a transport or option this NVSHMEM was built without.
    NotBuilt,
    /// The value does not read as the variable's type or values.
    Type,
    /// Set twice in one container or file: the later one wins.
    Duplicate,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Unknown => "unknown",
            Rule::BuildTime => "build-time",
            Rule::NotBuilt => "not-built",
            Rule::Type => "type",
            Rule::Duplicate => "duplicate",
        }
    }
}

/// One problem, with its place and the fix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub rule: Rule,
    pub name: String,
    pub value: Option<String>,
    pub place: Place,
    pub message: String,
    pub fix: String,
}

/// Names outside the judged prefixes are reported only this close to a known one.
const NEAR_MISS: usize = 2;

fn judged(name: &str) -> bool {
    known::PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Every finding of `settings`, in their order.
pub fn lint(catalog: &Catalog, settings: &[Setting]) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut seen: BTreeMap<(&str, &str), &Setting> = BTreeMap::new();
    for s in settings {
        if let Some(first) = seen.insert((s.scope.as_str(), s.name.as_str()), s) {
            out.push(finding(
                Rule::Duplicate,
                s,
                format!(
                    "{} is set twice here (first at {}); the later value wins",
                    s.name, first.place
                ),
                "keep one".into(),
            ));
        }
        out.extend(one(catalog, s));
    }
    out
}

fn finding(rule: Rule, s: &Setting, message: String, fix: String) -> Finding {
    Finding {
        rule,
        name: s.name.clone(),
        value: s.value.clone(),
        place: s.place.clone(),
        message,
        fix,
    }
}

fn rebuild_hint(key: &str, on: bool) -> String {
    format!(
        "set `{key} = {on}` in stack.toml's [nvshmem], then `cargo xtask lock` and `cargo xtask build` make an NVSHMEM with it; or remove the variable"
    )
}

fn one(catalog: &Catalog, s: &Setting) -> Option<Finding> {
    match catalog.status(&s.name) {
        Status::Known(var) => {
            let text = s.value.as_deref()?;
            if let Some(f) = selector(catalog, s, text) {
                return Some(f);
            }
            let p = value::check(var.reader, &var.allowed, text)?;
            Some(finding(
                Rule::Type,
                s,
                format!(
                    "{}={text:?}: {} ({} {})",
                    s.name,
                    p.message,
                    var.owner.as_str(),
                    var.source
                ),
                p.fix,
            ))
        }
        Status::Unbuilt { def, needs } => {
            let options: Vec<&str> = needs.iter().map(|(m, _)| m.as_str()).collect();
            let fix = match needs.iter().find_map(|(_, key)| *key) {
                Some(key) => rebuild_hint(key, true),
                None => "remove it: commstack's recipe never builds that option".into(),
            };
            Some(finding(
                Rule::NotBuilt,
                s,
                format!(
                    "{} exists only in an NVSHMEM built with {} ({}:{}); this stack's NVSHMEM is built without it, so nothing reads it",
                    s.name,
                    options.join(" or "),
                    def.file,
                    def.line
                ),
                fix,
            ))
        }
        Status::TransportNotBuilt { key, reader } => Some(finding(
            Rule::NotBuilt,
            s,
            format!(
                "{} is read by {reader}; this stack's NVSHMEM is built without it ({key} = false), so nothing reads it",
                s.name
            ),
            rebuild_hint(key, true),
        )),
        Status::BuildTime { what, switch } => {
            let state = match switch {
                Some((key, on)) => format!(
                    "; this stack's NVSHMEM is built with it {} (stack.toml [nvshmem] {key} = {on})",
                    if on { "ON" } else { "OFF" }
                ),
                None => String::new(),
            };
            let fix = match switch {
                Some((key, on)) => format!(
                    "remove it; to change the build, set `{key} = {}` in [nvshmem] and build again",
                    !on
                ),
                None => "remove it: it only matters while building".into(),
            };
            Some(finding(
                Rule::BuildTime,
                s,
                format!(
                    "{} is {what}: read while compiling, not at run time, so setting it here changes nothing{state}",
                    s.name
                ),
                fix,
            ))
        }
        Status::Unknown => unknown(catalog, s),
    }
}

/// A run-time choice (`NVSHMEM_REMOTE_TRANSPORT=ucx`) naming a transport not built.
fn selector(catalog: &Catalog, s: &Setting, text: &str) -> Option<Finding> {
    let (_, value, key) = known::SELECTORS
        .iter()
        .find(|(var, value, _)| *var == s.name && value.eq_ignore_ascii_case(text.trim()))?;
    if catalog.transport_on(key) {
        return None;
    }
    Some(finding(
        Rule::NotBuilt,
        s,
        format!(
            "{}={text:?} chooses {value}, which this stack's NVSHMEM is built without ({key} = false): NVSHMEM fails to load it",
            s.name
        ),
        rebuild_hint(key, true),
    ))
}

fn unknown(catalog: &Catalog, s: &Setting) -> Option<Finding> {
    // A transport's own family (UCX_*) when that transport is built: its library's names
    // are not in our tables.
    if known::TRANSPORT_VARIABLES
        .iter()
        .any(|(p, key, _)| p.ends_with('_') && s.name.starts_with(p) && catalog.transport_on(key))
    {
        return None;
    }
    let nearest = catalog.nearest(&s.name);
    if !judged(&s.name) {
        // Outside the stack's namespaces only a near miss of a known name is reported.
        let (near, d) = nearest?;
        if d > NEAR_MISS || s.name.len() < 8 {
            return None;
        }
        return Some(finding(
            Rule::Unknown,
            s,
            format!(
                "{} is not a variable of NVSHMEM, NCCL or DeepEP, but is {d} edit(s) from {near}",
                s.name
            ),
            format!("did you mean {near}?"),
        ));
    }
    let owner = if s.name.starts_with("NVSHMEM_") {
        format!(
            "NVSHMEM (the variables of its source, {})",
            catalog.nvshmem_origin
        )
    } else if s.name.starts_with("NCCL_") {
        format!("NCCL {}", known::NCCL_TABLE_VERSION)
    } else if s.name.starts_with("EP_") {
        "DeepEP".to_string()
    } else {
        Owner::Nvshmem.as_str().to_string()
    };
    let (message_tail, fix) = match nearest {
        Some((near, _)) => (
            format!("; the nearest known name is {near}"),
            format!("did you mean {near}?"),
        ),
        None => (String::new(), "remove it".to_string()),
    };
    Some(finding(
        Rule::Unknown,
        s,
        format!(
            "{} is not a variable of {owner}: nothing reads it{message_tail}",
            s.name
        ),
        fix,
    ))
}
