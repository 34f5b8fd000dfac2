//! Pulling: a manifest found by its tag, documents read whole within their bounds, and
//! blobs downloaded to files with their sha256 checked while they stream. What `build
//! --substitute` uses to take a step's output from the binary cache instead of building it.
//!
//! Every GET goes through [`crate::bounded`] (oci-client logs in; it reads bodies whole):
//! a manifest over 4 MiB, a document longer than its descriptor or its kind's bound, a
//! blob longer than its descriptor, are each refused as they stream.
//!
//! A download goes to a `.part` file the caller names; an interrupted one (the registry
//! gone, the process killed) is continued on the next attempt or rerun from the bytes it
//! has, with an HTTP range request, and the whole file is hashed again before it counts.
//! A registry that ignores the range sends the blob whole, and the file starts over.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest, Sha256};

use crate::auth::Credentials;
use crate::bounded::{Body, Document, read_bounded, shown};
use crate::layout::MANIFEST_MEDIA_TYPE;
use crate::progress::{Progress, blob_bar};
use crate::push::{PushOptions, Site, client_for, root_cause, runtime, transient, with_retry};

/// A manifest found under a tag.
#[derive(Clone, Debug)]
pub struct Found {
    pub tag: String,
    /// `sha256:<hex>` of the manifest's bytes, computed here (not the registry's word).
    pub digest: String,
    pub manifest: Vec<u8>,
}

/// How the GETs of a pull authenticate: what oci-client's log-in gave.
#[derive(Clone)]
enum Auth {
    Anonymous,
    Bearer(String),
    Basic(String, String),
}

/// A pulling session with one repository: one runtime and one client for all its
/// requests, so its connections are reused and a bearer registry's token is fetched once
/// (not once per blob: a token service may be another host, and rate-limits). A token that
/// expires during a long pull (the registry answers 401) is fetched again, once.
pub struct Puller {
    pub(crate) options: PushOptions,
    runtime: tokio::runtime::Runtime,
    /// oci-client: the log-in (the bearer-token dance).
    pub(crate) client: Client,
    /// reqwest, set up as oci-client's: the GETs, read within bounds ([`crate::bounded`]).
    http: reqwest::Client,
    /// `https://HOST/v2/REPO`.
    base: String,
    pub(crate) credentials: Credentials,
    pub(crate) site: Site,
    /// None until logged in.
    auth: tokio::sync::Mutex<Option<Auth>>,
}

impl Puller {
    pub fn new(options: &PushOptions) -> Result<Puller> {
        let (client, credentials) = client_for(options)?;
        Ok(Puller {
            site: Site::new(options, &credentials, "pull"),
            options: options.clone(),
            runtime: runtime()?,
            client,
            http: crate::bounded::http_client(options)?,
            base: crate::bounded::base_url(options),
            credentials,
            auth: tokio::sync::Mutex::new(None),
        })
    }

    pub(crate) fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// `host/repo:tag`, for messages.
    pub(crate) fn place(&self, tag: &str) -> String {
        format!("{}:{tag}", self.options.target.name())
    }

    /// How to authenticate after oci-client's log-in gave `token` (a bearer registry's).
    fn auth_of(&self, token: Option<String>) -> Auth {
        match (token, &self.credentials.auth) {
            (Some(token), _) => Auth::Bearer(token),
            (None, RegistryAuth::Basic(user, password)) => {
                Auth::Basic(user.clone(), password.clone())
            }
            (None, RegistryAuth::Bearer(token)) => Auth::Bearer(token.clone()),
            (None, RegistryAuth::Anonymous) => Auth::Anonymous,
        }
    }

    /// oci-client's log-in for pulls: a bearer registry's token, or none.
    async fn authenticate(&self) -> std::result::Result<Option<String>, OciDistributionError> {
        let target = &self.options.target;
        let reference = Reference::with_tag(
            target.registry.clone(),
            target.repository.clone(),
            "latest".to_string(),
        );
        self.client
            .auth(&reference, &self.credentials.auth, RegistryOperation::Pull)
            .await
    }

    /// Logs in for pulls unless done already.
    pub(crate) async fn log_in(&self, what: &str, progress: &Progress) -> Result<()> {
        let mut auth = self.auth.lock().await;
        if auth.is_some() {
            return Ok(());
        }
        let token = with_retry(&self.options.retry, "logging in", progress, || {
            self.authenticate()
        })
        .await
        .map_err(|e| self.site.fail(what, e))?;
        *auth = Some(self.auth_of(token));
        Ok(())
    }

    /// A GET of `path` (below `/v2/REPO/`) from `from` on (a range), answered with a
    /// success: its body is the caller's to read within bounds. Any other answer is the
    /// error it means, its body read no further than 16 KiB.
    pub(crate) async fn get(
        &self,
        path: &str,
        accept: &str,
        from: Option<u64>,
    ) -> std::result::Result<reqwest::Response, OciDistributionError> {
        let url = format!("{}/{path}", self.base);
        let mut refreshed = false;
        loop {
            let auth = self.auth.lock().await.clone().unwrap_or(Auth::Anonymous);
            let mut request = self.http.get(&url).header(reqwest::header::ACCEPT, accept);
            request = match &auth {
                Auth::Anonymous => request,
                Auth::Bearer(token) => request.bearer_auth(token),
                Auth::Basic(user, password) => request.basic_auth(user, Some(password)),
            };
            if let Some(from) = from {
                request = request.header(reqwest::header::RANGE, format!("bytes={from}-"));
            }
            let response = request.send().await?;
            if response.status() == reqwest::StatusCode::UNAUTHORIZED
                && matches!(auth, Auth::Bearer(_))
                && !refreshed
            {
                // The token expired during a long pull: a new one, once.
                refreshed = true;
                let token = self.authenticate().await?;
                *self.auth.lock().await = Some(self.auth_of(token));
                continue;
            }
            if response.status().is_success() {
                return Ok(response);
            }
            return Err(crate::bounded::error_answer(response).await);
        }
    }

    /// The manifest tagged `tag` in the repository; None when there is no such tag.
    pub fn find_tag(&self, tag: &str) -> Result<Option<Found>> {
        let what = format!("looking up {}", self.place(tag));
        let Some(bytes) = self.block_on(self.tagged_manifest(tag, &what))? else {
            return Ok(None);
        };
        Ok(Some(Found {
            tag: tag.to_string(),
            digest: format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
            manifest: bytes,
        }))
    }

    /// The raw manifest tagged `tag`, read within [`Document::Manifest`]'s bound; None
    /// when the registry has no such tag. `what` names the look-up in errors.
    pub(crate) async fn tagged_manifest(&self, tag: &str, what: &str) -> Result<Option<Vec<u8>>> {
        let progress = Progress::new(false);
        self.log_in(what, &progress).await?;
        let limit = Document::Manifest.limit();
        let slowest = &self.options.slowest;
        let got = with_retry(&self.options.retry, what, &progress, || {
            in_time(slowest.deadline(limit), async {
                let response = self
                    .get(&format!("manifests/{tag}"), MANIFEST_MEDIA_TYPE, None)
                    .await?;
                read_bounded(response, limit).await
            })
        })
        .await;
        match got {
            Ok(Body::Whole(bytes)) => Ok(Some(bytes)),
            Ok(Body::Late) => bail!(
                "{}: its manifest did not come within {} (docs/bounds.md): the registry is too slow or stalled; refusing it",
                self.place(tag),
                slowest.said(limit)
            ),
            Ok(Body::Over { bytes, announced }) => bail!(
                "{}: its manifest is larger than {} ({bytes} bytes {}): refusing it",
                self.place(tag),
                Document::Manifest.bound(),
                match announced {
                    true => "announced",
                    false => "received before it was refused",
                }
            ),
            Err(err) if is_not_found(&err) => Ok(None),
            Err(err) => Err(self.site.fail(what, err)),
        }
    }

    /// The manifest `digest` (by digest, not a tag), read within [`Document::Manifest`]'s
    /// bound and checked against its digest; None when the registry has no such manifest.
    pub(crate) async fn manifest_by_digest(
        &self,
        digest: &str,
        what: &str,
    ) -> Result<Option<Vec<u8>>> {
        let want = sha256_hex_of(digest)?;
        let Some(bytes) = self.tagged_manifest(digest, what).await? else {
            return Ok(None);
        };
        let got = hex::encode(Sha256::digest(&bytes));
        if got != want {
            bail!(
                "{}@{digest}: the registry sent a manifest whose sha256 is {got}: refusing it (the registry's copy is damaged or was altered)",
                self.options.target.name()
            );
        }
        Ok(Some(bytes))
    }

    /// The referrers of the manifest `digest` (OCI 1.1: `GET /v2/<repo>/referrers/<digest>`
    /// answers an image index of the manifests whose `subject` it is), those of
    /// `artifact_type` only when given; None when the registry has no referrers API (it
    /// answers 404, as registries before distribution spec 1.1 do). The index is read
    /// within a manifest's bound.
    pub fn referrers(
        &self,
        digest: &str,
        artifact_type: Option<&str>,
    ) -> Result<Option<Vec<Referrer>>> {
        self.block_on(self.referrers_async(digest, artifact_type))
    }

    pub(crate) async fn referrers_async(
        &self,
        digest: &str,
        artifact_type: Option<&str>,
    ) -> Result<Option<Vec<Referrer>>> {
        sha256_hex_of(digest)?;
        let repo = self.options.target.name();
        let what = format!("listing the referrers of {repo}@{digest}");
        let progress = Progress::new(false);
        self.log_in(&what, &progress).await?;
        let limit = Document::Manifest.limit();
        let slowest = &self.options.slowest;
        let got = with_retry(&self.options.retry, &what, &progress, || {
            in_time(slowest.deadline(limit), async {
                // The filter is a hint (a registry may ignore it): the list is filtered here too.
                let path = match artifact_type {
                    Some(t) => format!("referrers/{digest}?artifactType={}", url_escape(t)),
                    None => format!("referrers/{digest}"),
                };
                let response = self.get(&path, INDEX_MEDIA_TYPE, None).await?;
                read_bounded(response, limit).await
            })
        })
        .await;
        let bytes = match got {
            Ok(Body::Whole(bytes)) => bytes,
            Ok(Body::Late) => bail!(
                "{what}: the index did not come within {} (docs/bounds.md): the registry is too slow or stalled",
                slowest.said(limit)
            ),
            Ok(Body::Over { bytes, .. }) => bail!(
                "{what}: the index is larger than {} ({bytes} bytes): refusing it",
                Document::Manifest.bound()
            ),
            // No such endpoint: a registry without the referrers API (docker-registry 2.8
            // answers 404 with no error envelope). A repository the registry does not have
            // yet is NAME_UNKNOWN even where the API is: nothing refers to anything there.
            Err(err) if is_not_found(&err) || not_found_status(&err) => {
                return Ok(None);
            }
            Err(err) => return Err(self.site.fail(&what, err)),
        };
        let index: ReferrersIndex = serde_json::from_slice(&bytes)
            .with_context(|| format!("{what}: the registry's answer is not an OCI image index"))?;
        Ok(Some(
            index
                .manifests
                .into_iter()
                .filter(|r| artifact_type.is_none_or(|t| r.artifact_type.as_deref() == Some(t)))
                .collect(),
        ))
    }

    /// The blob `digest` read whole into memory: a `kind` document whose descriptor says
    /// `size` bytes. Refused before it is asked for when `size` passes the kind's bound,
    /// and as it streams when it passes `size`; its sha256 checked.
    pub fn pull_document(&self, digest: &str, size: u64, kind: Document) -> Result<Vec<u8>> {
        self.block_on(self.document(digest, size, kind))
    }

    pub(crate) async fn document(
        &self,
        digest: &str,
        size: u64,
        kind: Document,
    ) -> Result<Vec<u8>> {
        let want = sha256_hex_of(digest)?;
        let repo = self.options.target.name();
        let name = kind.name();
        if size > kind.limit() {
            bail!(
                "the {name} {digest} of {repo} is {size} bytes by its descriptor, more than {}: refusing it",
                kind.bound()
            );
        }
        let what = format!("reading the {name} {digest} ({size} bytes)");
        let progress = Progress::new(false);
        self.log_in(&what, &progress).await?;
        let slowest = &self.options.slowest;
        let got = with_retry(&self.options.retry, &what, &progress, || {
            in_time(slowest.deadline(size), async {
                let response = self.get(&format!("blobs/{digest}"), "*/*", None).await?;
                read_bounded(response, size).await
            })
        })
        .await;
        let bytes = match got {
            Ok(Body::Whole(bytes)) => bytes,
            Ok(Body::Late) => bail!(
                "the {name} {digest} from {repo} did not come within {} (docs/bounds.md): the registry is too slow or stalled; refusing it",
                slowest.said(size)
            ),
            Ok(Body::Over { bytes, announced }) => bail!(
                "the {name} {digest} from {repo} is longer than the {size} bytes its descriptor names ({bytes} bytes {}): refusing it (the registry's copy is damaged or was altered)",
                match announced {
                    true => "announced",
                    false => "received before it was refused",
                }
            ),
            Err(err) if blob_unknown(&err) => {
                return Err(anyhow::Error::new(err).context(format!(
                    "{what}: the registry has no such blob in {repo} (a manifest names it, the blob is gone): push it again"
                )));
            }
            Err(err) => return Err(self.site.fail(&what, err)),
        };
        let got = hex::encode(Sha256::digest(&bytes));
        if bytes.len() as u64 != size || got != want {
            bail!(
                "the {name} {digest} from {repo} is not what its descriptor names: {} bytes with sha256:{got}, expected {size} bytes: refusing it (the registry's copy is damaged or was altered)",
                bytes.len()
            );
        }
        Ok(bytes)
    }

    /// [`pull_blob`] in this session.
    pub fn pull_blob(&self, digest: &str, size: u64, part: &Path) -> Result<()> {
        self.block_on(self.pull_blob_resuming(self.options.progress, digest, size, part))
    }

    /// Several blobs, `jobs` at a time, each as [`pull_blob`] downloads it; stops at the
    /// first failure (the others keep what they received, for the rerun). One stream at a
    /// time leaves the second core and the disk idle while a multi-GB image comes in.
    /// `landed` is told of each blob as soon as it is whole and its sha256 checked.
    pub fn pull_blobs(
        &self,
        blobs: &[Wanted],
        jobs: usize,
        landed: &dyn Fn(&Wanted),
    ) -> Result<()> {
        // One bar per blob would interleave: the caller says what is coming instead.
        self.block_on(async {
            futures::stream::iter(blobs.iter().map(|w| async {
                self.pull_blob_resuming(false, &w.digest, w.size, &w.part)
                    .await
                    .with_context(|| shown(&w.name))?;
                landed(w);
                Ok(())
            }))
            .buffer_unordered(jobs.max(1))
            // The first failure drops the downloads under way (their part files stay).
            .try_collect::<Vec<()>>()
            .await
            .map(drop)
        })
    }
}

/// The media type of an OCI image index (what the referrers API answers).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// One manifest of a referrers index.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct Referrer {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(rename = "artifactType", default)]
    pub artifact_type: Option<String>,
}

#[derive(serde::Deserialize)]
struct ReferrersIndex {
    #[serde(default)]
    manifests: Vec<Referrer>,
}

/// A query value escaped (an artifact type holds `/` and `+`).
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// An answer that means the registry does not route the endpoint: an error envelope of
/// "not found" or "unsupported", or 405 (some registries answer an unknown route so).
fn not_found_status(err: &OciDistributionError) -> bool {
    use oci_client::errors::OciErrorCode;
    match err {
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::NameUnknown
                    | OciErrorCode::ManifestUnknown
                    | OciErrorCode::NotFound
                    | OciErrorCode::Unsupported
            )
        }),
        OciDistributionError::ServerError { code: 405, .. } => true,
        _ => false,
    }
}

/// `read`, or [`Body::Late`] when it has not ended within `deadline`.
async fn in_time(
    deadline: std::time::Duration,
    read: impl std::future::Future<Output = std::result::Result<Body, OciDistributionError>>,
) -> std::result::Result<Body, OciDistributionError> {
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or(Ok(Body::Late))
}

/// The hex of a `sha256:<64 hex>` digest; an error for anything else.
fn sha256_hex_of(digest: &str) -> Result<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .with_context(|| format!("{:?} is not a sha256 digest", shown(digest)))
}

/// The manifest tagged `tag` in the options' repository; None when there is no such tag.
pub fn find_tag(options: &PushOptions, tag: &str) -> Result<Option<Found>> {
    Puller::new(options)?.find_tag(tag)
}

/// Downloads the blob `digest` (`size` bytes) of the options' repository into `part`,
/// continuing what `part` holds already; on Ok the file is the whole blob and its sha256
/// is `digest`. A blob whose bytes do not hash to its digest is removed and refused.
pub fn pull_blob(options: &PushOptions, digest: &str, size: u64, part: &Path) -> Result<()> {
    Puller::new(options)?.pull_blob(digest, size, part)
}

/// A blob to download.
#[derive(Clone, Debug)]
pub struct Wanted {
    /// `sha256:<hex>`.
    pub digest: String,
    pub size: u64,
    /// The file it goes to.
    pub part: std::path::PathBuf,
    /// What it is, for errors (`image-layer-<hash>/layer.tar`).
    pub name: String,
}

impl Puller {
    async fn pull_blob_resuming(
        &self,
        progress: bool,
        digest: &str,
        size: u64,
        part: &Path,
    ) -> Result<()> {
        let resumed = std::fs::metadata(part).is_ok_and(|m| m.len() > 0);
        match pull_blob_in(self, progress, digest, size, part).await {
            // The bytes an earlier run left may be what was wrong (another blob's, a
            // damaged disk): the file is gone now, so once more from the first byte.
            Err(_) if resumed && !part.exists() => {
                pull_blob_in(self, progress, digest, size, part).await
            }
            other => other,
        }
    }
}

async fn pull_blob_in(
    puller: &Puller,
    progress: bool,
    digest: &str,
    size: u64,
    part: &Path,
) -> Result<()> {
    let options = &puller.options;
    let site = &puller.site;
    let target = &options.target;
    let want = sha256_hex_of(digest)?;
    let progress = Progress::new(progress);
    let what = format!("downloading the blob {digest} ({size} bytes)");
    puller.log_in(&what, &progress).await?;
    let path = format!("blobs/{digest}");

    let bar = blob_bar(&progress, "blob", size);
    let mut failures = 0u32;
    let (hasher, have) = loop {
        // What an earlier attempt (or run) left: hashed again, then continued.
        let (mut hasher, have) = hash_part(part)?;
        if have > size {
            std::fs::remove_file(part)?;
            continue;
        }
        bar.set_position(have);
        let mut have = have;
        // Within the time what is left may take at the slowest rate allowed.
        let slowest = &options.slowest;
        let attempt = tokio::time::timeout(
            slowest.deadline(size - have),
            download(puller, &path, size, part, &mut hasher, &mut have, &bar),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Failed::Stream(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the rest of the blob did not come within {} (docs/bounds.md): the registry is too slow or stalled",
                    slowest.said(size - have)
                ),
            )))
        });
        match attempt {
            // Hashed as it streamed: the bytes that were there, then those received.
            Ok(()) => break (hasher, have),
            Err(Failed::Local(e)) => {
                return Err(e.context(format!("writing {}", part.display())));
            }
            Err(Failed::Registry(e)) if blob_unknown(&e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "{what}: the registry {} has no such blob in {} (its manifest names it, the blob is gone): push the output again (`cargo xtask cache push`)",
                    target.registry, target.repository
                )));
            }
            Err(Failed::Registry(e)) if !transient(&e) => {
                return Err(kept(site.fail(&what, e), digest, part));
            }
            Err(Failed::TooLong) => {
                let _ = std::fs::remove_file(part);
                bail!(
                    "the blob {digest} from {} is longer than the {size} bytes its manifest names: refusing it (the registry's copy is damaged or was altered)",
                    target.name()
                );
            }
            Err(err) => {
                failures += 1;
                let cause = match &err {
                    Failed::Registry(e) => root_cause(e),
                    // The innermost: "peer closed connection", not "error decoding response body".
                    Failed::Stream(e) => root_cause(e),
                    Failed::Local(_) | Failed::TooLong => unreachable!(),
                };
                if failures >= options.retry.attempts.max(1) {
                    match err {
                        Failed::Registry(e) => return Err(kept(site.fail(&what, e), digest, part)),
                        _ => {
                            return Err(kept(
                                anyhow::anyhow!(
                                    "{what} from {}: {cause}, {failures} times",
                                    target.name()
                                ),
                                digest,
                                part,
                            ));
                        }
                    }
                }
                let wait = options.retry.backoff_for(failures);
                progress.println(&format!(
                    "{what}: {cause}; retrying in {:.1} s (attempt {} of {})",
                    wait.as_secs_f64(),
                    failures + 1,
                    options.retry.attempts
                ));
                tokio::time::sleep(wait).await;
            }
        }
    };
    bar.finish_and_clear();
    let got = hex::encode(hasher.finalize());
    if have != size || got != want {
        let _ = std::fs::remove_file(part);
        bail!(
            "the blob {digest} from {} is not what its manifest names: {have} bytes with sha256:{got}, expected {size} bytes: refusing it (the registry's copy is damaged or was altered)",
            target.name()
        );
    }
    Ok(())
}

/// One attempt at the blob at `path` (`size` bytes) into `part`, which holds `have` bytes
/// hashed into `hasher`: from there with a range request (from the start when the
/// registry ignores the range), each piece hashed and counted as it is written, refused
/// as soon as it runs past `size`.
async fn download(
    puller: &Puller,
    path: &str,
    size: u64,
    part: &Path,
    hasher: &mut Sha256,
    have: &mut u64,
    bar: &indicatif::ProgressBar,
) -> std::result::Result<(), Failed> {
    let (response, offset) = match *have {
        0 => (
            puller
                .get(path, "*/*", None)
                .await
                .map_err(Failed::Registry)?,
            0,
        ),
        h if h == size => return Ok(()),
        h => {
            let response = puller
                .get(path, "*/*", Some(h))
                .await
                .map_err(Failed::Registry)?;
            match response.status() {
                reqwest::StatusCode::PARTIAL_CONTENT => (response, h),
                // The registry ignored the range: the blob comes whole.
                _ => (response, 0),
            }
        }
    };
    // Buffered: the stream's chunks are small. Not synced: the file is hashed again
    // before a rerun continues it, so a crash costs a download, not trust.
    let mut file = std::io::BufWriter::with_capacity(
        1 << 20,
        std::fs::OpenOptions::new()
            .create(true)
            .append(offset > 0)
            .write(true)
            .truncate(offset == 0)
            .open(part)
            .map_err(|e| Failed::Local(e.into()))?,
    );
    if offset == 0 {
        *hasher = Sha256::new();
        *have = 0;
    }
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| Failed::Stream(std::io::Error::other(e)))?;
        // No more than the manifest names: a registry cannot fill the disk.
        if *have + chunk.len() as u64 > size {
            return Err(Failed::TooLong);
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(|e| Failed::Local(e.into()))?;
        *have += chunk.len() as u64;
        bar.inc(chunk.len() as u64);
    }
    file.flush().map_err(|e| Failed::Local(e.into()))
}

/// `err`, saying what of the blob `digest` a rerun continues from: what `part` holds.
fn kept(err: anyhow::Error, digest: &str, part: &Path) -> anyhow::Error {
    match std::fs::metadata(part).map(|m| m.len()).unwrap_or(0) {
        0 => err,
        bytes => err.context(format!(
            "the {bytes} bytes of the blob {digest} received are kept in {}: a rerun resumes the download from there",
            part.display()
        )),
    }
}

/// A 404 or BLOB_UNKNOWN for a blob.
fn blob_unknown(err: &OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode};
    match err {
        E::ServerError { code: 404, .. } => true,
        E::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| matches!(e.code, OciErrorCode::BlobUnknown | OciErrorCode::NotFound)),
        _ => is_not_found(err),
    }
}

/// Why one download attempt stopped.
enum Failed {
    Registry(OciDistributionError),
    /// The body stopped midway (the connection dropped).
    Stream(std::io::Error),
    Local(anyhow::Error),
    /// More bytes than the manifest names.
    TooLong,
}

/// The sha256 state over what `part` holds, and its length (0 when it does not exist).
fn hash_part(part: &Path) -> Result<(Sha256, u64)> {
    let mut hasher = Sha256::new();
    let mut file = match std::fs::File::open(part) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((hasher, 0)),
        Err(e) => return Err(e).with_context(|| format!("reading {}", part.display())),
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", part.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
    }
    Ok((hasher, total))
}

/// Reads the blob `digest` of the options' repository into memory, a `kind` document
/// (see [`Puller::pull_document`]).
pub fn pull_document(
    options: &PushOptions,
    digest: &str,
    size: u64,
    kind: Document,
) -> Result<Vec<u8>> {
    Puller::new(options)?.pull_document(digest, size, kind)
}

/// Whether the registry answered that the manifest or tag is not there.
pub(crate) fn is_not_found(err: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode};
    match err {
        E::ImageManifestNotFoundError(_) => true,
        E::ServerError { code: 404, .. } => true,
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NotFound
            )
        }),
        _ => false,
    }
}
