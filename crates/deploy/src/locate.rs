//! The NVSHMEM source the lock pins, found in the download cache as `fetch` left it: by
//! its sha256, or the archive accepted for it by tree hash (`--accept-tree-match`), or the
//! archive recorded for its tree hash. Read in place; nothing is fetched here.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_fetch::Cache;
use commstack_stack::Lock;

pub const NVSHMEM_SOURCE: &str = "nvshmem";

/// The cached archive of the lock's NVSHMEM source.
pub fn locked_nvshmem_archive(lock: &Lock, lock_path: &Path, cache_dir: &Path) -> Result<PathBuf> {
    let Some(src) = lock.sources.iter().find(|s| s.name == NVSHMEM_SOURCE) else {
        bail!(
            "{} pins no NVSHMEM source: run `cargo xtask lock` (a stack builds NVSHMEM from source), or pass --nvshmem-source PATH",
            lock_path.display()
        );
    };
    let cache = Cache::new(cache_dir);
    let cached = || -> std::io::Result<Option<PathBuf>> {
        if let Some(sha) = &src.sha256 {
            if let Some(p) = cache.get(sha, &src.filename)? {
                return Ok(Some(p));
            }
            if let Some((_, p)) = cache.tree_match(sha)? {
                return Ok(Some(p));
            }
        }
        if let Some(tree) = &src.tree
            && let Some((_, p)) = cache.by_tree(tree)?
        {
            return Ok(Some(p));
        }
        Ok(None)
    };
    match cached().with_context(|| format!("reading the download cache {}", cache_dir.display()))? {
        Some(path) => Ok(path),
        None => bail!(
            "the locked NVSHMEM source {} {} (sha256 {}) is not in the download cache {}: run `cargo xtask fetch --only sources` (add --mirror DIR --accept-tree-match where NVIDIA's site cannot be reached), or pass --nvshmem-source with the archive or an unpacked source",
            src.filename,
            src.version,
            src.sha256.as_deref().unwrap_or("-"),
            cache_dir.display()
        ),
    }
}
