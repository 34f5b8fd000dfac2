//! Files written whole or not at all.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes every `(path, text)` to a temporary file beside it, then renames them all into
/// place: a failure before the renames leaves none of them changed.
pub fn write_all_atomically(files: &[(&Path, &str)]) -> Result<()> {
    let mut temps = Vec::new();
    for (path, text) in files {
        let tmp = path.with_file_name(format!(
            ".{}.tmp.{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        if let Err(err) = std::fs::write(&tmp, text) {
            for t in &temps {
                let _ = std::fs::remove_file(t);
            }
            let _ = std::fs::remove_file(&tmp);
            return Err(err).with_context(|| format!("cannot write {}", path.display()));
        }
        temps.push(tmp);
    }
    for ((path, _), tmp) in files.iter().zip(&temps) {
        std::fs::rename(tmp, path)
            .with_context(|| format!("cannot move {} into place", path.display()))?;
    }
    Ok(())
}
