//! Pulling: a manifest found by its tag, and blobs downloaded to files with their sha256
//! checked while they stream. What `build --substitute` uses to take a step's output from
//! the binary cache instead of building it.
//!
//! A download goes to a `.part` file the caller names; an interrupted one (the registry
//! gone, the process killed) is continued on the next attempt or rerun from the bytes it
//! has, with an HTTP range request, and the whole file is hashed again before it counts.
//! A registry that ignores the range sends the blob whole, and the file starts over.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use oci_client::client::BlobResponse;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::{Digest, Sha256};

use crate::auth::Credentials;
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

/// A pulling session with one repository: one runtime and one client for all its
/// requests, so its connections are reused and a bearer registry's token is fetched once
/// (not once per blob: a token service may be another host, and rate-limits). A token that
/// expires during a long pull is fetched again by the client itself (oci-client keeps each
/// token's expiry and the credentials of the first log-in).
pub struct Puller {
    pub(crate) options: PushOptions,
    runtime: tokio::runtime::Runtime,
    pub(crate) client: Client,
    pub(crate) credentials: Credentials,
    pub(crate) site: Site,
    /// Logged in for pulls (the token, for a bearer registry, is in the client's cache).
    logged_in: tokio::sync::Mutex<bool>,
}

impl Puller {
    pub fn new(options: &PushOptions) -> Result<Puller> {
        let (client, credentials) = client_for(options)?;
        Ok(Puller {
            site: Site::new(options, &credentials, "pull"),
            options: options.clone(),
            runtime: runtime()?,
            client,
            credentials,
            logged_in: tokio::sync::Mutex::new(false),
        })
    }

    pub(crate) fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// Logs in for pulls unless done already.
    pub(crate) async fn log_in(&self, what: &str, progress: &Progress) -> Result<()> {
        let mut logged_in = self.logged_in.lock().await;
        if *logged_in {
            return Ok(());
        }
        let target = &self.options.target;
        let reference = Reference::with_tag(
            target.registry.clone(),
            target.repository.clone(),
            "latest".to_string(),
        );
        with_retry(&self.options.retry, "logging in", progress, || {
            self.client
                .auth(&reference, &self.credentials.auth, RegistryOperation::Pull)
        })
        .await
        .map_err(|e| self.site.fail(what, e))?;
        *logged_in = true;
        Ok(())
    }

    /// The manifest tagged `tag` in the repository; None when there is no such tag.
    pub fn find_tag(&self, tag: &str) -> Result<Option<Found>> {
        self.block_on(async {
            let target = &self.options.target;
            let reference = Reference::with_tag(
                target.registry.clone(),
                target.repository.clone(),
                tag.to_string(),
            );
            let what = format!("looking up {}:{tag}", target.name());
            let Some(bytes) = self.tagged_manifest(&reference, &what).await? else {
                return Ok(None);
            };
            Ok(Some(Found {
                tag: tag.to_string(),
                digest: format!("sha256:{}", hex::encode(Sha256::digest(&bytes))),
                manifest: bytes,
            }))
        })
    }

    /// Reads the raw manifest at `reference` (a tag); None when the registry has no such
    /// tag. `what` names the look-up in errors.
    pub(crate) async fn tagged_manifest(
        &self,
        reference: &Reference,
        what: &str,
    ) -> Result<Option<Vec<u8>>> {
        let progress = Progress::new(false);
        self.log_in(what, &progress).await?;
        let pulled = with_retry(&self.options.retry, what, &progress, || {
            self.client
                .pull_manifest_raw(reference, &self.credentials.auth, &[MANIFEST_MEDIA_TYPE])
        })
        .await;
        match pulled {
            Ok((bytes, _)) => Ok(Some(bytes.to_vec())),
            Err(err) if crate::signed::is_not_found(&err) => Ok(None),
            Err(err) => Err(self.site.fail(what, err)),
        }
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
                    .with_context(|| w.name.clone())?;
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

    /// [`pull_small_blob`] in this session.
    pub fn pull_small_blob(&self, digest: &str, size: u64) -> Result<Vec<u8>> {
        const MAX: u64 = 64 << 20;
        if size > MAX {
            bail!("the blob {digest} is {size} bytes, more than a config may be ({MAX})");
        }
        let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
        let part = dir.path().join("blob");
        self.pull_blob(digest, size, &part)?;
        Ok(std::fs::read(&part)?)
    }
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
    let (client, site) = (&puller.client, &puller.site);
    let target = &options.target;
    let want = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .with_context(|| format!("{digest:?} is not a sha256 digest"))?;
    let progress = Progress::new(progress);
    let reference = Reference::with_digest(
        target.registry.clone(),
        target.repository.clone(),
        digest.to_string(),
    );
    let what = format!("downloading the blob {digest} ({size} bytes)");
    puller.log_in(&what, &progress).await?;

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
        let attempt: std::result::Result<(), Failed> = async {
            let (stream, offset) = match have {
                0 => (
                    client
                        .pull_blob_stream(&reference, digest)
                        .await
                        .map_err(Failed::Registry)?,
                    0,
                ),
                _ if have == size => return Ok(()),
                _ => match client
                    .pull_blob_stream_partial(&reference, digest, have, None)
                    .await
                    .map_err(Failed::Registry)?
                {
                    BlobResponse::Partial(s) => (s, have),
                    // The registry ignored the range: the blob comes whole.
                    BlobResponse::Full(s) => (s, 0),
                },
            };
            // Buffered: the stream's chunks are small. Not synced: the file is hashed
            // again before a rerun continues it, so a crash costs a download, not trust.
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
                hasher = Sha256::new();
                have = 0;
            }
            let mut stream = stream.stream;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(Failed::Stream)?;
                // No more than the manifest names: a registry cannot fill the disk.
                if have + chunk.len() as u64 > size {
                    return Err(Failed::TooLong);
                }
                hasher.update(&chunk);
                file.write_all(&chunk)
                    .map_err(|e| Failed::Local(e.into()))?;
                have += chunk.len() as u64;
                bar.inc(chunk.len() as u64);
            }
            file.flush().map_err(|e| Failed::Local(e.into()))?;
            Ok(())
        }
        .await;
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
            Err(Failed::Registry(e)) if !transient(&e) => return Err(site.fail(&what, e)),
            Err(Failed::TooLong) => {
                let _ = std::fs::remove_file(part);
                bail!(
                    "the blob {digest} from {} is longer than the {size} bytes its manifest names: refusing it (the registry's copy is damaged or was altered)",
                    target.name()
                );
            }
            // oci-client's own check of a whole blob: the bytes are wrong, not late.
            Err(Failed::Stream(e))
                if e.get_ref()
                    .is_some_and(|inner| inner.is::<oci_client::errors::DigestError>()) =>
            {
                let _ = std::fs::remove_file(part);
                bail!(
                    "the blob {digest} from {} does not hash to its digest ({e}): refusing it (the registry's copy is damaged or was altered)",
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
                        Failed::Registry(e) => return Err(site.fail(&what, e)),
                        _ => bail!(
                            "{what} from {}: {cause}, {failures} times; the {} bytes received are kept in {} and a rerun continues from there",
                            target.name(),
                            std::fs::metadata(part).map(|m| m.len()).unwrap_or(0),
                            part.display()
                        ),
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

/// A 404 or BLOB_UNKNOWN for a blob.
fn blob_unknown(err: &oci_client::errors::OciDistributionError) -> bool {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode};
    match err {
        E::ServerError { code: 404, .. } => true,
        E::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| matches!(e.code, OciErrorCode::BlobUnknown | OciErrorCode::NotFound)),
        _ => crate::signed::is_not_found(err),
    }
}

/// Why one download attempt stopped.
enum Failed {
    Registry(oci_client::errors::OciDistributionError),
    /// The body stopped midway (the connection dropped, the digest check of oci-client).
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

/// Reads the blob `digest` of the options' repository into memory (a config: small),
/// checking its sha256.
pub fn pull_small_blob(options: &PushOptions, digest: &str, size: u64) -> Result<Vec<u8>> {
    Puller::new(options)?.pull_small_blob(digest, size)
}
