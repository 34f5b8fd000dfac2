//! PEP 691 JSON project pages and PEP 658 metadata, over HTTP with retries.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use commstack_http::{Answer, Bound, Get, HttpError, RetryPolicy};
use commstack_wheel::WheelFilename;
use pep440_rs::VersionSpecifiers;
use pep508_rs::PackageName;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::metadata::CoreMetadata;

const ACCEPT_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// A project page: PyPI's largest are a few MiB (thousands of files); 64 MiB is far
/// above any, and low enough that a hostile index cannot fill the memory with one.
pub const PAGE_BOUND: Bound = Bound {
    max_bytes: 64 << 20,
    time: Duration::from_secs(300),
};

/// A wheel's PEP 658 metadata: kilobytes, a long description at most a few MiB.
pub const METADATA_BOUND: Bound = Bound {
    max_bytes: 16 << 20,
    time: Duration::from_secs(120),
};

/// Four attempts, 0.2 s, 0.4 s, 0.8 s apart (or the index's `Retry-After`, up to 30 s).
const RETRY: RetryPolicy = RetryPolicy {
    retries: 3,
    backoff: Duration::from_millis(200),
    max_backoff: Duration::from_secs(10),
    max_retry_after: Duration::from_secs(30),
};

#[derive(Deserialize)]
struct RawPage {
    name: String,
    files: Vec<RawFile>,
}

#[derive(Deserialize)]
struct RawFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: HashMap<String, String>,
    #[serde(rename = "requires-python")]
    requires_python: Option<String>,
    #[serde(default)]
    yanked: serde_json::Value,
    #[serde(rename = "upload-time")]
    upload_time: Option<String>,
    size: Option<u64>,
    #[serde(rename = "core-metadata", alias = "dist-info-metadata", default)]
    core_metadata: serde_json::Value,
}

/// One file of a project page.
#[derive(Clone, Debug)]
pub struct IndexFile {
    pub filename: String,
    /// Absolute URL.
    pub url: String,
    pub sha256: Option<String>,
    pub requires_python: Option<VersionSpecifiers>,
    /// Some(reason) when yanked (PEP 592); the reason may be empty.
    pub yanked: Option<String>,
    pub upload_time: Option<jiff::Timestamp>,
    pub size: Option<u64>,
    /// sha256 of the PEP 658 metadata file, when the index announces one.
    pub metadata_sha256: Option<String>,
    /// None for sdists and anything that is not a wheel.
    pub wheel: Option<WheelFilename>,
}

#[derive(Clone, Debug)]
pub struct ProjectPage {
    pub name: PackageName,
    pub url: String,
    pub files: Vec<IndexFile>,
}

/// What the client did, for progress lines and benchmarks.
#[derive(Debug, Default)]
pub struct Stats {
    pub pages: AtomicU64,
    pub metadata_files: AtomicU64,
    pub metadata_from_wheel: AtomicU64,
    pub metadata_cached: AtomicU64,
    pub bytes: AtomicU64,
}

/// One project page, fetched at most once (None: the index does not know the project).
type PageCell = Arc<tokio::sync::OnceCell<Option<Arc<ProjectPage>>>>;

#[derive(Clone)]
pub struct IndexClient {
    client: reqwest::Client,
    base: String,
    /// Metadata keyed by the wheel's sha256: immutable, so cached forever.
    metadata_cache: Option<PathBuf>,
    /// Pages already fetched in this process (the target and the toolchain resolutions
    /// share projects such as cuda-toolkit).
    pages: Arc<tokio::sync::Mutex<HashMap<PackageName, PageCell>>>,
    pub stats: Arc<Stats>,
}

impl IndexClient {
    /// `base` is the simple index root, e.g. `https://pypi.org/simple`.
    pub fn new(base: &str, metadata_cache: Option<PathBuf>) -> Result<IndexClient> {
        let client = commstack_http::client(&commstack_http::ClientSettings::default())?;
        Ok(IndexClient {
            client,
            base: base.trim_end_matches('/').to_string(),
            metadata_cache,
            pages: Arc::default(),
            stats: Arc::default(),
        })
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn page_url(&self, name: &PackageName) -> String {
        format!("{}/{}/", self.base, name.as_ref())
    }

    /// The project's page; `Ok(None)` when the index does not know the project (404).
    /// Fetched once per client.
    pub async fn project(&self, name: &PackageName) -> Result<Option<Arc<ProjectPage>>> {
        let cell = self
            .pages
            .lock()
            .await
            .entry(name.clone())
            .or_default()
            .clone();
        cell.get_or_try_init(|| async { Ok(self.fetch_project(name).await?.map(Arc::new)) })
            .await
            .cloned()
    }

    async fn fetch_project(&self, name: &PackageName) -> Result<Option<ProjectPage>> {
        let url = self.page_url(name);
        let Some(answer) = self
            .get(&url, Some(ACCEPT_JSON), "the project page", PAGE_BOUND)
            .await?
        else {
            return Ok(None);
        };
        let final_url = answer.url;
        let ctype = answer
            .headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let body = answer.body;
        self.stats.pages.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        if !ctype.starts_with("application/vnd.pypi.simple.v1+json")
            && !ctype.starts_with("application/json")
        {
            bail!(
                "{url} answered {ctype:?}, not the PEP 691 JSON API: commstack needs an index that serves \
                 application/vnd.pypi.simple.v1+json (PyPI, devpi, Artifactory and pip's `--index-url` mirrors of them do)"
            );
        }
        let raw: RawPage = serde_json::from_slice(&body)
            .with_context(|| format!("{url}: not a PEP 691 project page"))?;
        let mut files = Vec::with_capacity(raw.files.len());
        for f in raw.files {
            let abs = final_url
                .join(&f.url)
                .with_context(|| format!("{url}: bad file URL {:?}", f.url))?
                .to_string();
            let yanked = match &f.yanked {
                serde_json::Value::Bool(true) => Some(String::new()),
                serde_json::Value::String(reason) => Some(reason.clone()),
                _ => None,
            };
            let metadata_sha256 = match &f.core_metadata {
                serde_json::Value::Object(h) => {
                    h.get("sha256").and_then(|v| v.as_str()).map(str::to_string)
                }
                _ => None,
            };
            let requires_python = match f.requires_python.as_deref().map(str::trim) {
                None | Some("") => None,
                // An unparseable Requires-Python on one old file must not sink the project.
                Some(s) => VersionSpecifiers::from_str(s).ok(),
            };
            files.push(IndexFile {
                wheel: WheelFilename::parse(&f.filename).ok(),
                filename: f.filename,
                url: abs,
                sha256: f.hashes.get("sha256").cloned(),
                requires_python,
                yanked,
                upload_time: f.upload_time.as_deref().and_then(|t| t.parse().ok()),
                size: f.size,
                metadata_sha256,
            });
        }
        let name = PackageName::from_str(&raw.name).unwrap_or_else(|_| name.clone());
        Ok(Some(ProjectPage { name, url, files }))
    }

    /// Core metadata of one wheel: the PEP 658 `.metadata` file when the index serves it
    /// (tried even when not announced), else METADATA read from the wheel by range requests.
    pub async fn metadata(&self, file: &IndexFile) -> Result<CoreMetadata> {
        if let Some(bytes) = self.cached_metadata(file) {
            self.stats.metadata_cached.fetch_add(1, Ordering::Relaxed);
            return CoreMetadata::parse(&bytes, &file.url);
        }
        let meta_url = format!("{}.metadata", file.url);
        let bytes = match self
            .get(&meta_url, None, "the metadata file", METADATA_BOUND)
            .await?
        {
            Some(answer) => {
                let bytes = answer.body;
                self.stats.metadata_files.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                if let Some(expected) = &file.metadata_sha256 {
                    let actual = hex::encode(Sha256::digest(&bytes));
                    if &actual != expected {
                        bail!(
                            "{meta_url}: sha256 mismatch: the index announced {expected}, the file has {actual}; \
                             the index or a proxy serves stale or corrupted metadata"
                        );
                    }
                }
                bytes
            }
            None => {
                let client = self.client.clone();
                let url = file.url.clone();
                let handle = tokio::runtime::Handle::current();
                let (bytes, fetched) = tokio::task::spawn_blocking(move || {
                    crate::remote_zip::wheel_metadata(client, &url, handle)
                })
                .await
                .map_err(|e| anyhow!("metadata reader panicked: {e}"))?
                .with_context(|| {
                    format!(
                        "{}: no .metadata file and the wheel could not be read",
                        file.filename
                    )
                })?;
                self.stats
                    .metadata_from_wheel
                    .fetch_add(1, Ordering::Relaxed);
                self.stats.bytes.fetch_add(fetched, Ordering::Relaxed);
                bytes
            }
        };
        let meta = CoreMetadata::parse(&bytes, &file.url)?;
        self.store_metadata(file, &bytes);
        Ok(meta)
    }

    /// The file names of one wheel (its zip directory), read by range requests without
    /// downloading the wheel: what it would install, e.g. to see which sonames it ships.
    pub async fn wheel_file_names(&self, file: &IndexFile) -> Result<Vec<String>> {
        let client = self.client.clone();
        let url = file.url.clone();
        let handle = tokio::runtime::Handle::current();
        let (names, fetched) = tokio::task::spawn_blocking(move || {
            crate::remote_zip::wheel_file_names(client, &url, handle)
        })
        .await
        .map_err(|e| anyhow!("wheel reader panicked: {e}"))?
        .with_context(|| format!("{}: reading the wheel's file list", file.filename))?;
        self.stats.bytes.fetch_add(fetched, Ordering::Relaxed);
        Ok(names)
    }

    fn cache_path(&self, file: &IndexFile) -> Option<PathBuf> {
        let dir = self.metadata_cache.as_ref()?;
        let sha = file.sha256.as_ref()?;
        Some(dir.join(format!("{sha}.metadata")))
    }

    fn cached_metadata(&self, file: &IndexFile) -> Option<Vec<u8>> {
        std::fs::read(self.cache_path(file)?).ok()
    }

    fn store_metadata(&self, file: &IndexFile, bytes: &[u8]) {
        let Some(path) = self.cache_path(file) else {
            return;
        };
        // Best effort, atomically: a cache we cannot write only costs time.
        if let Some(dir) = path.parent()
            && std::fs::create_dir_all(dir).is_ok()
        {
            let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }

    /// A bounded GET with retries on transient failures. `Ok(None)` on 404/410.
    async fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        what: &str,
        bound: Bound,
    ) -> Result<Option<Answer>> {
        let request = Get {
            url,
            accept,
            what,
            bound,
        };
        let answer = match commstack_http::get(&self.client, &request, &RETRY).await {
            Ok(answer) => answer,
            Err(e @ HttpError::GaveUp { .. }) => {
                bail!("{e}; is the index reachable? use a mirror with resolve.index-url")
            }
            Err(e @ (HttpError::TooLarge { .. } | HttpError::TooSlow { .. })) => bail!(
                "{e}; the bounds are in docs/bounds.md: try again later or use another index (resolve.index-url)"
            ),
            Err(e) => return Err(e.into()),
        };
        let status = answer.status;
        if status.is_success() {
            return Ok(Some(answer));
        }
        if status == reqwest::StatusCode::NOT_FOUND || status == reqwest::StatusCode::GONE {
            return Ok(None);
        }
        bail!("{} answered {status}", commstack_http::shown(url))
    }
}
