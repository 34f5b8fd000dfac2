//! The ON/OFF options of [`crate::NvshmemOptions`], made from the stack's switch table
//! ([`commstack_stack::switches::SWITCHES`]): a row added there is an option here, in
//! the `-D` list and in the options' JSON with no edit in this crate.
//!
//! The JSON keeps the shape the options had as named fields (it is part of the build's
//! step key): `"ibgda": true` for a plain switch, `"ucx": null` or `"ucx": "/opt/ucx"`
//! for one that builds against an installed package.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use commstack_stack::switches::{SWITCHES, Scope, Switch};
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every switch's value but the fixed ones; defaults from the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switches {
    /// Plain switches that are on.
    on: BTreeSet<&'static str>,
    /// Switches with a home that are on, with the package's prefix.
    homes: BTreeMap<&'static str, PathBuf>,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            on: SWITCHES
                .iter()
                .filter(|s| s.default && s.home.is_none())
                .map(|s| s.key)
                .collect(),
            homes: BTreeMap::new(),
        }
    }
}

/// The row for `key`. Panics on a key the table does not have: callers name rows, so
/// that is a bug, not an input error.
fn row(key: &str) -> &'static Switch {
    commstack_stack::switches::find(key)
        .unwrap_or_else(|| panic!("{key:?} is not a row of commstack_stack::switches"))
}

/// The JSON field: the stack key with `_` for `-` (`ibgda_gpumem_only`).
fn json_key(s: &Switch) -> String {
    s.key.replace('-', "_")
}

impl Switches {
    /// Whether the switch `key` (stack.toml's spelling) is on; fixed ones give their
    /// default.
    pub fn is_on(&self, key: &str) -> bool {
        let s = row(key);
        match (s.scope, s.home) {
            (Scope::Fixed, _) => s.default,
            (_, Some(_)) => self.homes.contains_key(s.key),
            (_, None) => self.on.contains(s.key),
        }
    }

    /// The prefix a switch with a home builds against, when it is on.
    pub fn home(&self, key: &str) -> Option<&Path> {
        self.homes.get(row(key).key).map(PathBuf::as_path)
    }

    /// Set a plain switch. Panics for a fixed one or one with a home (use
    /// [`Switches::set_home`]).
    pub fn set(&mut self, key: &str, on: bool) {
        let s = row(key);
        assert!(
            s.scope != Scope::Fixed && s.home.is_none(),
            "{key}: fixed, or needs a prefix (set_home)"
        );
        if on {
            self.on.insert(s.key);
        } else {
            self.on.remove(s.key);
        }
    }

    /// Turn a switch with a home on (with the package's prefix) or off (`None`).
    pub fn set_home(&mut self, key: &str, prefix: Option<PathBuf>) {
        let s = row(key);
        assert!(s.home.is_some(), "{key} has no home; use set");
        match prefix {
            Some(p) => self.homes.insert(s.key, p),
            None => self.homes.remove(s.key),
        };
    }
}

impl Serialize for Switches {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let rows = SWITCHES.iter().filter(|s| s.scope != Scope::Fixed);
        let mut map = ser.serialize_map(None)?;
        for s in rows {
            match s.home {
                Some(_) => map.serialize_entry(&json_key(s), &self.home(s.key))?,
                None => map.serialize_entry(&json_key(s), &self.is_on(s.key))?,
            }
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Switches {
    /// Missing keys keep their default; an unknown key is an error (the options are
    /// read back from build reports, where a stray key means another recipe).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Switches;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("NVSHMEM options")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Switches, A::Error> {
                let mut out = Switches::default();
                while let Some(key) = map.next_key::<String>()? {
                    let s = SWITCHES
                        .iter()
                        .find(|s| s.scope != Scope::Fixed && json_key(s) == key)
                        .ok_or_else(|| de::Error::custom(format!("unknown field `{key}`")))?;
                    match s.home {
                        Some(_) => out.set_home(s.key, map.next_value()?),
                        None => out.set(s.key, map.next_value()?),
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}
