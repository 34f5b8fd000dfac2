//! The air-gap bundle: every fetched artifact copied into one directory under its upstream
//! file name (what `--mirror DIR` reads), plus a manifest saying what each file is.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cache::write_atomically;
use crate::error::FetchError;
use crate::fetch::{Fetched, Provenance};
use crate::source::mirror_file;
use commstack_digest::sha256_file;

/// The manifest's file name inside a mirror directory.
pub const MIRROR_MANIFEST: &str = "commstack-mirror.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorManifest {
    /// Bumped if the layout changes.
    pub format: u32,
    pub artifacts: Vec<MirrorEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorEntry {
    pub name: String,
    pub filename: String,
    /// The sha256 of the file in the mirror.
    pub sha256: String,
    pub size: u64,
    /// Set when the file is an accepted tree match: the sha256 the lock names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locked_sha256: Option<String>,
}

/// What `export_mirror` did.
#[derive(Clone, Debug)]
pub struct ExportReport {
    pub manifest: MirrorManifest,
    pub copied: usize,
    /// Already present with the right bytes.
    pub kept: usize,
    pub bytes_copied: u64,
}

/// Copies every fetched artifact into `dir` (created if needed) and writes the manifest.
/// Overrides are refused: a mirror carries locked artifacts only.
pub fn export_mirror(fetched: &[Fetched], dir: &Path) -> Result<ExportReport, FetchError> {
    let setup = |message: String| {
        FetchError::Setup(format!("mirror export to {}: {message}", dir.display()))
    };
    fs::create_dir_all(dir).map_err(|e| setup(format!("creating it: {e}")))?;
    let mut by_filename: HashMap<&str, (&str, String)> = HashMap::new();
    let mut report = ExportReport {
        manifest: MirrorManifest {
            format: 1,
            artifacts: Vec::new(),
        },
        copied: 0,
        kept: 0,
        bytes_copied: 0,
    };
    for item in fetched {
        let (sha256, locked_sha256) = match &item.provenance {
            Provenance::Locked { sha256 } | Provenance::LockedTree { sha256, .. } => {
                (sha256.clone(), None)
            }
            Provenance::TreeMatch {
                actual_sha256,
                locked_sha256,
                ..
            } => (actual_sha256.clone(), Some(locked_sha256.clone())),
            Provenance::Override { path, .. } => {
                return Err(setup(format!(
                    "{} is overridden by {} (--source): a mirror carries locked artifacts only; export without --source",
                    item.name,
                    path.display()
                )));
            }
        };
        // The same file under two names (a wheel both a toolchain and a package) is fine;
        // two different files under one name cannot both live in one directory.
        if let Some((other, other_sha256)) =
            by_filename.insert(&item.filename, (&item.name, sha256.clone()))
            && other_sha256 != sha256
        {
            return Err(setup(format!(
                "{} and {other} are different files named {}",
                item.name, item.filename
            )));
        }
        let target = mirror_file(dir, &item.filename);
        let present = target.is_file() && sha256_file(&target).is_ok_and(|actual| actual == sha256);
        if present {
            report.kept += 1;
        } else {
            report.bytes_copied += copy_into(&item.path, &target).map_err(&setup)?;
            report.copied += 1;
        }
        let size = fs::metadata(&target)
            .map_err(|e| setup(format!("{}: {e}", target.display())))?
            .len();
        report.manifest.artifacts.push(MirrorEntry {
            name: item.name.clone(),
            filename: item.filename.clone(),
            sha256,
            size,
            locked_sha256,
        });
    }
    report
        .manifest
        .artifacts
        .sort_by(|a, b| a.filename.cmp(&b.filename));
    report.manifest.artifacts.dedup();
    let text = serde_json::to_string_pretty(&report.manifest).expect("the manifest serialises");
    write_atomically(&dir.join(MIRROR_MANIFEST), format!("{text}\n").as_bytes())
        .map_err(|e| setup(format!("writing {MIRROR_MANIFEST}: {e}")))?;
    Ok(report)
}

/// Copies through a temp file and one rename, so the directory never holds half a file.
fn copy_into(from: &Path, to: &Path) -> Result<u64, String> {
    let name = to
        .file_name()
        .expect("a mirror file has a name")
        .to_string_lossy();
    let temp: PathBuf = to.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let bytes = fs::copy(from, &temp)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), temp.display()))?;
    fs::File::open(&temp)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", temp.display()))?;
    fs::rename(&temp, to)
        .map_err(|e| format!("renaming {} to {}: {e}", temp.display(), to.display()))?;
    Ok(bytes)
}

/// Reads a mirror directory's manifest.
pub fn read_manifest(dir: &Path) -> Result<MirrorManifest, FetchError> {
    let path = dir.join(MIRROR_MANIFEST);
    let text = fs::read_to_string(&path)
        .map_err(|e| FetchError::Setup(format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| FetchError::Setup(format!("{}: {e}", path.display())))
}
