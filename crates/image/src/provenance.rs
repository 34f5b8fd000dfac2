//! Provenance: every file and symlink of the final image mapped to where it came from: a
//! Debian package or a generated file of the base (base.json's `files`), a wheel's RECORD
//! entry, a launcher generated from a wheel's entry point, or one of our outputs. The
//! layers are read as tars (what the image really holds), each entry looked up in its
//! layer's claims; an entry no claim covers fails the build, naming it. A path written
//! again by a later layer is reported as shadowed (the later one wins).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// Where one file of the image came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Origin {
    /// base.json's origin: `deb:<package>` or `generated:<rule>`.
    Base { origin: String },
    /// A file a wheel ships: its RECORD entry (`hash` empty for RECORD itself).
    Wheel {
        wheel: String,
        version: String,
        sha256: String,
        record: String,
        hash: String,
    },
    /// A console-script launcher generated from the wheel's entry point.
    Launcher {
        wheel: String,
        version: String,
        sha256: String,
        entry_point: String,
    },
    /// One of our outputs: a name, its sha256 (none for provenance.json itself), and the
    /// step key or path it was taken from.
    Own {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
        source: String,
    },
}

/// Image path (relative, as in the tar) -> origin, for one layer.
pub type Claims = BTreeMap<String, Origin>;

/// One layer as provenance reads it: its tar (None for a layer not written yet, whose
/// claims are then its file list) and what claims its files.
pub struct LayerSource<'a> {
    pub holds: String,
    pub tar: Option<&'a Path>,
    pub claims: &'a Claims,
}

/// `provenance.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    pub schema: u32,
    /// What each layer holds, bottom first (the index `files` refer to).
    pub layers: Vec<String>,
    /// Every file and symlink of the image, sorted by path.
    pub files: Vec<FileOrigin>,
    /// Paths an earlier layer wrote and a later one replaced.
    pub shadowed: Vec<Shadowed>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileOrigin {
    pub path: String,
    pub layer: usize,
    pub origin: Origin,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shadowed {
    pub path: String,
    pub layer: usize,
    pub origin: Origin,
    pub by_layer: usize,
}

/// Maps every file of `layers` (bottom first) to its origin; errors on the first layer
/// with unclaimed files, naming them (up to 20) and the layer.
pub fn provenance(layers: &[LayerSource]) -> Result<Provenance> {
    let mut current: BTreeMap<String, (usize, Origin)> = BTreeMap::new();
    let mut shadowed = Vec::new();
    for (index, layer) in layers.iter().enumerate() {
        let paths = match layer.tar {
            Some(tar) => files_of(tar)?,
            None => layer.claims.keys().cloned().collect(),
        };
        let mut unclaimed = Vec::new();
        for path in paths {
            let Some(origin) = layer.claims.get(&path) else {
                unclaimed.push(path);
                continue;
            };
            if let Some((was, old)) = current.insert(path.clone(), (index, origin.clone())) {
                shadowed.push(Shadowed {
                    path,
                    layer: was,
                    origin: old,
                    by_layer: index,
                });
            }
        }
        if !unclaimed.is_empty() {
            let n = unclaimed.len();
            unclaimed.truncate(20);
            bail!(
                "{n} file(s) of the image's {} layer come from no known source (no Debian package, wheel RECORD or commstack output claims them): {}. \
                 Every file must have a provenance: for the base, the base step's table of generated files must name it (rebuild it with `cargo xtask build image`)",
                layer.holds,
                unclaimed.join(", ")
            );
        }
    }
    shadowed.sort_by(|a, b| a.path.cmp(&b.path).then(a.layer.cmp(&b.layer)));
    Ok(Provenance {
        schema: 1,
        layers: layers.iter().map(|l| l.holds.clone()).collect(),
        files: current
            .into_iter()
            .map(|(path, (layer, origin))| FileOrigin {
                path,
                layer,
                origin,
            })
            .collect(),
        shadowed,
    })
}

/// The files, symlinks and hard links of a layer tar (directories need no origin).
pub fn files_of(tar: &Path) -> Result<Vec<String>> {
    let file = File::open(tar).with_context(|| format!("cannot read {}", tar.display()))?;
    let mut archive = tar::Archive::new(file);
    let mut out = Vec::new();
    for entry in archive
        .entries_with_seek()
        .with_context(|| format!("cannot read {}", tar.display()))?
    {
        let entry = entry.with_context(|| format!("cannot read {}", tar.display()))?;
        if entry.header().entry_type() == tar::EntryType::Directory {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let path = path.trim_start_matches("./").trim_end_matches('/');
        if path
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with(".wh."))
        {
            bail!(
                "{}: {path} is a whiteout; commstack layers only add files",
                tar.display()
            );
        }
        out.push(path.to_string());
    }
    Ok(out)
}

impl Provenance {
    /// The canonical JSON written as provenance.json.
    pub fn to_json(&self) -> Result<String> {
        Ok(commstack_digest::canonical_json(&serde_json::to_value(
            self,
        )?))
    }
}
