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
    /// Also remove every complete step that entered without a trusted signature (a
    /// binary cache's output taken with `--allow-unsigned`, [`crate::StepDir::mark_unsigned`]).
    pub unsigned: bool,
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

/// What [`Store::clear_abandoned`] did.
#[derive(Debug, Default)]
pub struct Cleared {
    pub removed: Vec<PathBuf>,
    /// Those that could not be removed, and why.
    pub failed: Vec<(PathBuf, String)>,
}

impl Store {
    /// The entries of tmp/: (abandoned, in use). A builder holds the lock of its key for as
    /// long as its temporary directory (`<step>-<hash>.<pid>.<n>`, or `<step>-<hash>.old.<pid>`
    /// while it replaces an output) is in use; a blob download (`pull-<hex>.tar`) has no
    /// lock of its own.
    fn tmp_entries(&self) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
        let tmp = self.root.join("tmp");
        let (mut abandoned, mut busy) = (Vec::new(), Vec::new());
        for entry in fs::read_dir(&tmp).with_context(|| format!("cannot read {}", tmp.display()))? {
            let path = entry?.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let dir_name = name.split('.').next().unwrap_or_default();
            let lock_path = self.root.join("locks").join(format!("{dir_name}.lock"));
            let in_use = File::options()
                .write(true)
                .open(&lock_path)
                .map(|f| f.try_lock().is_err())
                .unwrap_or(false);
            match in_use {
                true => busy.push(path),
                false => abandoned.push(path),
            }
        }
        Ok((abandoned, busy))
    }

    /// Removes the step directories a run that ended without cleaning up (killed, or
    /// stopped by a panic) left in tmp/: those whose step lock nobody holds. Blob
    /// downloads (`pull-<hex>.tar`) stay, since a rerun continues them (`gc` removes them).
    /// A directory that cannot be removed is reported, not an error: it blocks nothing.
    pub fn clear_abandoned(&self) -> Result<Cleared> {
        let mut cleared = Cleared::default();
        for path in self.tmp_entries()?.0 {
            if !path.is_dir() {
                continue;
            }
            match fs::remove_dir_all(&path) {
                Ok(()) => cleared.removed.push(path),
                Err(e) => cleared.failed.push((path, e.to_string())),
            }
        }
        Ok(cleared)
    }

    /// Remove abandoned temporary directories and downloads (their builder no longer
    /// holds the step's lock), failed attempts, with `unused_for` complete steps not used
    /// recently, and with `unsigned` the steps that entered without a trusted signature.
    pub fn gc(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut report = GcReport::default();
        let (abandoned, busy) = self.tmp_entries()?;
        report.kept_in_use = busy;
        for path in abandoned {
            self.remove(path, opts, &mut report)?;
        }
        let failed = self.root.join("failed");
        for entry in
            fs::read_dir(&failed).with_context(|| format!("cannot read {}", failed.display()))?
        {
            self.remove(entry?.path(), opts, &mut report)?;
        }
        if opts.unsigned {
            for step in self.list()? {
                if step.meta.as_ref().is_some_and(|m| m.unsigned.is_some()) {
                    self.remove(step.path, opts, &mut report)?;
                }
            }
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
                let marked = step.meta.as_ref().is_some_and(|m| m.unsigned.is_some());
                if opts.keep.contains(&name) || (opts.unsigned && marked) {
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
