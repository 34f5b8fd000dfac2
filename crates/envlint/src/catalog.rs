//! Every variable envlint knows for one build: NVSHMEM's from its source (those whose
//! guard this build's options satisfy), its build-time options, NCCL's, DeepEP's, the
//! launchers', and which of them need a transport this NVSHMEM was built without.

use std::collections::{BTreeMap, BTreeSet};

use commstack_stack::manifest::NvshmemTransports;
use commstack_stack::switches::{self, FIXED_OFF, Scope, Switch};

use crate::cpp::{Macros, Truth};
use crate::known::{self, Owner, Reader};
use crate::nvshmem::{EnvDef, NvKind};
use crate::source::NvshmemTables;

/// The NVSHMEM build a catalog is for: which of its CMake options are on.
#[derive(Clone, Debug)]
pub struct Build {
    /// Every switch with its value: the stack's `[nvshmem]` for stack switches, the
    /// recipe's fixed value for the others (crates/stack's switch table).
    pub switches: Vec<(&'static Switch, bool)>,
}

impl Build {
    pub fn from_transports(t: &NvshmemTransports) -> Build {
        Build {
            switches: switches::SWITCHES
                .iter()
                .map(|s| {
                    let on = match s.scope {
                        Scope::Stack => t.get(s.key),
                        Scope::Recipe | Scope::Fixed => s.default,
                    };
                    (s, on)
                })
                .collect(),
        }
    }

    fn on(&self, key: &str) -> bool {
        self.switches.iter().any(|(s, on)| s.key == key && *on)
    }

    fn switch_of_macro(&self, cmake: &str) -> Option<(&'static Switch, bool)> {
        self.switches
            .iter()
            .copied()
            .find(|(s, _)| s.cmake == cmake)
    }

    /// The macros the build's nvshmem_build_options.h defines, and those it is known not
    /// to: the switches, the recipe's always-off options, and the platform's (commstack
    /// targets x86_64 and aarch64, never ppc64le).
    fn macros(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut defined: BTreeSet<String> = ["NVSHMEMI_ENV_DEF".to_string()].into();
        let mut undefined: BTreeSet<String> = ["NVSHMEM_PPC64LE".to_string()].into();
        undefined.extend(FIXED_OFF.iter().map(|s| s.to_string()));
        for (s, on) in &self.switches {
            if *on {
                defined.insert(s.cmake.to_string());
            } else {
                undefined.insert(s.cmake.to_string());
            }
        }
        (defined, undefined)
    }
}

/// A variable that exists and is read in this build.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Var {
    pub name: String,
    pub owner: Owner,
    pub reader: Reader,
    /// Its values, where its documentation lists them.
    pub allowed: Vec<String>,
    /// Where it is defined: `src/include/host/env/env_defs.h:77`, or the table.
    pub source: String,
    /// Set when its guard names a macro this build says nothing about.
    pub note: Option<String>,
}

/// The build options a guard needs, each with its stack.toml `[nvshmem]` key if it has one.
pub type Needs = Vec<(String, Option<&'static str>)>;

/// What a name is, for this build.
#[derive(Clone, Debug)]
pub enum Status<'a> {
    Known(&'a Var),
    /// An NVSHMEM variable whose every definition is guarded by options this build lacks.
    Unbuilt {
        def: &'a EnvDef,
        needs: Needs,
    },
    /// Read by a transport (or its library) this NVSHMEM is built without.
    TransportNotBuilt {
        key: &'static str,
        reader: &'static str,
    },
    /// A build-time option, read while compiling, never at run time.
    BuildTime {
        what: String,
        /// The stack.toml key and this build's value, for NVSHMEM's switches.
        switch: Option<(&'static str, bool)>,
    },
    Unknown,
}

/// Everything known for one build.
pub struct Catalog {
    known: BTreeMap<String, Var>,
    /// NVSHMEM's definitions that this build leaves out, by name.
    unbuilt: BTreeMap<String, (EnvDef, Needs)>,
    build_time: BTreeMap<String, String>,
    build: Build,
    /// NVSHMEM's version or origin, for messages.
    pub nvshmem_origin: String,
}

impl Catalog {
    pub fn new(tables: &NvshmemTables, build: Build) -> Catalog {
        let (mut known, unbuilt) = nvshmem_vars(tables, &build);
        add_tables(&mut known);
        Catalog {
            known,
            unbuilt,
            build_time: build_time(tables),
            build,
            nvshmem_origin: tables.origin.display().to_string(),
        }
    }

    pub fn status(&self, name: &str) -> Status<'_> {
        for (pattern, key, reader) in known::TRANSPORT_VARIABLES {
            let hit = match pattern.strip_suffix('_') {
                Some(_) => name.starts_with(pattern),
                None => name == *pattern,
            };
            if hit && !self.build.on(key) {
                return Status::TransportNotBuilt { key, reader };
            }
        }
        if let Some(v) = self.known.get(name) {
            return Status::Known(v);
        }
        if let Some((def, needs)) = self.unbuilt.get(name) {
            return Status::Unbuilt {
                def,
                needs: needs.clone(),
            };
        }
        if let Some(what) = self.build_time.get(name) {
            let switch = self
                .build
                .switch_of_macro(name)
                .filter(|(s, _)| s.scope == Scope::Stack)
                .map(|(s, on)| (s.key, on));
            return Status::BuildTime {
                what: what.clone(),
                switch,
            };
        }
        Status::Unknown
    }

    /// Whether a transport's variables are read in this build (`ucx`, `libfabric`).
    pub fn transport_on(&self, key: &str) -> bool {
        self.build.on(key)
    }

    /// The known name nearest to `name` (Damerau-Levenshtein), and its distance.
    pub fn nearest(&self, name: &str) -> Option<(&str, usize)> {
        self.known
            .keys()
            .map(|k| (k.as_str(), strsim::damerau_levenshtein(name, k)))
            .min_by_key(|(k, d)| (*d, *k))
    }

    pub fn known(&self) -> impl Iterator<Item = &Var> {
        self.known.values()
    }
}

type Unbuilt = BTreeMap<String, (EnvDef, Needs)>;

/// NVSHMEM's variables for this build: those it reads, and those its guards leave out.
fn nvshmem_vars(tables: &NvshmemTables, build: &Build) -> (BTreeMap<String, Var>, Unbuilt) {
    let (defined, undefined) = build.macros();
    let macros = Macros {
        defined: &defined,
        undefined: &undefined,
    };
    let mut known = BTreeMap::new();
    let mut unbuilt = BTreeMap::new();
    for def in &tables.env {
        match def.condition.eval(&macros) {
            Truth::No => {
                let needs = def
                    .condition
                    .macros()
                    .into_iter()
                    .filter(|m| *m != "NVSHMEMI_ENV_DEF" && undefined.contains(*m))
                    .map(|m| {
                        (
                            m.to_string(),
                            build
                                .switch_of_macro(m)
                                .filter(|(s, _)| s.scope == Scope::Stack)
                                .map(|(s, _)| s.key),
                        )
                    })
                    .collect();
                unbuilt
                    .entry(def.name.clone())
                    .or_insert((def.clone(), needs));
            }
            truth => {
                let note = (truth == Truth::Unknown).then(|| {
                        format!(
                            "defined only under `#if {}` ({}:{}), a condition this build's options do not decide",
                            def.condition, def.file, def.line
                        )
                    });
                known.entry(def.name.clone()).or_insert_with(|| Var {
                    name: def.name.clone(),
                    owner: Owner::Nvshmem,
                    reader: match def.kind {
                        NvKind::Bool => Reader::NvshmemBool,
                        NvKind::Int => Reader::NvshmemInt,
                        NvKind::Long => Reader::NvshmemLong,
                        NvKind::Size => Reader::NvshmemSize,
                        NvKind::String => Reader::Text,
                    },
                    allowed: allowed_with_default(def),
                    source: format!("NVSHMEM's {}:{}", def.file, def.line),
                    note,
                });
            }
        }
    }
    // A name defined twice (one guarded out, one not) is known.
    unbuilt.retain(|name, _| !known.contains_key(name));
    (known, unbuilt)
}

/// NCCL's, DeepEP's and the launchers' variables.
fn add_tables(known: &mut BTreeMap<String, Var>) {
    for (name, reader) in known::nccl() {
        let allowed = if name == "NCCL_DEBUG" {
            known::NCCL_DEBUG_LEVELS
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            Vec::new()
        };
        let source = format!(
            "NCCL {}'s variables (crates/envlint/src/nccl-{}.txt)",
            known::NCCL_TABLE_VERSION,
            known::NCCL_TABLE_VERSION
        );
        known.entry(name.to_string()).or_insert(Var {
            name: name.into(),
            owner: Owner::Nccl,
            reader,
            allowed,
            source,
            note: None,
        });
    }
    for (name, reader, what) in known::DEEPEP {
        known.entry(name.to_string()).or_insert(Var {
            name: name.to_string(),
            owner: Owner::DeepEp,
            reader: *reader,
            allowed: Vec::new(),
            source: format!("DeepEP's README: {what}"),
            note: None,
        });
    }
    for (name, owner, reader) in known::OTHERS {
        known.entry(name.to_string()).or_insert(Var {
            name: name.to_string(),
            owner: *owner,
            reader: *reader,
            allowed: Vec::new(),
            source: format!("read by {}", owner.as_str()),
            note: None,
        });
    }
}

/// Every build-time name: NVSHMEM's CMake options (from its source and the switch table),
/// the recipe's fixed ones, what NVSHMEM's CMake reads, DeepEP's setup.py variables.
fn build_time(tables: &NvshmemTables) -> BTreeMap<String, String> {
    let mut build_time = BTreeMap::new();
    for o in &tables.build_options {
        build_time.insert(
            o.name.clone(),
            format!(
                "a build-time option of NVSHMEM's CMake ({}:{}: {})",
                o.file, o.line, o.description
            ),
        );
    }
    for s in switches::SWITCHES {
        build_time.entry(s.cmake.to_string()).or_insert_with(|| {
            "a build-time option of NVSHMEM's CMake (crates/stack/src/switches.rs)".to_string()
        });
    }
    for name in FIXED_OFF {
        build_time.entry(name.to_string()).or_insert_with(|| {
            "a build-time option of NVSHMEM's CMake, always off in commstack's recipe".to_string()
        });
    }
    for name in commstack_stack::pass_env::READ_BY_NVSHMEM_CMAKE {
        if name != "CUDA_HOME" {
            build_time
                .entry(name.to_string())
                .or_insert_with(|| "read by NVSHMEM's CMake while building".to_string());
        }
    }
    for (name, what) in known::DEEPEP_BUILD {
        build_time
            .entry(name.to_string())
            .or_insert_with(|| what.to_string());
    }
    build_time
}

/// An NVSHMEM variable's listed values, with its default among them (HEAP_KIND's default
/// "DEVICE" is not in its list, yet NVSHMEM takes it).
fn allowed_with_default(def: &EnvDef) -> Vec<String> {
    let mut v = def.allowed.clone();
    let default = def.default.trim_matches('"');
    if !v.is_empty()
        && !default.is_empty()
        && !v.iter().any(|a| a.eq_ignore_ascii_case(default))
        && def.default.starts_with('"')
    {
        v.push(default.to_string());
    }
    v
}
