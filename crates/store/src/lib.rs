//! The step store: one output directory per build step, named by a hash of the step's
//! locked inputs (like a Nix store path).
//!
//! - A step's key is the sha256 of a canonical JSON rendering of its inputs, so equal
//!   inputs always find the same directory and any changed input finds a new one.
//! - Outputs are built in `tmp/` and renamed into `steps/` only when complete: a crashed
//!   or failed step never looks done. A failed step's directory (with its logs) is moved to
//!   `failed/` so it can be read.
//! - A per-key lock file makes concurrent runs of the same step wait for each other
//!   instead of building twice.
//! - A step that entered the store without a trusted signature (a binary cache's output
//!   taken with `--allow-unsigned`) says so in its `.step.json` ([`StepDir::mark_unsigned`]):
//!   `run` does not reuse it (it builds the step again and replaces it), and whoever reuses
//!   it by its path must ask [`Store::unsigned`] first.
//!
//! Layout under the store root:
//! ```text
//! steps/<step>-<hash32>/            complete outputs; `.step.json` inside describes them
//! tmp/<step>-<hash32>.<pid>.<n>/     in progress (or left by a crash: `store gc` removes)
//! failed/<step>-<hash32>/           the last failed attempt, kept for its logs
//! locks/<step>-<hash32>.lock
//! ```

mod atomic;
mod fixed;
mod gc;
mod remove;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use atomic::write_all_atomically;
use commstack_digest::canonical_json;
pub use fixed::{FIXED_BUILD_ROOT, FixedDir};
pub use gc::{Cleared, GcOptions, GcReport};
pub use remove::remove_tree;

/// Name of the metadata file written into every complete step directory.
pub const META_FILE: &str = ".step.json";
/// Touched on every cache hit; `store gc --unused-for` reads its mtime.
const USED_FILE: &str = ".used";

/// The longest step name: a store directory is named by it and 33 more bytes.
pub const MAX_STEP_NAME: usize = 128;

/// Whether `name` can name a step: `[A-Za-z0-9_-]+` (no `/`, `.`, space or control
/// character: a store directory is named by it), at most [`MAX_STEP_NAME`] bytes.
/// A step's JSON record (its build or wheel report) read back: `what` names it in the
/// error ("an NCCL build report").
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not {what}", path.display()))
}

pub fn valid_step_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STEP_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The identity of one step's output: its name and the hash of its inputs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StepKey {
    pub step: String,
    /// sha256 (hex) of the canonical JSON of `{"step": .., "inputs": ..}`.
    pub hash: String,
}

impl StepKey {
    /// Key a step by its inputs. Inputs must hold everything the output depends on
    /// (source hashes, tool versions, options): what is not in them cannot trigger a rebuild.
    pub fn new(step: &str, inputs: &serde_json::Value) -> StepKey {
        assert!(
            valid_step_name(step),
            "step names are [A-Za-z0-9_-]+, got {step:?}"
        );
        let doc = serde_json::json!({ "step": step, "inputs": inputs });
        let hash = hex::encode(Sha256::digest(canonical_json(&doc).as_bytes()));
        StepKey {
            step: step.to_string(),
            hash,
        }
    }

    /// [`StepKey::new`] for a name read from outside (a pulled artifact's config): an
    /// error, not a panic, when it cannot name a step.
    pub fn try_new(step: &str, inputs: &serde_json::Value) -> Result<StepKey> {
        if !valid_step_name(step) {
            bail!(
                "{:?} cannot name a step: a step name is 1 to {MAX_STEP_NAME} of [A-Za-z0-9_-]",
                commstack_digest::terminal_safe(&step.chars().take(80).collect::<String>())
            );
        }
        Ok(StepKey::new(step, inputs))
    }

    /// Directory name: the step name plus 128 bits of the hash, readable and unique enough.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.step, &self.hash[..32])
    }
}

/// What a complete step directory records about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMeta {
    pub schema: u32,
    pub step: String,
    pub hash: String,
    pub inputs: serde_json::Value,
    pub created: jiff::Timestamp,
    pub build_seconds: f64,
    /// Why the step entered without a trusted signature (a binary cache's output taken
    /// with `--allow-unsigned`); absent for everything built here or pulled signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsigned: Option<String>,
}

impl StepMeta {
    /// The key this record names.
    pub fn key(&self) -> StepKey {
        StepKey {
            step: self.step.clone(),
            hash: self.hash.clone(),
        }
    }
}

/// The outcome of [`Store::run`].
#[derive(Debug)]
pub enum Outcome {
    /// The output already existed; nothing ran.
    Cached { path: PathBuf },
    /// The step ran and its output is now in the store.
    Built { path: PathBuf, seconds: f64 },
}

impl Outcome {
    pub fn path(&self) -> &Path {
        match self {
            Outcome::Cached { path } | Outcome::Built { path, .. } => path,
        }
    }
    pub fn was_cached(&self) -> bool {
        matches!(self, Outcome::Cached { .. })
    }
}

/// Where a running step writes. `out` becomes the step's directory when the build
/// function returns Ok; `logs` is `out/logs`, created for convenience, and survives a
/// failure (the whole directory is moved to `failed/`).
pub struct StepDir {
    pub out: PathBuf,
    pub logs: PathBuf,
    /// Where `out` will live once complete. Steps that embed their own path (an install
    /// prefix, an RPATH) must use a fixed prefix and relocate instead; this is given for
    /// messages only.
    pub final_path: PathBuf,
    /// Set by [`StepDir::mark_unsigned`]: recorded in `.step.json` when sealed.
    unsigned: std::sync::Mutex<Option<String>>,
}

impl StepDir {
    /// Records in the step's `.step.json` that its files entered without a trusted
    /// signature, and why (`taken from HOST/REPO:TAG@sha256:... with --allow-unsigned: it
    /// is not signed`). [`Store::run`] never reuses such a step.
    pub fn mark_unsigned(&self, why: &str) {
        *self.unsigned.lock().expect("the mark's lock") = Some(why.to_string());
    }
}

pub struct Store {
    root: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Store {
    /// Open (and create if needed) a store rooted at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        for sub in ["steps", "tmp", "failed", "locks"] {
            let dir = root.join(sub);
            fs::create_dir_all(&dir).with_context(|| {
                format!("cannot create the step store directory {}", dir.display())
            })?;
        }
        Ok(Store { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The final directory of a key (whether or not it exists).
    pub fn path(&self, key: &StepKey) -> PathBuf {
        self.root.join("steps").join(key.dir_name())
    }

    /// The complete output of `key`, if present.
    pub fn lookup(&self, key: &StepKey) -> Option<PathBuf> {
        let path = self.path(key);
        path.join(META_FILE).is_file().then_some(path)
    }

    /// Why the complete step of `key` entered without a trusted signature; None when it
    /// did not (or is not here).
    pub fn unsigned(&self, key: &StepKey) -> Option<String> {
        self.lookup(key).and_then(|dir| unsigned_mark(&dir))
    }

    /// The complete output of `key` if present and not marked unsigned: what `run` reuses.
    fn reusable(&self, key: &StepKey) -> Option<PathBuf> {
        self.lookup(key).filter(|dir| unsigned_mark(dir).is_none())
    }

    /// Where the last failed attempt of `key` was kept, if any.
    pub fn failed_path(&self, key: &StepKey) -> PathBuf {
        self.root.join("failed").join(key.dir_name())
    }

    /// Run a step unless its output exists. `build` fills `StepDir::out`; on `Ok` the
    /// directory is sealed (metadata written, renamed into place), on `Err` it is moved to
    /// `failed/` and the error says where. `force` rebuilds even if the output exists
    /// (the old output is replaced only once the new one is complete). An output marked
    /// unsigned ([`StepDir::mark_unsigned`]) is built again and replaced, as with `force`.
    pub fn run<F>(
        &self,
        key: &StepKey,
        inputs: &serde_json::Value,
        force: bool,
        build: F,
    ) -> Result<Outcome>
    where
        F: FnOnce(&StepDir) -> Result<()>,
    {
        debug_assert_eq!(
            StepKey::new(&key.step, inputs),
            *key,
            "inputs do not match the key"
        );
        if !force && let Some(path) = self.reusable(key) {
            touch_used(&path);
            return Ok(Outcome::Cached { path });
        }
        let _lock = self.lock(key)?;
        // Someone else may have built it while we waited for the lock.
        if !force && let Some(path) = self.reusable(key) {
            touch_used(&path);
            return Ok(Outcome::Cached { path });
        }

        let tmp = self.root.join("tmp").join(format!(
            "{}.{}.{}",
            key.dir_name(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        if tmp.exists() {
            remove_tree(&tmp).with_context(|| format!("cannot clear {}", tmp.display()))?;
        }
        let logs = tmp.join("logs");
        fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
        let final_path = self.path(key);
        let dir = StepDir {
            out: tmp.clone(),
            logs,
            final_path: final_path.clone(),
            unsigned: Default::default(),
        };

        let started = Instant::now();
        if let Err(err) = build(&dir) {
            let failed = self.failed_path(key);
            // The last attempt's output may hold read-only directories (an archive's).
            let _ = remove_tree(&failed);
            return match fs::rename(&tmp, &failed) {
                Ok(()) => Err(err.context(format!(
                    "step {} failed; its partial output and logs are kept in {}",
                    key.step,
                    failed.display()
                ))),
                Err(_) => Err(err.context(format!(
                    "step {} failed (output left in {})",
                    key.step,
                    tmp.display()
                ))),
            };
        }
        normalize_modes(&tmp).with_context(|| {
            format!("cannot set the modes of the step output {}", tmp.display())
        })?;
        let seconds = started.elapsed().as_secs_f64();
        let meta = StepMeta {
            schema: 1,
            step: key.step.clone(),
            hash: key.hash.clone(),
            inputs: inputs.clone(),
            created: jiff::Timestamp::now(),
            build_seconds: seconds,
            unsigned: dir.unsigned.lock().expect("the mark's lock").take(),
        };
        let meta_json = serde_json::to_string_pretty(&meta)?;
        fs::write(tmp.join(META_FILE), meta_json)
            .with_context(|| format!("cannot write {}", tmp.join(META_FILE).display()))?;
        if fs::read_dir(tmp.join("logs"))?.next().is_none() {
            let _ = fs::remove_dir(tmp.join("logs"));
        }
        touch_used(&tmp);

        if final_path.exists() {
            // --force: move the old output aside first; rename cannot replace a directory.
            let old = self.root.join("tmp").join(format!(
                "{}.old.{}",
                key.dir_name(),
                std::process::id()
            ));
            fs::rename(&final_path, &old).with_context(|| {
                format!("cannot move the old output {} aside", final_path.display())
            })?;
            let _ = remove_tree(&old);
        }
        fs::rename(&tmp, &final_path).with_context(|| {
            format!(
                "cannot move the finished step {} into {}",
                tmp.display(),
                final_path.display()
            )
        })?;
        let _ = remove_tree(&self.failed_path(key));
        Ok(Outcome::Built {
            path: final_path,
            seconds,
        })
    }

    /// Every complete step in the store.
    pub fn list(&self) -> Result<Vec<StepEntry>> {
        let mut out = Vec::new();
        let steps = self.root.join("steps");
        for entry in
            fs::read_dir(&steps).with_context(|| format!("cannot read {}", steps.display()))?
        {
            let path = entry?.path();
            let meta_path = path.join(META_FILE);
            let Ok(text) = fs::read_to_string(&meta_path) else {
                // Not ours or damaged: list it so the user sees it, gc can remove it.
                out.push(StepEntry {
                    path,
                    meta: None,
                    bytes: 0,
                    last_used: None,
                });
                continue;
            };
            let meta: Option<StepMeta> = serde_json::from_str(&text).ok();
            let bytes = dir_size(&path);
            let last_used = fs::metadata(path.join(USED_FILE))
                .and_then(|m| m.modified())
                .ok();
            out.push(StepEntry {
                path,
                meta,
                bytes,
                last_used,
            });
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// An exclusive lock over the store's downloads (`tmp/pull-<digest>.tar`, named by the
    /// blob alone): another process substituting into this store waits until it is
    /// dropped, rather than writing into the same file.
    pub fn lock_downloads(&self) -> Result<File> {
        lock_file_saying(
            &self.root.join("locks").join("downloads.lock"),
            "waiting for another commstack process downloading into this store ...",
        )
    }

    fn lock(&self, key: &StepKey) -> Result<File> {
        let path = self
            .root
            .join("locks")
            .join(format!("{}.lock", key.dir_name()));
        lock_file(&path, &key.step)
    }
}

/// One row of `store ls`.
#[derive(Debug)]
pub struct StepEntry {
    pub path: PathBuf,
    /// None when the directory has no readable metadata (damaged or foreign).
    pub meta: Option<StepMeta>,
    pub bytes: u64,
    pub last_used: Option<std::time::SystemTime>,
}

/// Every directory 0755, every file 0755 when anyone may execute it and 0644 otherwise:
/// a step's output must not depend on the umask of the process that made it.
fn normalize_modes(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let meta = fs::symlink_metadata(e.path())?;
            if meta.is_dir() {
                todo.push(e.path());
            } else if meta.is_file() {
                let mode = meta.permissions().mode();
                let want = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
                if mode & 0o7777 != want {
                    fs::set_permissions(e.path(), fs::Permissions::from_mode(want))?;
                }
            }
        }
    }
    Ok(())
}

/// An exclusive lock on `path` (created if missing), waiting for another process that
/// holds it, and saying so: "waiting for another commstack process building `what`".
pub(crate) fn lock_file(path: &Path, what: &str) -> Result<File> {
    lock_file_saying(
        path,
        &format!("waiting for another commstack process building {what} ..."),
    )
}

/// An exclusive lock on `path`, saying `waiting` when another process holds it.
fn lock_file_saying(path: &Path, waiting: &str) -> Result<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .with_context(|| format!("cannot open the lock file {}", path.display()))?;
    if file.try_lock().is_err() {
        eprintln!("{waiting}");
        file.lock()
            .with_context(|| format!("cannot lock {}", path.display()))?;
    }
    Ok(file)
}

/// The unsigned mark in a step directory's `.step.json`, if any.
fn unsigned_mark(dir: &Path) -> Option<String> {
    let text = fs::read_to_string(dir.join(META_FILE)).ok()?;
    serde_json::from_str::<StepMeta>(&text).ok()?.unsigned
}

fn touch_used(dir: &Path) {
    // Best effort: a read-only store still serves hits.
    let _ = File::create(dir.join(USED_FILE));
}

pub(crate) fn dir_size(path: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

/// Refuse to treat a path outside the store as a step (used by gc before deleting).
pub(crate) fn ensure_inside(root: &Path, path: &Path) -> Result<()> {
    if !path.starts_with(root) {
        bail!(
            "refusing to delete {}: it is not inside the store {}",
            path.display(),
            root.display()
        );
    }
    Ok(())
}
