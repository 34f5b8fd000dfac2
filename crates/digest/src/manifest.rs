//! The manifest of what a step ships: every file under a path with its sha256, size and
//! mode, every symlink with its target. Two builds compare by their manifests, without
//! moving the bytes; `build --check` names the entries that differ.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// One entry of a [`manifest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Entry {
    File {
        sha256: String,
        size: u64,
        mode: u32,
    },
    Link {
        target: String,
    },
}

impl Entry {
    /// What differs between two entries of the same name, in words.
    pub fn difference(&self, other: &Entry) -> Option<String> {
        match (self, other) {
            (a, b) if a == b => None,
            (
                Entry::File {
                    sha256: a,
                    size: sa,
                    mode: ma,
                },
                Entry::File {
                    sha256: b,
                    size: sb,
                    mode: mb,
                },
            ) => {
                let mut what = Vec::new();
                if a != b {
                    what.push(format!(
                        "content (sha256 {} vs {}, {sa} vs {sb} bytes)",
                        &a[..12],
                        &b[..12]
                    ));
                }
                if ma != mb {
                    what.push(format!("mode ({ma:o} vs {mb:o})"));
                }
                Some(what.join(", "))
            }
            (Entry::Link { target: a }, Entry::Link { target: b }) => {
                Some(format!("link target ({a} vs {b})"))
            }
            _ => Some("a file in one, a link in the other".into()),
        }
    }
}

/// Every file and symlink under `root` (or `root` itself, a file, under its own name),
/// keyed by its path relative to `root`, `/`-separated, except those `skip` refuses (a
/// skipped directory is not entered). Directories are implied by their entries. Modes
/// keep the permission bits only.
pub fn manifest(root: &Path, skip: &dyn Fn(&str) -> bool) -> io::Result<BTreeMap<String, Entry>> {
    let mut out = BTreeMap::new();
    let meta = fs::symlink_metadata(root)?;
    if !meta.is_dir() {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.insert(name, entry(root, &meta)?);
        return Ok(out);
    }
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .expect("walked under root")
                .to_string_lossy()
                .into_owned();
            if skip(&rel) {
                continue;
            }
            let meta = fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                todo.push(path);
                continue;
            }
            out.insert(rel, entry(&path, &meta)?);
        }
    }
    Ok(out)
}

fn entry(path: &Path, meta: &fs::Metadata) -> io::Result<Entry> {
    if meta.file_type().is_symlink() {
        return Ok(Entry::Link {
            target: fs::read_link(path)?.to_string_lossy().into_owned(),
        });
    }
    Ok(Entry::File {
        sha256: crate::sha256_file(path)?,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
    })
}

/// The first few differences between a recorded manifest (`want`) and the files on disk
/// (`now`), named for a message: "missing" for a recorded file that is not there,
/// `unrecorded` for one that is there but not recorded.
pub fn named_differences(
    want: &BTreeMap<String, Entry>,
    now: &BTreeMap<String, Entry>,
    unrecorded: &str,
) -> Vec<String> {
    differences(want, now)
        .iter()
        .take(5)
        .map(|(name, what)| {
            let what = match what.as_str() {
                "only in the first build" => "missing",
                "only in the second build" => unrecorded,
                other => other,
            };
            format!("{name}: {what}")
        })
        .collect()
}

/// The entries that differ between two manifests: (name, what), in name order.
pub fn differences(
    a: &BTreeMap<String, Entry>,
    b: &BTreeMap<String, Entry>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, ea) in a {
        match b.get(name) {
            None => out.push((name.clone(), "only in the first build".into())),
            Some(eb) => {
                if let Some(d) = ea.difference(eb) {
                    out.push((name.clone(), d));
                }
            }
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        out.push((name.clone(), "only in the second build".into()));
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_differs() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for d in [a.path(), b.path()] {
            fs::create_dir_all(d.join("lib")).unwrap();
            fs::write(d.join("lib/same.so"), "same").unwrap();
            std::os::unix::fs::symlink("same.so", d.join("lib/link.so")).unwrap();
        }
        fs::write(a.path().join("lib/time.txt"), "12:00").unwrap();
        fs::write(b.path().join("lib/time.txt"), "12:01").unwrap();
        fs::write(a.path().join("only-a"), "").unwrap();
        fs::set_permissions(
            b.path().join("lib/same.so"),
            fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        fs::create_dir_all(a.path().join("logs")).unwrap();
        fs::write(a.path().join("logs/build.log"), "took 3 s").unwrap();
        let skip = |rel: &str| rel == "logs";
        let (ma, mb) = (
            manifest(a.path(), &skip).unwrap(),
            manifest(b.path(), &skip).unwrap(),
        );
        assert_eq!(ma.len(), 4);
        assert!(matches!(ma["lib/link.so"], Entry::Link { ref target } if target == "same.so"));
        let d = differences(&ma, &mb);
        let names: Vec<&str> = d.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["lib/same.so", "lib/time.txt", "only-a"], "{d:?}");
        assert!(
            d[0].1.starts_with("mode (") && d[1].1.starts_with("content ("),
            "{d:?}"
        );
        assert!(differences(&ma, &ma).is_empty());
        // A single file is its own manifest, under its name.
        let one = manifest(&a.path().join("lib/time.txt"), &|_| false).unwrap();
        assert_eq!(one.keys().collect::<Vec<_>>(), ["time.txt"]);
    }
}
