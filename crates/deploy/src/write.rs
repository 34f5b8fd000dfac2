//! Rendered files into their directory: all of them made in memory first (a render that
//! fails writes nothing), then each written to a temporary file beside its place, synced,
//! and renamed over it, so a reader sees the old file or the new one, never half of one.
//! Other files of the directory (a user's overlays) are left alone.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::rendered::Rendered;

pub fn write_all(out_dir: &Path, rendered: &Rendered) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (rel, text) in &rendered.files {
        if rel.starts_with('/') || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            bail!("refusing to write {rel:?} outside {}", out_dir.display());
        }
        let path = out_dir.join(rel);
        let dir = path.parent().expect("joined paths have a parent");
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".render-")
            .tempfile_in(dir)
            .with_context(|| format!("cannot write in {}", dir.display()))?;
        tmp.write_all(text.as_bytes())?;
        let mode = if rel.ends_with(".sh") || rel.ends_with(".sbatch") {
            0o755
        } else {
            0o644
        };
        tmp.as_file()
            .set_permissions(fs::Permissions::from_mode(mode))?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}
