//! `fetch_all`: every artifact into the cache, each from the first source that gives the
//! right bytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;

use crate::artifact::Artifact;
use crate::cache::{Cache, TreeMatchRecord, TreeRecord};
use crate::download::{self, Downloaded};
use crate::error::{ArtifactFailure, FetchError, SourceError, SourceFailure, TreeCheck};
use crate::progress::Progress;
use crate::source::{Mirror, Source, sources_for};
use crate::tree;
use commstack_digest::sha256_file;
use commstack_http::RetryPolicy;

/// How to fetch. `FetchOptions::new(cache_dir)` gives the defaults.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    pub cache_dir: PathBuf,
    /// Tried in order, before the upstream URLs.
    pub mirrors: Vec<Mirror>,
    /// Never open a socket: only the cache, mirror directories and `file://` URLs.
    pub offline: bool,
    /// Downloads at once (at least 1).
    pub jobs: usize,
    /// Retries of one URL after failures that brought no bytes (5xx, 429, resets, timeouts).
    pub retries: u32,
    /// First backoff delay; doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured as given (longer ones are cut to this).
    pub max_retry_after: Duration,
    pub connect_timeout: Duration,
    /// The longest silence while reading a response before the attempt counts as failed.
    pub read_timeout: Duration,
    /// Accept a source archive whose sha256 differs from the lock when its unpacked tree
    /// hash equals the locked `tree_sha256`; recorded in the cache (with the archive's own
    /// sha256, which every later use is held to) and in `Fetched`. Later fetches use the
    /// recorded archive without the flag, and still say it is a tree match.
    pub accept_tree_match: bool,
    /// `--source NAME=PATH`: use PATH instead of the locked artifact NAME.
    pub overrides: Vec<SourceOverride>,
    /// Draw progress bars (still only when stderr is a terminal).
    pub progress: bool,
    /// Hash cached files before trusting them: a damaged one is quarantined (see
    /// [`crate::check_cached_file`]) and downloaded again.
    pub verify: bool,
}

impl FetchOptions {
    pub fn new(cache_dir: impl Into<PathBuf>) -> FetchOptions {
        FetchOptions {
            cache_dir: cache_dir.into(),
            mirrors: Vec::new(),
            offline: false,
            jobs: 4,
            retries: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            max_retry_after: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(20),
            read_timeout: Duration::from_secs(60),
            accept_tree_match: false,
            overrides: Vec::new(),
            progress: true,
            verify: false,
        }
    }
}

/// `NAME=PATH`: a local directory or archive that replaces a locked artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceOverride {
    pub name: String,
    pub path: PathBuf,
}

impl FromStr for SourceOverride {
    type Err = String;

    fn from_str(text: &str) -> Result<SourceOverride, String> {
        match text.split_once('=') {
            Some((name, path)) if !name.is_empty() && !path.is_empty() => Ok(SourceOverride {
                name: name.to_string(),
                path: PathBuf::from(path),
            }),
            _ => Err(format!(
                "{text:?} is not NAME=PATH (e.g. nvshmem=../nvshmem_src)"
            )),
        }
    }
}

/// One artifact, ready to use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fetched {
    pub name: String,
    pub filename: String,
    /// The verified file in the cache, or the override's file or directory.
    pub path: PathBuf,
    /// Whether these are the locked bytes, and if not, what they are.
    pub provenance: Provenance,
    /// Where the bytes came from in this run.
    pub origin: Origin,
    /// Body bytes received from the network for it in this run (retries included).
    pub bytes_downloaded: u64,
    /// Sources tried first that served other bytes than the lock's (a damaged mirror),
    /// each with what was wrong: the fetch still succeeded from a later source.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_sources: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Provenance {
    /// Exactly the bytes the lock names.
    Locked { sha256: String },
    /// An archive the lock pins by tree hash alone (a git archive, whose bytes are not
    /// stable); its unpacked tree is the locked one. `sha256` is of the bytes fetched.
    LockedTree { sha256: String, tree_sha256: String },
    /// Another archive than the locked one, whose unpacked tree hash equals the locked
    /// tree hash; accepted because the user passed `accept_tree_match`.
    TreeMatch {
        locked_sha256: String,
        actual_sha256: String,
        tree_sha256: String,
    },
    /// Replaced by the user (`--source NAME=PATH`): not what the lock names. Hashes are
    /// given where they could be computed (a file's sha256; a tree hash for directories
    /// and archives).
    Override {
        path: PathBuf,
        sha256: Option<String>,
        tree_sha256: Option<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Origin {
    /// Already in the cache.
    Cache,
    Mirror {
        url: String,
    },
    Upstream {
        url: String,
    },
    /// A `--source` override, used where it lies.
    Local {
        path: PathBuf,
    },
}

impl Fetched {
    /// True when this is what the lock pins (by sha256, or by tree for tree-pinned archives).
    pub fn is_locked(&self) -> bool {
        matches!(
            self.provenance,
            Provenance::Locked { .. } | Provenance::LockedTree { .. }
        )
    }

    /// The sha256 of the file used, when it is a file (not a directory override).
    pub fn sha256(&self) -> Option<&str> {
        match &self.provenance {
            Provenance::Locked { sha256 } | Provenance::LockedTree { sha256, .. } => Some(sha256),
            Provenance::TreeMatch { actual_sha256, .. } => Some(actual_sha256),
            Provenance::Override { sha256, .. } => sha256.as_deref(),
        }
    }

    /// For every output that follows: a line saying how this artifact departs from the
    /// lock, or `None` when it does not.
    pub fn deviation(&self) -> Option<String> {
        match &self.provenance {
            Provenance::Locked { .. } | Provenance::LockedTree { .. } => None,
            Provenance::TreeMatch {
                locked_sha256,
                actual_sha256,
                tree_sha256,
            } => Some(format!(
                "{}: TREE MATCH: archive sha256 {actual_sha256} is not the locked {locked_sha256}; \
                 accepted because its tree hash {tree_sha256} equals the lock's (--accept-tree-match)",
                self.name
            )),
            Provenance::Override {
                path, tree_sha256, ..
            } => Some(format!(
                "{}: OVERRIDE: local {} replaces the locked artifact (--source); tree {}; not reproducible",
                self.name,
                path.display(),
                tree_sha256.as_deref().unwrap_or("not hashable"),
            )),
        }
    }
}

/// Counts over one run, for the closing line and benchmarks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub artifacts: usize,
    pub from_cache: usize,
    pub from_mirror: usize,
    pub from_upstream: usize,
    pub overrides: usize,
    pub tree_matches: usize,
    pub bytes_downloaded: u64,
}

impl Summary {
    pub fn of(fetched: &[Fetched]) -> Summary {
        let mut summary = Summary {
            artifacts: fetched.len(),
            ..Summary::default()
        };
        for item in fetched {
            match item.origin {
                Origin::Cache => summary.from_cache += 1,
                Origin::Mirror { .. } => summary.from_mirror += 1,
                Origin::Upstream { .. } => summary.from_upstream += 1,
                Origin::Local { .. } => {}
            }
            match item.provenance {
                Provenance::Locked { .. } | Provenance::LockedTree { .. } => {}
                Provenance::TreeMatch { .. } => summary.tree_matches += 1,
                Provenance::Override { .. } => summary.overrides += 1,
            }
            summary.bytes_downloaded += item.bytes_downloaded;
        }
        summary
    }
}

/// Fetches every artifact (the results are in the same order). Builds its own tokio
/// runtime: call it from synchronous code; from async code use [`fetch_all_async`].
pub fn fetch_all(
    artifacts: &[Artifact],
    options: &FetchOptions,
) -> Result<Vec<Fetched>, FetchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| FetchError::Setup(format!("starting the async runtime: {e}")))?;
    runtime.block_on(fetch_all_async(artifacts, options))
}

/// See [`fetch_all`]. Artifacts that fail do not stop the others: what can be fetched is
/// cached, then every failure is reported at once.
pub async fn fetch_all_async(
    artifacts: &[Artifact],
    options: &FetchOptions,
) -> Result<Vec<Fetched>, FetchError> {
    for artifact in artifacts {
        artifact.validate().map_err(FetchError::InvalidArtifact)?;
    }
    let overridden = resolve_overrides(artifacts, &options.overrides).await?;
    let cache = Cache::new(&options.cache_dir);
    std::fs::create_dir_all(cache.root().join("tmp")).map_err(|source| FetchError::Cache {
        dir: cache.root().to_path_buf(),
        source,
    })?;
    // Offline builds no client at all: nothing can open a socket.
    let client = match options.offline {
        true => None,
        false => Some(http_client(options)?),
    };
    let run = Run {
        cache,
        client,
        options,
        progress: Progress::new(options.progress),
        policy: RetryPolicy {
            retries: options.retries,
            backoff: options.backoff,
            max_backoff: options.max_backoff,
            max_retry_after: options.max_retry_after,
        },
    };
    let mut results: Vec<(usize, Result<Fetched, ArtifactFailure>)> =
        futures::stream::iter(artifacts.iter().enumerate())
            .map(|(index, artifact)| {
                let run = &run;
                let overridden = &overridden;
                async move {
                    match overridden.get(&index) {
                        Some(fetched) => (index, Ok(fetched.clone())),
                        None => (index, run.fetch_one(artifact).await),
                    }
                }
            })
            .buffer_unordered(options.jobs.max(1))
            .collect()
            .await;
    results.sort_by_key(|(index, _)| *index);
    let mut fetched = Vec::new();
    let mut failures = Vec::new();
    for (_, result) in results {
        match result {
            Ok(item) => fetched.push(item),
            Err(failure) => failures.push(failure),
        }
    }
    match (failures.is_empty(), options.offline) {
        (true, _) => Ok(fetched),
        (false, true) => Err(FetchError::Offline(failures)),
        (false, false) => Err(FetchError::Artifacts(failures)),
    }
}

/// The artifacts a fetch with `options` would not find in the cache (no hashing, no
/// network): what a build plan reports as still to fetch.
pub fn not_cached<'a>(
    artifacts: &'a [Artifact],
    options: &FetchOptions,
) -> std::io::Result<Vec<&'a Artifact>> {
    let run = Run {
        cache: Cache::new(&options.cache_dir),
        client: None,
        options,
        progress: Progress::new(false),
        policy: RetryPolicy {
            retries: 0,
            backoff: options.backoff,
            max_backoff: options.max_backoff,
            max_retry_after: options.max_retry_after,
        },
    };
    let mut missing = Vec::new();
    for artifact in artifacts {
        if run.cached(artifact)?.is_none() {
            missing.push(artifact);
        }
    }
    Ok(missing)
}

/// Checks, before any byte is downloaded, that every artifact can be had: from the cache,
/// a local mirror file, or an http(s) source that answers a one-byte ranged GET (some
/// servers refuse HEAD). Long jobs (`mirror export`) call it first, so a
/// source this network cannot reach fails in seconds, not after gigabytes of the others.
/// It reports every artifact that no source has, with what each source answered.
pub fn preflight(artifacts: &[Artifact], options: &FetchOptions) -> Result<(), FetchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| FetchError::Setup(format!("starting the async runtime: {e}")))?;
    runtime.block_on(preflight_async(artifacts, options))
}

async fn preflight_async(artifacts: &[Artifact], options: &FetchOptions) -> Result<(), FetchError> {
    for artifact in artifacts {
        artifact.validate().map_err(FetchError::InvalidArtifact)?;
    }
    let overridden = resolve_overrides(artifacts, &options.overrides).await?;
    let client = match options.offline {
        true => None,
        false => Some(http_client(options)?),
    };
    let run = Run {
        cache: Cache::new(&options.cache_dir),
        client,
        options,
        progress: Progress::new(false),
        policy: RetryPolicy {
            retries: options.retries,
            backoff: options.backoff,
            max_backoff: options.max_backoff,
            max_retry_after: options.max_retry_after,
        },
    };
    let failures: Vec<ArtifactFailure> = futures::stream::iter(artifacts.iter().enumerate())
        .filter(|(index, _)| std::future::ready(!overridden.contains_key(index)))
        .map(|(_, artifact)| run.reachable(artifact))
        .buffer_unordered(options.jobs.max(1))
        .filter_map(|result| std::future::ready(result.err()))
        .collect()
        .await;
    match (failures.is_empty(), options.offline) {
        (true, _) => Ok(()),
        (false, true) => Err(FetchError::Offline(failures)),
        (false, false) => Err(FetchError::Unreachable(failures)),
    }
}

impl Run<'_> {
    /// Ok when the artifact is cached or one of its sources answers; else every answer.
    async fn reachable(&self, artifact: &Artifact) -> Result<(), ArtifactFailure> {
        let failure = |attempts: Vec<SourceFailure>| ArtifactFailure {
            name: artifact.name.clone(),
            filename: artifact.filename.clone(),
            pin: artifact.pin(),
            attempts,
        };
        let io = |url: String, message: String| SourceFailure {
            url,
            error: SourceError::Io { message },
        };
        let root = self.cache.root().display().to_string();
        if self
            .cached(artifact)
            .map_err(|e| failure(vec![io(root, e.to_string())]))?
            .is_some()
        {
            return Ok(());
        }
        let sources = sources_for(artifact, &self.options.mirrors)
            .map_err(|message| failure(vec![io(artifact.urls.join(" "), message)]))?;
        let mut attempts = Vec::new();
        for source in &sources {
            let error = match (source, &self.client) {
                (Source::File { path, .. }, _) if path.is_file() => return Ok(()),
                (Source::File { path, .. }, _) => SourceError::NotInMirror { path: path.clone() },
                (Source::Http { .. }, None) => SourceError::SkippedOffline,
                (Source::Http { url, .. }, Some(client)) => {
                    match client
                        .get(url.clone())
                        .header("Range", "bytes=0-0")
                        .send()
                        .await
                    {
                        Ok(r) if r.status().is_success() => return Ok(()),
                        Ok(r) => SourceError::Status {
                            code: r.status().as_u16(),
                            attempts: 1,
                        },
                        Err(e) => SourceError::Transport {
                            message: e.to_string(),
                            attempts: 1,
                        },
                    }
                }
            };
            attempts.push(SourceFailure {
                url: source.label(),
                error,
            });
        }
        Err(failure(attempts))
    }
}

fn http_client(options: &FetchOptions) -> Result<reqwest::Client, FetchError> {
    let settings = commstack_http::ClientSettings {
        connect_timeout: options.connect_timeout,
        read_timeout: options.read_timeout,
        max_redirects: 10,
    };
    commstack_http::client(&settings).map_err(|e| FetchError::Setup(e.to_string()))
}

/// Overrides by artifact index, after checking every name and path.
async fn resolve_overrides(
    artifacts: &[Artifact],
    overrides: &[SourceOverride],
) -> Result<HashMap<usize, Fetched>, FetchError> {
    let mut by_index = HashMap::new();
    for wanted in overrides {
        let matching: Vec<usize> = (0..artifacts.len())
            .filter(|&i| artifacts[i].name == wanted.name)
            .collect();
        if matching.is_empty() {
            let known: Vec<&str> = artifacts.iter().map(|a| a.name.as_str()).collect();
            return Err(FetchError::UnknownOverride {
                name: wanted.name.clone(),
                known: known.join(", "),
            });
        }
        let bad = |message: String| FetchError::BadOverride {
            name: wanted.name.clone(),
            path: wanted.path.clone(),
            message,
        };
        let path = std::fs::canonicalize(&wanted.path).map_err(|e| bad(format!("{e}")))?;
        let hashed_path = path.clone();
        let (sha256, tree_sha256) = tokio::task::spawn_blocking(move || {
            let path = hashed_path;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let sha256 = if path.is_file() {
                Some(sha256_file(&path))
            } else {
                None
            };
            let tree = if path.is_dir() || tree::ArchiveKind::from_name(&name).is_some() {
                Some(tree::tree_sha256(&path, &name))
            } else {
                None
            };
            (sha256.transpose(), tree.transpose())
        })
        .await
        .expect("override hashing panicked");
        let sha256 = sha256.map_err(|e| bad(format!("hashing it: {e}")))?;
        let tree_sha256 = tree_sha256.map_err(|e| bad(format!("tree hash: {e}")))?;
        for index in matching {
            let artifact = &artifacts[index];
            let fetched = Fetched {
                name: artifact.name.clone(),
                filename: artifact.filename.clone(),
                path: path.clone(),
                provenance: Provenance::Override {
                    path: path.clone(),
                    sha256: sha256.clone(),
                    tree_sha256: tree_sha256.clone(),
                },
                origin: Origin::Local { path: path.clone() },
                bytes_downloaded: 0,
                bad_sources: Vec::new(),
            };
            by_index.insert(index, fetched);
        }
    }
    Ok(by_index)
}

/// What every artifact of one `fetch_all` shares.
pub(crate) struct Run<'a> {
    pub(crate) cache: Cache,
    pub(crate) client: Option<reqwest::Client>,
    pub(crate) options: &'a FetchOptions,
    pub(crate) progress: Progress,
    pub(crate) policy: RetryPolicy,
}

impl<'a> Run<'a> {
    /// A run with `options`' client (none offline) and retry policy.
    pub(crate) fn new(options: &'a FetchOptions) -> Result<Run<'a>, FetchError> {
        let client = match options.offline {
            true => None,
            false => Some(http_client(options)?),
        };
        Ok(Run {
            cache: Cache::new(&options.cache_dir),
            client,
            options,
            progress: Progress::new(options.progress),
            policy: RetryPolicy {
                retries: options.retries,
                backoff: options.backoff,
                max_backoff: options.max_backoff,
                max_retry_after: options.max_retry_after,
            },
        })
    }
}

/// What to do with the bytes one source gave.
enum Verdict {
    /// Keep them: commit under their sha256, with this provenance.
    Accept(Provenance),
    /// A resumed file failed the check: drop it and fetch this source once more from byte 0.
    RetryFromScratch,
    Reject(SourceError),
}

impl Run<'_> {
    async fn fetch_one(&self, artifact: &Artifact) -> Result<Fetched, ArtifactFailure> {
        let failure = |attempts: Vec<SourceFailure>| ArtifactFailure {
            name: artifact.name.clone(),
            filename: artifact.filename.clone(),
            pin: artifact.pin(),
            attempts,
        };
        let cache_failure = |message: String| {
            failure(vec![SourceFailure {
                url: self.cache.root().display().to_string(),
                error: SourceError::Io { message },
            }])
        };
        let fetched = |path, provenance, origin, bytes_downloaded| Fetched {
            name: artifact.name.clone(),
            filename: artifact.filename.clone(),
            path,
            provenance,
            origin,
            bytes_downloaded,
            bad_sources: Vec::new(),
        };
        if !artifact.is_pinned() {
            let url = artifact.urls.first().cloned().unwrap_or_default();
            return Err(failure(vec![SourceFailure {
                url,
                error: SourceError::Unpinned,
            }]));
        }
        let key = artifact.cache_key();
        let bar = self.progress.bar(&artifact.name, artifact.size);
        let _lock = self
            .cache
            .lock(&key, || {
                bar.set_message("waiting for another process fetching it")
            })
            .await
            .map_err(|e| cache_failure(format!("{e}")))?;
        if let Some((path, provenance)) = self
            .cached(artifact)
            .map_err(|e| cache_failure(format!("{e}")))?
        {
            bar.finish_and_clear();
            return Ok(fetched(path, provenance, Origin::Cache, 0));
        }

        let sources = sources_for(artifact, &self.options.mirrors).map_err(|message| {
            failure(vec![SourceFailure {
                url: artifact.urls.join(" "),
                error: SourceError::Io { message },
            }])
        })?;
        let part = self.cache.partial_path(&key);
        let mut attempts = Vec::new();
        let mut bytes_downloaded = 0;
        for source in &sources {
            let label = source.label();
            if self.options.offline && source.needs_network() {
                attempts.push(SourceFailure {
                    url: label,
                    error: SourceError::SkippedOffline,
                });
                continue;
            }
            let origin = match source.is_mirror() {
                true => Origin::Mirror { url: label.clone() },
                false => Origin::Upstream { url: label.clone() },
            };
            let mut restarted = false;
            let error = loop {
                let got = match self.get_bytes(source, &part, artifact.size, &bar).await {
                    Ok(got) => got,
                    Err(error) => {
                        if matches!(error, SourceError::SizeMismatch { .. }) {
                            let _ = std::fs::remove_file(&part);
                        }
                        break error;
                    }
                };
                bytes_downloaded += got.transferred;
                match self.judge(artifact, &part, &got, restarted).await {
                    Verdict::Accept(provenance) => {
                        let path =
                            self.commit(&part, artifact, &got, &provenance)
                                .map_err(|e| {
                                    cache_failure(format!(
                                        "moving {} into the cache: {e}",
                                        part.display()
                                    ))
                                })?;
                        bar.finish_and_clear();
                        // A source (a mirror, tried first) that served wrong bytes is named
                        // even though another then worked: it will fail someone offline.
                        let mut item = fetched(path, provenance, origin, bytes_downloaded);
                        item.bad_sources = self.name_bad_sources(artifact, &label, &attempts);
                        return Ok(item);
                    }
                    Verdict::RetryFromScratch => {
                        restarted = true;
                        let _ = std::fs::remove_file(&part);
                    }
                    Verdict::Reject(error) => {
                        let _ = std::fs::remove_file(&part);
                        break error;
                    }
                }
            };
            attempts.push(SourceFailure { url: label, error });
        }
        bar.abandon_with_message("failed");
        Err(failure(attempts))
    }

    /// The sources tried before `label` that served wrong bytes, each said as a warning:
    /// a mirror tried first that is damaged will fail someone offline.
    fn name_bad_sources(
        &self,
        artifact: &Artifact,
        label: &str,
        attempts: &[SourceFailure],
    ) -> Vec<String> {
        let mut named = Vec::new();
        for bad in attempts.iter().filter(|a| a.is_damage()) {
            let line = format!("{} served bad bytes ({})", bad.url, bad.error);
            self.progress
                .println(&commstack_digest::terminal_safe_capped(
                    &format!(
                        "WARNING {}: {line}; fetched from {label} instead",
                        artifact.filename
                    ),
                    4096,
                ));
            named.push(line);
        }
        named
    }

    /// The artifact as a previous run cached it. An archive accepted by tree hash (a tree
    /// match the user accepted once, or the archive of a tree-pinned source) is found
    /// through its record, with or without `accept_tree_match`, and is held to the sha256
    /// the record names: re-hashed at every use, as nothing else pins those bytes.
    fn cached(&self, artifact: &Artifact) -> std::io::Result<Option<(PathBuf, Provenance)>> {
        let hit = match (&artifact.sha256, &artifact.tree_sha256) {
            (Some(sha256), _) => match self.cache.get(sha256, &artifact.filename)? {
                Some(path) => Some((
                    path,
                    Provenance::Locked {
                        sha256: sha256.clone(),
                    },
                )),
                None => self
                    .cache
                    .tree_match(sha256)?
                    .filter(|(record, _)| {
                        artifact.tree_sha256.as_ref() == Some(&record.tree_sha256)
                    })
                    .map(|(record, path)| (path, tree_match_provenance(record))),
            },
            (None, Some(tree)) => self.cache.by_tree(tree)?.map(|(record, path)| {
                (
                    path,
                    Provenance::LockedTree {
                        sha256: record.sha256,
                        tree_sha256: record.tree_sha256,
                    },
                )
            }),
            (None, None) => None,
        };
        let Some((path, provenance)) = &hit else {
            return Ok(hit);
        };
        let cached_as = match provenance {
            // --verify: a file cached under the lock's own sha256 is re-hashed too.
            Provenance::Locked { sha256 } if self.options.verify => sha256,
            Provenance::Locked { .. } | Provenance::Override { .. } => return Ok(hit),
            Provenance::LockedTree { sha256, .. } => sha256,
            Provenance::TreeMatch { actual_sha256, .. } => actual_sha256,
        };
        if let Err(damaged) = crate::cache::check_cached_file(path, cached_as) {
            // Quarantined: fall through to the sources.
            self.progress.println(&format!("WARNING {damaged}"));
            return Ok(None);
        }
        Ok(hit)
    }

    /// Checks what one source gave against the lock's pin.
    async fn judge(
        &self,
        artifact: &Artifact,
        part: &Path,
        got: &Downloaded,
        restarted: bool,
    ) -> Verdict {
        // A resumed file may have begun with another version's bytes: try once more from
        // the first byte before blaming the source.
        let may_retry = got.resumed_from > 0 && !restarted;
        match &artifact.sha256 {
            Some(expected) if *expected == got.sha256 => Verdict::Accept(Provenance::Locked {
                sha256: got.sha256.clone(),
            }),
            Some(_) if may_retry => Verdict::RetryFromScratch,
            Some(expected) => {
                let tree = check_tree(artifact, part).await;
                if tree == TreeCheck::Matches && self.options.accept_tree_match {
                    return Verdict::Accept(Provenance::TreeMatch {
                        locked_sha256: expected.clone(),
                        actual_sha256: got.sha256.clone(),
                        tree_sha256: artifact
                            .tree_sha256
                            .clone()
                            .expect("a tree match implies a locked tree hash"),
                    });
                }
                Verdict::Reject(SourceError::HashMismatch {
                    expected: expected.clone(),
                    actual: got.sha256.clone(),
                    size: got.size,
                    tree,
                })
            }
            None => match check_tree(artifact, part).await {
                TreeCheck::Matches => Verdict::Accept(Provenance::LockedTree {
                    sha256: got.sha256.clone(),
                    tree_sha256: artifact
                        .tree_sha256
                        .clone()
                        .expect("validated: tree-pinned"),
                }),
                _ if may_retry => Verdict::RetryFromScratch,
                found => Verdict::Reject(SourceError::TreeMismatch {
                    expected: artifact.tree_sha256.clone().unwrap_or_default(),
                    found,
                    sha256: got.sha256.clone(),
                }),
            },
        }
    }

    /// Moves accepted bytes into the cache under their own sha256, and records how they
    /// answer the lock when that is not by sha256.
    fn commit(
        &self,
        part: &Path,
        artifact: &Artifact,
        got: &Downloaded,
        provenance: &Provenance,
    ) -> std::io::Result<PathBuf> {
        let path = self.cache.commit(part, &got.sha256, &artifact.filename)?;
        match provenance {
            Provenance::TreeMatch {
                locked_sha256,
                actual_sha256,
                tree_sha256,
            } => {
                self.cache.record_tree_match(&TreeMatchRecord {
                    locked_sha256: locked_sha256.clone(),
                    actual_sha256: actual_sha256.clone(),
                    filename: artifact.filename.clone(),
                    tree_sha256: tree_sha256.clone(),
                })?;
            }
            Provenance::LockedTree {
                sha256,
                tree_sha256,
            } => {
                self.cache.record_tree(&TreeRecord {
                    tree_sha256: tree_sha256.clone(),
                    sha256: sha256.clone(),
                    filename: artifact.filename.clone(),
                })?;
            }
            Provenance::Locked { .. } | Provenance::Override { .. } => {}
        }
        Ok(path)
    }

    pub(crate) async fn get_bytes(
        &self,
        source: &Source,
        part: &Path,
        size: Option<u64>,
        bar: &ProgressBar,
    ) -> Result<Downloaded, SourceError> {
        match source {
            Source::Http { url, .. } => {
                let client = self
                    .client
                    .as_ref()
                    .expect("http sources are skipped offline");
                download::download_http(client, url, part, size, &self.policy, bar).await
            }
            Source::File { path, .. } => {
                let (path, part, bar) = (path.clone(), part.to_path_buf(), bar.clone());
                bar.set_position(0);
                tokio::task::spawn_blocking(move || download::copy_local(&path, &part, &bar))
                    .await
                    .expect("local copy panicked")
            }
        }
    }
}

fn tree_match_provenance(record: TreeMatchRecord) -> Provenance {
    Provenance::TreeMatch {
        locked_sha256: record.locked_sha256,
        actual_sha256: record.actual_sha256,
        tree_sha256: record.tree_sha256,
    }
}

/// Compares the downloaded archive's tree hash with the locked one, if the lock has one.
/// The archive is unpacked (by the one unpacker) next to it, in the cache's `tmp/`.
async fn check_tree(artifact: &Artifact, part: &Path) -> TreeCheck {
    let Some(locked) = artifact.tree_sha256.clone() else {
        return TreeCheck::NotLocked;
    };
    if tree::ArchiveKind::from_name(&artifact.filename).is_none() {
        return TreeCheck::Unreadable {
            message: format!(
                "{}: no tree hash for this file type",
                commstack_digest::terminal_safe_capped(
                    &artifact.filename,
                    commstack_digest::SHOWN_NAME_MAX
                )
            ),
        };
    }
    let part = part.to_path_buf();
    let actual = tokio::task::spawn_blocking(move || {
        let scratch = part.parent().map(Path::to_path_buf).unwrap_or_default();
        tree::tree_sha256_archive_in(&part, &scratch)
    })
    .await
    .expect("tree hashing panicked");
    match actual {
        Ok(actual) if actual == locked => TreeCheck::Matches,
        Ok(actual) => TreeCheck::Differs { actual },
        Err(err) => TreeCheck::Unreadable {
            message: err.to_string(),
        },
    }
}
