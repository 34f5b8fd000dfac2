//! The Packages index of one component and architecture: one [`Package`] per paragraph,
//! with its dependencies parsed (deb-control(5): `a (>= 1) | b:any, c`).

use anyhow::{Result, anyhow, bail};

use crate::deb822;
use crate::version::{DebVersion, Relation};

/// One binary package as the index lists it.
#[derive(Clone, Debug)]
pub struct Package {
    pub name: String,
    pub version: DebVersion,
    pub architecture: String,
    pub essential: bool,
    pub priority: Option<String>,
    pub pre_depends: Vec<Group>,
    pub depends: Vec<Group>,
    /// Virtual names this package provides, with the version when the provide has one.
    pub provides: Vec<(String, Option<DebVersion>)>,
    pub multi_arch: Option<String>,
    /// Pool path, e.g. `pool/main/b/bash/bash_5.2.15-2+b8_amd64.deb`.
    pub filename: String,
    pub size: u64,
    pub sha256: String,
}

/// `a | b`: satisfied by any one of its alternatives.
pub type Group = Vec<Dep>;

/// One alternative of a dependency.
#[derive(Clone, Debug)]
pub struct Dep {
    pub name: String,
    /// The architecture qualifier (`any`, `native` or an architecture), if written.
    pub arch: Option<String>,
    pub version: Option<(Relation, DebVersion)>,
}

impl std::fmt::Display for Dep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if let Some(a) = &self.arch {
            write!(f, ":{a}")?;
        }
        if let Some((rel, v)) = &self.version {
            write!(f, " ({} {v})", rel.as_str())?;
        }
        Ok(())
    }
}

/// A group written as the index writes it: `a (>= 1) | b`.
pub fn group_text(group: &Group) -> String {
    group
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Parse a `Depends:`-style field.
pub fn parse_relations(field: &str) -> Result<Vec<Group>, String> {
    let mut groups = Vec::new();
    for group in field.split(',') {
        let group = group.trim();
        if group.is_empty() {
            continue;
        }
        let mut alts = Vec::new();
        for alt in group.split('|') {
            alts.push(parse_dep(alt.trim()).ok_or_else(|| format!("cannot read {alt:?}"))?);
        }
        groups.push(alts);
    }
    Ok(groups)
}

fn parse_dep(text: &str) -> Option<Dep> {
    // Architecture restrictions `[...]` and build profiles `<...>` occur only in source
    // packages' build relations, never in a Packages index: they fail to parse here.
    let (name_part, version) = match text.split_once('(') {
        Some((n, rest)) => {
            let inner = rest.trim().strip_suffix(')')?.trim();
            let op_len = inner
                .find(|c: char| !"<>=".contains(c))
                .unwrap_or(inner.len());
            let rel = Relation::parse(&inner[..op_len])?;
            let v = DebVersion::parse(inner[op_len..].trim()).ok()?;
            (n.trim(), Some((rel, v)))
        }
        None => (text.trim(), None),
    };
    let (name, arch) = match name_part.split_once(':') {
        Some((n, a)) => (n, Some(a.to_string())),
        None => (name_part, None),
    };
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || "[]<>".contains(c)) {
        return None;
    }
    Some(Dep {
        name: name.to_string(),
        arch,
        version,
    })
}

/// Every package of a Packages file (`url` names it in errors).
pub fn parse_index(text: &str, url: &str) -> Result<Vec<Package>> {
    let paragraphs = deb822::paragraphs(text).map_err(|e| anyhow!("{url}: {e}"))?;
    let mut out = Vec::with_capacity(paragraphs.len());
    for p in paragraphs {
        let field = |f: &str| {
            p.get(f).ok_or_else(|| {
                anyhow!(
                    "{url}: package {:?} has no {f} field",
                    p.get("Package").unwrap_or("?")
                )
            })
        };
        let name = field("Package")?.to_string();
        let relations = |f: &str| -> Result<Vec<Group>> {
            parse_relations(p.get(f).unwrap_or_default())
                .map_err(|e| anyhow!("{url}: package {name}: {f}: {e}"))
        };
        let version = DebVersion::parse(field("Version")?)
            .map_err(|e| anyhow!("{url}: package {name}: {e}"))?;
        let mut provides = Vec::new();
        for group in relations("Provides")? {
            for d in group {
                match d.version {
                    None => provides.push((d.name, None)),
                    Some((Relation::Eq, v)) => provides.push((d.name, Some(v))),
                    Some(_) => {
                        bail!("{url}: package {name}: Provides {d} is not `name (= version)`")
                    }
                }
            }
        }
        let size = field("Size")?
            .parse()
            .map_err(|_| anyhow!("{url}: package {name}: Size is not a number"))?;
        let sha256 = field("SHA256")?.to_ascii_lowercase();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("{url}: package {name}: SHA256 {sha256:?} is not a sha256");
        }
        out.push(Package {
            version,
            architecture: field("Architecture")?.to_string(),
            essential: p
                .get("Essential")
                .is_some_and(|v| v.eq_ignore_ascii_case("yes")),
            priority: p.get("Priority").map(str::to_string),
            pre_depends: relations("Pre-Depends")?,
            depends: relations("Depends")?,
            provides,
            multi_arch: p.get("Multi-Arch").map(str::to_string),
            filename: field("Filename")?.to_string(),
            size,
            sha256,
            name,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_with_versions_alternatives_and_qualifiers() {
        let g = parse_relations(
            "libc6 (>= 2.34), python3:any (>= 3.11~) | python3-minimal:native, awk",
        )
        .unwrap();
        assert_eq!(g.len(), 3);
        assert_eq!(g[0][0].name, "libc6");
        assert_eq!(g[0][0].version.as_ref().unwrap().0, Relation::Ge);
        assert_eq!(g[1].len(), 2);
        assert_eq!(g[1][0].arch.as_deref(), Some("any"));
        assert_eq!(g[1][1].arch.as_deref(), Some("native"));
        assert_eq!(
            group_text(&g[1]),
            "python3:any (>= 3.11~) | python3-minimal:native"
        );
        assert!(parse_relations("a (~ 1)").is_err());
        assert!(parse_relations("").unwrap().is_empty());
    }
}
