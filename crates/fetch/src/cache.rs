//! The download cache: verified files keyed by sha256.
//!
//! Layout under the cache root:
//! - `sha256/<hex>/<filename>`: a verified file (renamed there only after its hash matched);
//! - `tmp/<hex>.part`: a download in progress or interrupted (resumed by the next fetch);
//! - `locks/<hex>.lock`: the lock file a process holds while it fetches `<hex>`;
//! - `tree-match/<hex>.json`: for a locked sha256 `<hex>`, the other archive whose tree hash
//!   matched and that the user accepted (`accept_tree_match`), by its own sha256: later
//!   fetches use it without the flag, re-hashing it against that sha256 each time;
//! - `trees/<hex>.json`: for an archive pinned by tree hash `sha256:<hex>` alone, the
//!   cached archive (by sha256) that has that tree, held to that sha256 the same way.
//!
//! Several processes may use one cache at once: a process fetches a digest only while it
//! holds that digest's lock (an OS file lock, released by the kernel if it dies), and a
//! file appears under `sha256/` in one rename.

use std::collections::HashSet;
use std::fs::{self, File, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::artifact::Artifact;
use commstack_digest::sha256_file;

/// A cache directory.
#[derive(Clone, Debug)]
pub struct Cache {
    root: PathBuf,
}

/// One verified file in the cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    pub sha256: String,
    pub filename: String,
    pub path: PathBuf,
    pub size: u64,
}

/// A cache file whose bytes no longer match its name.
#[derive(Clone, Debug)]
pub struct CorruptEntry {
    pub entry: CacheEntry,
    /// The sha256 of what is on disk now.
    pub actual_sha256: String,
    /// Whether `verify` removed it.
    pub removed: bool,
}

/// What `gc` removed (or would remove, when dry).
#[derive(Clone, Debug, Default)]
pub struct GcReport {
    pub removed: Vec<CacheEntry>,
    /// Interrupted downloads (`tmp/*.part`) that no process was writing.
    pub partials: Vec<PathBuf>,
    pub bytes_freed: u64,
}

/// Another archive accepted for a locked sha256 because its tree hash matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeMatchRecord {
    pub locked_sha256: String,
    pub actual_sha256: String,
    pub filename: String,
    pub tree_sha256: String,
}

/// The cached archive whose tree hash is `tree_sha256` (for tree-pinned artifacts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRecord {
    pub tree_sha256: String,
    pub sha256: String,
    pub filename: String,
}

/// Holds a digest's lock until dropped (closing the file releases the OS lock).
#[derive(Debug)]
pub struct DigestLock {
    _file: File,
}

impl Cache {
    /// Uses `root` as the cache (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Cache {
        Cache { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the verified file for `sha256` named `filename` lives (whether or not it exists).
    pub fn entry_path(&self, sha256: &str, filename: &str) -> PathBuf {
        self.root.join("sha256").join(sha256).join(filename)
    }

    /// Moves a damaged cached file, or its whole `sha256/<digest>` directory, out of
    /// `sha256/` into `quarantine/` (kept for the user to inspect; `cache gc` does not
    /// look there), so the next fetch downloads it again.
    pub fn quarantine(&self, path: &Path) -> io::Result<PathBuf> {
        let dir = self.root.join("quarantine");
        fs::create_dir_all(&dir)?;
        let name = path
            .strip_prefix(self.root.join("sha256"))
            .map(|rel| rel.to_string_lossy().replace('/', "-"))
            .unwrap_or_else(|_| {
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            });
        let mut to = dir.join(&name);
        for n in 1.. {
            if !to.exists() {
                break;
            }
            to = dir.join(format!("{name}.{n}"));
        }
        fs::rename(path, &to)?;
        Ok(to)
    }

    /// The verified file for `sha256`, under `filename`. When the same bytes are cached
    /// under another name, they are linked (or copied) under this one too.
    pub fn get(&self, sha256: &str, filename: &str) -> io::Result<Option<PathBuf>> {
        let path = self.entry_path(sha256, filename);
        if path.is_file() {
            return Ok(Some(path));
        }
        let dir = self.root.join("sha256").join(sha256);
        let Ok(read) = fs::read_dir(&dir) else {
            return Ok(None);
        };
        for item in read {
            let other = item?.path();
            if other.is_file() {
                let temp = dir.join(format!(".{filename}.{}.tmp", std::process::id()));
                let _ = fs::remove_file(&temp);
                if fs::hard_link(&other, &temp).is_err() {
                    fs::copy(&other, &temp)?;
                }
                fs::rename(&temp, &path)?;
                return Ok(Some(path));
            }
        }
        Ok(None)
    }

    /// Moves a verified file into the cache as `sha256/<sha256>/<filename>` (one rename,
    /// so readers see the whole file or none). The caller has checked the hash.
    pub fn commit(&self, verified: &Path, sha256: &str, filename: &str) -> io::Result<PathBuf> {
        let path = self.entry_path(sha256, filename);
        fs::create_dir_all(path.parent().expect("entry paths have a parent"))?;
        fs::rename(verified, &path)?;
        Ok(path)
    }

    /// The file an interrupted or running download of `sha256` writes to.
    pub fn partial_path(&self, sha256: &str) -> PathBuf {
        self.root.join("tmp").join(format!("{sha256}.part"))
    }

    /// Takes the lock of `sha256`, waiting while another process (or task) holds it.
    /// `on_wait` is called once if it has to wait.
    pub async fn lock(&self, sha256: &str, on_wait: impl FnOnce()) -> io::Result<DigestLock> {
        let file = self.open_lock_file(sha256)?;
        let mut on_wait = Some(on_wait);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(DigestLock { _file: file }),
                Err(TryLockError::WouldBlock) => {
                    if let Some(notify) = on_wait.take() {
                        notify();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(TryLockError::Error(err)) => return Err(err),
            }
        }
    }

    /// The lock of `sha256` if nobody holds it now.
    pub fn try_lock(&self, sha256: &str) -> io::Result<Option<DigestLock>> {
        let file = self.open_lock_file(sha256)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(DigestLock { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(err)) => Err(err),
        }
    }

    fn open_lock_file(&self, sha256: &str) -> io::Result<File> {
        let dir = self.root.join("locks");
        fs::create_dir_all(&dir)?;
        // Lock files are never deleted: removing one while another process opens it
        // would let two processes hold "the" lock on two different files.
        let path = dir.join(format!("{sha256}.lock"));
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("lock file {}: {e}", path.display())))
    }

    /// The accepted tree match for the locked `sha256`, if one was recorded and its file
    /// is still in the cache.
    pub fn tree_match(
        &self,
        locked_sha256: &str,
    ) -> io::Result<Option<(TreeMatchRecord, PathBuf)>> {
        let record_path = self
            .root
            .join("tree-match")
            .join(format!("{locked_sha256}.json"));
        let record: TreeMatchRecord = match read_json(&record_path)? {
            Some(record) => record,
            None => return Ok(None),
        };
        Ok(self
            .get(&record.actual_sha256, &record.filename)?
            .map(|path| (record, path)))
    }

    pub fn record_tree_match(&self, record: &TreeMatchRecord) -> io::Result<()> {
        let dir = self.root.join("tree-match");
        let text = serde_json::to_string_pretty(record).map_err(io::Error::other)?;
        write_atomically(
            &dir.join(format!("{}.json", record.locked_sha256)),
            text.as_bytes(),
        )
    }

    /// The cached archive recorded for the tree hash `tree_sha256`, if its file is still there.
    pub fn by_tree(&self, tree_sha256: &str) -> io::Result<Option<(TreeRecord, PathBuf)>> {
        let path = self.tree_record_path(tree_sha256);
        let record: TreeRecord = match read_json(&path)? {
            Some(record) => record,
            None => return Ok(None),
        };
        Ok(self
            .get(&record.sha256, &record.filename)?
            .map(|file| (record, file)))
    }

    pub fn record_tree(&self, record: &TreeRecord) -> io::Result<()> {
        let text = serde_json::to_string_pretty(record).map_err(io::Error::other)?;
        write_atomically(&self.tree_record_path(&record.tree_sha256), text.as_bytes())
    }

    fn tree_record_path(&self, tree_sha256: &str) -> PathBuf {
        self.root.join("trees").join(format!(
            "{}.json",
            tree_sha256.trim_start_matches("sha256:")
        ))
    }

    /// Every verified file, sorted by file name then digest.
    pub fn ls(&self) -> io::Result<Vec<CacheEntry>> {
        let mut entries = Vec::new();
        let Ok(digests) = fs::read_dir(self.root.join("sha256")) else {
            return Ok(entries);
        };
        for digest in digests {
            let digest = digest?;
            let sha256 = digest.file_name().to_string_lossy().into_owned();
            if !digest.file_type()?.is_dir() {
                continue;
            }
            for file in fs::read_dir(digest.path())? {
                let file = file?;
                let filename = file.file_name().to_string_lossy().into_owned();
                let meta = file.metadata()?;
                // `.NAME.PID.tmp` are links being made by `get`.
                if meta.is_file() && !filename.starts_with('.') {
                    entries.push(CacheEntry {
                        sha256: sha256.clone(),
                        filename,
                        path: file.path(),
                        size: meta.len(),
                    });
                }
            }
        }
        entries.sort_by(|a, b| (&a.filename, &a.sha256).cmp(&(&b.filename, &b.sha256)));
        Ok(entries)
    }

    /// Re-hashes every cached file; with `remove`, deletes the ones that no longer match.
    pub fn verify(&self, remove: bool) -> io::Result<(usize, Vec<CorruptEntry>)> {
        let entries = self.ls()?;
        let mut corrupt = Vec::new();
        for entry in &entries {
            let actual_sha256 = sha256_file(&entry.path)?;
            if actual_sha256 != entry.sha256 {
                let removed = remove && fs::remove_file(&entry.path).is_ok();
                corrupt.push(CorruptEntry {
                    entry: entry.clone(),
                    actual_sha256,
                    removed,
                });
            }
        }
        Ok((entries.len(), corrupt))
    }

    /// The digests `artifacts` use: their sha256, and through the records, the archives
    /// of tree-pinned artifacts and accepted tree matches.
    pub fn digests_in_use(&self, artifacts: &[Artifact]) -> io::Result<HashSet<String>> {
        let mut keep = HashSet::new();
        for artifact in artifacts {
            if let Some(sha256) = &artifact.sha256 {
                keep.insert(sha256.clone());
                if let Some((record, _)) = self.tree_match(sha256)? {
                    keep.insert(record.actual_sha256);
                }
            } else if let Some(tree) = &artifact.tree_sha256
                && let Some((record, _)) = self.by_tree(tree)?
            {
                keep.insert(record.sha256);
            }
        }
        Ok(keep)
    }

    /// Removes every cached file whose digest is not in `keep` (see [`Cache::digests_in_use`]),
    /// the records that point to removed files, and interrupted downloads nobody is
    /// writing. Digests locked by a running fetch are left alone. With `dry_run`, only
    /// reports.
    pub fn gc(&self, keep: &HashSet<String>, dry_run: bool) -> io::Result<GcReport> {
        let mut report = GcReport::default();
        for entry in self.ls()? {
            if keep.contains(&entry.sha256) {
                continue;
            }
            let Some(_lock) = self.try_lock(&entry.sha256)? else {
                continue;
            };
            if !dry_run {
                fs::remove_file(&entry.path)?;
                let _ = fs::remove_dir(entry.path.parent().unwrap());
            }
            report.bytes_freed += entry.size;
            report.removed.push(entry);
        }
        if !dry_run {
            self.drop_dangling_records()?;
        }
        if let Ok(partials) = fs::read_dir(self.root.join("tmp")) {
            for partial in partials {
                let partial = partial?;
                let name = partial.file_name().to_string_lossy().into_owned();
                let Some(key) = name.strip_suffix(".part") else {
                    continue;
                };
                let Some(_lock) = self.try_lock(key)? else {
                    continue;
                };
                report.bytes_freed += partial.metadata()?.len();
                if !dry_run {
                    fs::remove_file(partial.path())?;
                }
                report.partials.push(partial.path());
            }
        }
        Ok(report)
    }

    /// Tree and tree-match records whose file is gone.
    fn drop_dangling_records(&self) -> io::Result<()> {
        for (dir, is_dangling) in
            [
                ("tree-match", &|path: &Path| -> io::Result<bool> {
                    let record: Option<TreeMatchRecord> = read_json(path)?;
                    Ok(record
                        .is_none_or(|r| !self.entry_path(&r.actual_sha256, &r.filename).is_file()))
                }
                    as &dyn Fn(&Path) -> io::Result<bool>),
                ("trees", &|path: &Path| -> io::Result<bool> {
                    let record: Option<TreeRecord> = read_json(path)?;
                    Ok(record.is_none_or(|r| !self.entry_path(&r.sha256, &r.filename).is_file()))
                }),
            ]
        {
            let Ok(records) = fs::read_dir(self.root.join(dir)) else {
                continue;
            };
            for record in records {
                let path = record?.path();
                if is_dangling(&path).unwrap_or(true) {
                    fs::remove_file(&path)?;
                }
            }
        }
        Ok(())
    }
}

/// A JSON record, `None` when the file does not exist.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    let text = match fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(err),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })
}

/// Writes `bytes` to `path` through a temp file in the same directory and one rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().expect("a file path has a parent");
    fs::create_dir_all(dir)?;
    let temp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().unwrap().to_string_lossy(),
        std::process::id()
    ));
    let mut file = File::create(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&temp, path)
}

/// A consumer's check of a cached file before it uses it: its sha256 must be `sha256`.
/// A file that sits in a cache (`<cache>/sha256/<sha256>/<name>`) and holds other bytes is
/// moved to `<cache>/quarantine/`, so `cargo xtask fetch` downloads it again instead of
/// reporting it as cached; the error says where it went.
pub fn check_cached_file(path: &Path, sha256: &str) -> Result<(), String> {
    let actual = sha256_file(path).map_err(|e| e.to_string())?;
    if actual.eq_ignore_ascii_case(sha256) {
        return Ok(());
    }
    let cache_root = path
        .parent()
        .filter(|dir| {
            dir.file_name()
                .is_some_and(|d| d.eq_ignore_ascii_case(sha256))
        })
        .and_then(Path::parent)
        .filter(|dir| dir.file_name().is_some_and(|d| d == "sha256"))
        .and_then(Path::parent);
    // The whole digest directory goes: other names in it are links to the same bytes.
    let moved = match cache_root {
        Some(root) => match Cache::new(root).quarantine(path.parent().expect("in a digest dir")) {
            Ok(to) => format!(
                "moved it to {}; run `cargo xtask fetch` to download it again",
                to.display()
            ),
            Err(e) => format!(
                "moving it to the quarantine failed ({e}): delete it, then run `cargo xtask fetch`"
            ),
        },
        None => "replace it with the locked file".to_string(),
    };
    Err(format!(
        "{} is damaged: sha256 {actual}, the lock says {sha256}; {moved}",
        path.display()
    ))
}
