//! `store gc`: remove what no run will use again.

use std::fs::{self, File};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

use crate::{Store, ensure_inside};

#[derive(Clone, Debug, Default)]
pub struct GcOptions {
    /// Also remove complete steps not used for this long (None: keep every complete step).
    pub unused_for: Option<Duration>,
    /// Keys (directory names) to keep whatever their age: the current lock's steps.
    pub keep: Vec<String>,
    /// Only report what would be removed.
    pub dry_run: bool,
}

#[derive(Debug, Default)]
pub struct GcReport {
    pub removed: Vec<(PathBuf, u64)>,
    pub kept_in_use: Vec<PathBuf>,
}

impl GcReport {
    pub fn bytes(&self) -> u64 {
        self.removed.iter().map(|(_, b)| b).sum()
    }
}

impl Store {
    /// Remove abandoned temporary directories (their builder no longer holds the step's
    /// lock), failed attempts, and with `unused_for` complete steps not used recently.
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut report = GcReport::default();
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).with_context(|| format!("cannot read {}", tmp.display()))? {
            let path = entry?.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let dir_name = name.split('.').next().unwrap_or_default();
            // A builder holds the lock of its key for as long as the temp dir is in use.
            let lock_path = self.root.join("locks").join(format!("{dir_name}.lock"));
            let busy = File::options()
                .write(true)
                .open(&lock_path)
                .map(|f| f.try_lock().is_err())
                .unwrap_or(false);
            if busy {
                report.kept_in_use.push(path);
                continue;
            }
            self.remove(path, opts, &mut report)?;
        }
        let failed = self.root.join("failed");
        for entry in
            fs::read_dir(&failed).with_context(|| format!("cannot read {}", failed.display()))?
        {
            self.remove(entry?.path(), opts, &mut report)?;
        }
        if let Some(limit) = opts.unused_for {
            let now = SystemTime::now();
            for step in self.list()? {
                let name = step
                    .path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                if opts.keep.contains(&name) {
                    continue;
                }
                let idle = step
                    .last_used
                    .and_then(|t| now.duration_since(t).ok())
                    .unwrap_or(Duration::MAX);
                if idle >= limit {
                    self.remove(step.path, opts, &mut report)?;
                }
            }
        }
        Ok(report)
    }

    fn remove(&self, path: PathBuf, opts: &GcOptions, report: &mut GcReport) -> Result<()> {
        ensure_inside(&self.root, &path)?;
        let bytes = crate::dir_size(&path);
        if !opts.dry_run {
            // Directories a step made read-only get their owner's access back first.
            crate::remove_tree(&path)
                .with_context(|| format!("cannot remove {}", path.display()))?;
        }
        report.removed.push((path, bytes));
        Ok(())
    }
}
