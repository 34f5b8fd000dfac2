//! Where every file of the base comes from: the package whose `.list` names it
//! (`deb:<name>`, conffiles included: dpkg lists them too), else the rule of
//! [`crate::rules`] that claims it (`generated:<id>`). A file neither claims fails the step.
//!
//! `.list` files name paths as the package ships them (`/bin/bash`); on a merged-/usr
//! system the file lives under a symlinked directory (`bin -> usr/bin`), so each listed
//! path is resolved through the tar's directory symlinks before it is compared.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Result, bail};

use crate::rawtar::{Kind, RawEntry};
use crate::rules;

/// The `files` map of base.json and how many files each generated rule claimed.
#[derive(Debug, Default)]
pub struct Provenance {
    pub files: BTreeMap<String, String>,
    pub rule_counts: BTreeMap<String, u64>,
}

/// Claim every file and symlink of `entries` (directories need no origin).
pub fn claim(entries: &[RawEntry], lists: &BTreeMap<String, Vec<String>>) -> Result<Provenance> {
    let symlinks: HashMap<&str, &str> = entries
        .iter()
        .filter(|e| e.kind == Kind::Symlink)
        .filter_map(|e| Some((e.path.as_str(), e.link.as_deref()?)))
        .collect();
    // Path -> package; `lists` iterates in package-name order, so a path two packages
    // list goes to the first name, the same every run.
    let mut shipped: HashMap<String, &str> = HashMap::new();
    for (package, lines) in lists {
        for line in lines {
            let Some(rel) = line.strip_prefix('/') else {
                continue; // "/." and blank lines
            };
            if rel.is_empty() || rel == "." {
                continue;
            }
            shipped
                .entry(resolve_parents(rel, &symlinks))
                .or_insert(package.as_str());
        }
    }
    // Every rule is counted, one that claimed nothing too: the table stays tight.
    let mut out = Provenance {
        rule_counts: rules::RULES.iter().map(|r| (r.id.to_string(), 0)).collect(),
        ..Provenance::default()
    };
    let mut unclaimed = Vec::new();
    for entry in entries {
        if entry.kind == Kind::Dir {
            continue;
        }
        if let Some(package) = shipped.get(&entry.path) {
            out.files
                .insert(entry.path.clone(), format!("deb:{package}"));
            continue;
        }
        let target = (entry.kind == Kind::Symlink)
            .then_some(entry.link.as_deref())
            .flatten();
        match rules::rule_for(&entry.path, target) {
            Some(rule) => {
                out.files
                    .insert(entry.path.clone(), format!("generated:{}", rule.id));
                *out.rule_counts
                    .get_mut(rule.id)
                    .expect("every rule counted") += 1;
            }
            None => unclaimed.push(match target {
                Some(t) => format!("{} -> {t}", entry.path),
                None => entry.path.clone(),
            }),
        }
    }
    if !unclaimed.is_empty() {
        let shown: Vec<&str> = unclaimed.iter().take(30).map(String::as_str).collect();
        bail!(
            "{} file(s) of the base are claimed by no package's file list and no rule of \
             the generated-file table:\n  {}{}\nIf a maintainer script is expected to write \
             them, add a rule (id, paths, why) to crates/base/src/rules.rs and bump \
             RULES_VERSION; otherwise find out which package or hook made them",
            unclaimed.len(),
            shown.join("\n  "),
            if unclaimed.len() > shown.len() {
                format!("\n  ... and {} more", unclaimed.len() - shown.len())
            } else {
                String::new()
            }
        );
    }
    Ok(out)
}

/// `bin/bash` with `bin -> usr/bin` in the tar -> `usr/bin/bash`. Only the parent
/// directories are resolved (the last component is the file itself, which may be a
/// symlink a package ships). Relative and absolute targets both work; a loop stops.
fn resolve_parents(rel: &str, symlinks: &HashMap<&str, &str>) -> String {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    let mut hops = 0;
    let mut i = 0;
    while i + 1 < parts.len() {
        let prefix = parts[..=i].join("/");
        match symlinks.get(prefix.as_str()) {
            Some(target) if hops < 40 => {
                hops += 1;
                let mut resolved: Vec<String> = if target.starts_with('/') {
                    Vec::new()
                } else {
                    parts[..i].to_vec()
                };
                for c in target.split('/') {
                    match c {
                        "" | "." => {}
                        ".." => {
                            resolved.pop();
                        }
                        c => resolved.push(c.to_string()),
                    }
                }
                resolved.extend_from_slice(&parts[i + 1..]);
                parts = resolved;
                i = 0; // the substituted prefix may hold links too
            }
            _ => i += 1,
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: Kind, link: Option<&str>) -> RawEntry {
        RawEntry {
            path: path.into(),
            kind,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            size: 0,
            data_offset: 0,
            link: link.map(str::to_string),
        }
    }

    #[test]
    fn merged_usr_paths_resolve() {
        let links: HashMap<&str, &str> = [
            ("bin", "usr/bin"),
            ("lib64", "/usr/lib64"),
            ("usr/lib/x", "../share"),
        ]
        .into_iter()
        .collect();
        assert_eq!(resolve_parents("bin/bash", &links), "usr/bin/bash");
        assert_eq!(resolve_parents("lib64/ld.so", &links), "usr/lib64/ld.so");
        assert_eq!(resolve_parents("usr/lib/x/y", &links), "usr/share/y");
        // The last component is not resolved.
        assert_eq!(resolve_parents("bin", &links), "bin");
        let looped: HashMap<&str, &str> = [("a", "b"), ("b", "a")].into_iter().collect();
        let _ = resolve_parents("a/x", &looped); // terminates
    }

    #[test]
    fn packages_and_rules_claim_files_and_the_rest_fails() {
        let entries = vec![
            entry("bin", Kind::Symlink, Some("usr/bin")),
            entry("usr", Kind::Dir, None),
            entry("usr/bin", Kind::Dir, None),
            entry("usr/bin/bash", Kind::File, None),
            entry("usr/bin/awk", Kind::Symlink, Some("/etc/alternatives/awk")),
            entry("etc/passwd", Kind::File, None),
        ];
        let lists: BTreeMap<String, Vec<String>> = [
            (
                "bash".to_string(),
                vec!["/.".into(), "/bin".into(), "/bin/bash".into()],
            ),
            ("usrmerge".to_string(), vec!["/bin".into()]),
        ]
        .into_iter()
        .collect();
        let p = claim(&entries, &lists).unwrap();
        assert_eq!(p.files["usr/bin/bash"], "deb:bash");
        assert_eq!(p.files["bin"], "deb:bash"); // first package listing it, by name
        assert_eq!(
            p.files["usr/bin/awk"],
            "generated:alternatives-generic-name"
        );
        assert_eq!(p.files["etc/passwd"], "generated:accounts");
        assert!(!p.files.contains_key("usr"));
        assert_eq!(p.rule_counts["accounts"], 1);
        assert_eq!(p.rule_counts["ca-certificates"], 0);

        let mut stray = entries.clone();
        stray.push(entry("usr/bin/dropped-by-a-hook", Kind::File, None));
        stray.push(entry("usr/bin/sneaky", Kind::Symlink, Some("/tmp/x")));
        let err = format!("{:#}", claim(&stray, &lists).unwrap_err());
        assert!(err.contains("2 file(s)"), "{err}");
        assert!(err.contains("usr/bin/dropped-by-a-hook"), "{err}");
        assert!(err.contains("usr/bin/sneaky -> /tmp/x"), "{err}");
        assert!(err.contains("crates/base/src/rules.rs"), "{err}");
    }
}
