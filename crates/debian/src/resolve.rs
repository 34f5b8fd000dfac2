//! The package set of an mmdebstrap `essential` base: every `Essential: yes` package of
//! the architecture (arch `all` included), plus the requested ones, closed over
//! Pre-Depends and Depends, as apt installs them (no Recommends, as mmdebstrap sets).
//!
//! Choices, made deterministically:
//! - a dependency already satisfied by a chosen package (by name, or by a Provides with a
//!   matching version) adds nothing;
//! - dependencies with one real package to satisfy them are followed first, to a fixed
//!   point; only then is an open choice (`a | b`, or a virtual name) decided, in the
//!   order met, so that a choice sees every package that is certain;
//! - an alternative group takes its first alternative that exists, as a real package of
//!   a fitting version, or through providers;
//! - a virtual name: a provider already chosen, else the only one, else the one with the
//!   highest Priority (required, important, standard, optional, extra), then by name.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use anyhow::{Result, bail};

use crate::packages::{Dep, Group, Package, group_text};

/// The index, searchable by name and by provided name.
pub struct Universe<'a> {
    arch: String,
    by_name: BTreeMap<&'a str, Vec<usize>>,
    providers: BTreeMap<&'a str, Vec<usize>>,
    packages: &'a [Package],
}

impl<'a> Universe<'a> {
    /// `arch` is the base's Debian architecture (`amd64`); packages of other architectures
    /// (but `all`) are left out.
    pub fn new(packages: &'a [Package], arch: &str) -> Universe<'a> {
        let mut by_name: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut providers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, p) in packages.iter().enumerate() {
            if p.architecture != arch && p.architecture != "all" {
                continue;
            }
            by_name.entry(&p.name).or_default().push(i);
            for (virt, _) in &p.provides {
                providers.entry(virt).or_default().push(i);
            }
        }
        // Highest version first, so the first fitting candidate is the newest.
        for list in by_name.values_mut() {
            list.sort_by(|a, b| packages[*b].version.cmp(&packages[*a].version));
        }
        Universe {
            arch: arch.to_string(),
            by_name,
            providers,
            packages,
        }
    }

    /// Whether a dependency's architecture qualifier can be met by this architecture.
    fn arch_ok(&self, dep: &Dep) -> bool {
        match dep.arch.as_deref() {
            None | Some("any") | Some("native") => true,
            Some(a) => a == self.arch,
        }
    }

    /// Whether package `i` satisfies `dep`, by its name or a Provides.
    fn satisfies(&self, i: usize, dep: &Dep) -> bool {
        if !self.arch_ok(dep) {
            return false;
        }
        let p = &self.packages[i];
        if p.name == dep.name {
            return match &dep.version {
                None => true,
                Some((rel, want)) => rel.holds(&p.version, want),
            };
        }
        p.provides.iter().any(|(virt, v)| {
            virt == &dep.name
                && match (&dep.version, v) {
                    (None, _) => true,
                    (Some((rel, want)), Some(have)) => rel.holds(have, want),
                    // An unversioned Provides never satisfies a versioned dependency.
                    (Some(_), None) => false,
                }
        })
    }

    /// The newest real package named `dep.name` that fits `dep`.
    fn real(&self, dep: &Dep) -> Option<usize> {
        self.by_name
            .get(dep.name.as_str())?
            .iter()
            .copied()
            .find(|&i| self.satisfies(i, dep))
    }

    /// Packages that provide `dep.name` in a fitting version.
    fn providers_of(&self, dep: &Dep) -> Vec<usize> {
        self.providers
            .get(dep.name.as_str())
            .map(|l| {
                l.iter()
                    .copied()
                    .filter(|&i| self.satisfies(i, dep))
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn priority_rank(p: &Package) -> u8 {
    match p.priority.as_deref() {
        Some("required") => 0,
        Some("important") => 1,
        Some("standard") => 2,
        Some("optional") => 3,
        Some("extra") => 4,
        _ => 5,
    }
}

struct Closure<'u, 'a> {
    u: &'u Universe<'a>,
    chosen: BTreeMap<&'a str, usize>,
    queue: VecDeque<usize>,
}

impl<'a> Closure<'_, 'a> {
    fn add(&mut self, i: usize) {
        let name = self.u.packages[i].name.as_str();
        if !self.chosen.contains_key(name) {
            self.chosen.insert(name, i);
            self.queue.push_back(i);
        }
    }

    fn satisfied(&self, group: &Group) -> bool {
        group
            .iter()
            .any(|d| self.chosen.values().any(|&i| self.u.satisfies(i, d)))
    }

    /// The one real package a single-alternative group needs, if that is what it is.
    fn certain(&self, group: &Group) -> Option<usize> {
        match group.as_slice() {
            [dep] => self.u.real(dep),
            _ => None,
        }
    }

    /// Decide an open group; None when no alternative exists at all.
    fn choose(&self, group: &Group) -> Option<usize> {
        for dep in group {
            if let Some(i) = self.u.real(dep) {
                return Some(i);
            }
            let providers = self.u.providers_of(dep);
            if let Some(&i) = providers
                .iter()
                .find(|&&i| self.chosen.contains_key(self.u.packages[i].name.as_str()))
            {
                return Some(i);
            }
            if let Some(&i) = providers.iter().min_by(|&&a, &&b| {
                let (pa, pb) = (&self.u.packages[a], &self.u.packages[b]);
                priority_rank(pa)
                    .cmp(&priority_rank(pb))
                    .then_with(|| pa.name.cmp(&pb.name))
            }) {
                return Some(i);
            }
        }
        None
    }
}

/// The closure of `Essential: yes` + `include`, sorted by name.
pub fn essential_closure<'a>(u: &Universe<'a>, include: &[String]) -> Result<Vec<&'a Package>> {
    let mut c = Closure {
        u,
        chosen: BTreeMap::new(),
        queue: VecDeque::new(),
    };
    let essential: BTreeSet<usize> = u
        .by_name
        .values()
        .filter_map(|l| l.first().copied())
        .filter(|&i| u.packages[i].essential)
        .collect();
    for i in essential {
        c.add(i);
    }
    for name in include {
        let dep = Dep {
            name: name.clone(),
            arch: None,
            version: None,
        };
        match c.choose(&vec![dep]) {
            Some(i) => c.add(i),
            None => bail!(
                "image.include names {name:?}, which is not a package of the index (architecture {}, or all), \
                 nor provided by one: check the name with `apt-cache show {name}` on a machine of that release",
                u.arch
            ),
        }
    }
    // Open choices in the order met: (the package that needs it, the group).
    let mut open: Vec<(usize, &Group)> = Vec::new();
    loop {
        while let Some(i) = c.queue.pop_front() {
            let p = &u.packages[i];
            for group in p.pre_depends.iter().chain(&p.depends) {
                if c.satisfied(group) {
                    continue;
                }
                match c.certain(group) {
                    Some(j) => c.add(j),
                    None => open.push((i, group)),
                }
            }
        }
        let Some(pos) = open.iter().position(|(_, g)| !c.satisfied(g)) else {
            break;
        };
        let (i, group) = open.remove(pos);
        match c.choose(group) {
            Some(j) => c.add(j),
            None => {
                let p = &u.packages[i];
                bail!(
                    "{} {} depends on `{}`, which no package of the index satisfies (architecture {}, or all): \
                     the index is incomplete, or the package needs another component or suite",
                    p.name,
                    p.version,
                    group_text(group),
                    u.arch
                );
            }
        }
    }
    let mut out: Vec<&Package> = c.chosen.values().map(|&i| &u.packages[i]).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
