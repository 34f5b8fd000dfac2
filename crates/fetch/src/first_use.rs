//! What `lock` asks of fetch for the sources it has not seen (docs/sources.md): each
//! archive into the cache, then both its hashes and its `.gitmodules`, read from one
//! unpacking by the one unpacker (the reading the tree hash and every source step share).
//!
//! An artifact pinned by what the user or the known table gives (a sha256, a tree hash)
//! is fetched as every fetch fetches it: mirrors first, `accept_tree_match` as always.
//! One pinned by nothing is trusted on first use: the first source that gives its bytes
//! (mirrors first, then upstream) is the one recorded, and [`Seen::from`] names it.

use std::path::{Path, PathBuf};

use futures::StreamExt;

use crate::artifact::Artifact;
use crate::cache::TreeRecord;
use crate::error::{ArtifactFailure, FetchError, SourceError, SourceFailure};
use crate::fetch::{FetchOptions, Origin, Run, fetch_all_async};
use crate::source::sources_for;
use crate::tree;

/// One source as `lock` records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub name: String,
    /// The archive in the cache.
    pub path: PathBuf,
    /// sha256 of the archive's bytes in the cache.
    pub sha256: String,
    /// Its tree hash (see [`crate::tree`]).
    pub tree_sha256: String,
    /// Where its bytes came from in this run: the mirror's or upstream's URL
    /// (`file:///...` for a mirror directory), or `cache`.
    pub from: String,
    /// Nothing pinned it: these are whatever the first source gave.
    pub first_use: bool,
    /// The tree's top-level `.gitmodules`, if it has one.
    pub gitmodules: Option<String>,
}

/// Every artifact into the cache (pinned ones held to their pin, unpinned ones taken as
/// the first source gives them), each with both hashes; results in the given order.
/// Failures of every artifact are reported at once, as by [`crate::fetch_all`].
pub async fn fetch_for_lock(
    artifacts: &[Artifact],
    options: &FetchOptions,
) -> Result<Vec<Seen>, FetchError> {
    for artifact in artifacts {
        artifact.validate().map_err(FetchError::InvalidArtifact)?;
    }
    let pinned: Vec<Artifact> = artifacts
        .iter()
        .filter(|a| a.is_pinned())
        .cloned()
        .collect();
    let mut fetched = fetch_all_async(&pinned, options).await?.into_iter();
    let run = Run::new(options)?;
    std::fs::create_dir_all(run.cache.root().join("tmp")).map_err(|source| FetchError::Cache {
        dir: run.cache.root().to_path_buf(),
        source,
    })?;
    let mut got: Vec<(PathBuf, String, String, bool)> = Vec::new();
    let mut failures = Vec::new();
    for artifact in artifacts {
        if artifact.is_pinned() {
            let f = fetched.next().expect("one result per pinned artifact");
            let from = match &f.origin {
                Origin::Cache => "cache".to_string(),
                Origin::Mirror { url } | Origin::Upstream { url } => url.clone(),
                Origin::Local { path } => path.display().to_string(),
            };
            let sha256 = f.sha256().unwrap_or_default().to_string();
            got.push((f.path, sha256, from, false));
            continue;
        }
        match first_use(&run, artifact).await {
            Ok((path, sha256, from)) => got.push((path, sha256, from, true)),
            Err(failure) => failures.push(failure),
        }
    }
    if !failures.is_empty() {
        return Err(match options.offline {
            true => FetchError::Offline(failures),
            false => FetchError::Artifacts(failures),
        });
    }
    let scratch = run.cache.root().join("tmp");
    let seen = futures::stream::iter(artifacts.iter().zip(got))
        .map(|(artifact, (path, sha256, from, first_use))| {
            let scratch = scratch.clone();
            async move {
                let (tree_sha256, gitmodules) = hash_tree(&path, &scratch).await.map_err(|e| {
                    FetchError::Setup(format!(
                        "{} ({}): {e}: no tree hash, so it cannot be locked",
                        artifact.name,
                        path.display()
                    ))
                })?;
                Ok::<Seen, FetchError>(Seen {
                    name: artifact.name.clone(),
                    path,
                    sha256,
                    tree_sha256,
                    from,
                    first_use,
                    gitmodules,
                })
            }
        })
        .buffered(options.jobs.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<Seen>, FetchError>>()?;
    // A first-use archive is found again by its tree, as a tree-pinned one is.
    for s in seen.iter().filter(|s| s.first_use) {
        run.cache
            .record_tree(&TreeRecord {
                tree_sha256: s.tree_sha256.clone(),
                sha256: s.sha256.clone(),
                filename: file_name(&s.path),
            })
            .map_err(|source| FetchError::Cache {
                dir: run.cache.root().to_path_buf(),
                source,
            })?;
    }
    Ok(seen)
}

/// The first source that gives the artifact's bytes, committed to the cache under their
/// sha256: (path, sha256, source).
async fn first_use(
    run: &Run<'_>,
    artifact: &Artifact,
) -> Result<(PathBuf, String, String), ArtifactFailure> {
    let failure = |attempts: Vec<SourceFailure>| ArtifactFailure {
        name: artifact.name.clone(),
        filename: artifact.filename.clone(),
        pin: "nothing yet (first use)".to_string(),
        attempts,
    };
    let io = |url: String, message: String| SourceFailure {
        url,
        error: SourceError::Io { message },
    };
    let root = run.cache.root().display().to_string();
    // Keyed by what is asked for: no digest is known yet.
    let key = format!(
        "first-use-{}",
        commstack_digest::sha256_hex(
            format!("{}\n{}", artifact.filename, artifact.urls.join("\n")).as_bytes()
        )
    );
    let _lock = run
        .cache
        .lock(&key, || {})
        .await
        .map_err(|e| failure(vec![io(root.clone(), e.to_string())]))?;
    let part = run.cache.partial_path(&key);
    // Nothing to check a resumed prefix against: always from the first byte.
    let _ = std::fs::remove_file(&part);
    let sources = sources_for(artifact, &run.options.mirrors)
        .map_err(|message| failure(vec![io(artifact.urls.join(" "), message)]))?;
    let bar = run.progress.bar(&artifact.name, None);
    let mut attempts = Vec::new();
    for source in &sources {
        let label = source.label();
        if run.options.offline && source.needs_network() {
            attempts.push(SourceFailure {
                url: label,
                error: SourceError::SkippedOffline,
            });
            continue;
        }
        match run.get_bytes(source, &part, None, &bar).await {
            Ok(got) => {
                let path = run
                    .cache
                    .commit(&part, &got.sha256, &artifact.filename)
                    .map_err(|e| failure(vec![io(root.clone(), e.to_string())]))?;
                bar.finish_and_clear();
                return Ok((path, got.sha256, label));
            }
            Err(error) => {
                let _ = std::fs::remove_file(&part);
                attempts.push(SourceFailure { url: label, error });
            }
        }
    }
    bar.abandon_with_message("failed");
    Err(failure(attempts))
}

/// The archive's tree hash and its `.gitmodules` (as text), off the async threads.
async fn hash_tree(path: &Path, scratch: &Path) -> std::io::Result<(String, Option<String>)> {
    let (path, scratch) = (path.to_path_buf(), scratch.to_path_buf());
    let (tree, bytes) = tokio::task::spawn_blocking(move || {
        tree::tree_sha256_archive_and_file(&path, &scratch, ".gitmodules")
    })
    .await
    .expect("tree hashing panicked")?;
    let text = bytes
        .map(|b| {
            String::from_utf8(b).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, ".gitmodules is not UTF-8")
            })
        })
        .transpose()?;
    Ok((tree, text))
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
