//! Pushing an OCI layout: blobs first (those the registry lacks, each checked against its
//! digest before any is sent), then the manifest by its digest, then the tags. The image
//! is then named by `host/repo@sha256:<manifest digest>`, which is what deploys pull.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use indicatif::ProgressBar;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use tokio::io::AsyncReadExt;

use crate::auth::{self, Credentials, PASSWORD_ENV, USER_ENV};
use crate::layout::{Blob, Layout, verify_blob};
use crate::progress::{Progress, blob_bar};
use crate::target::{Target, lock_tag, tag_from, valid_tag};

/// The label the image step writes with the lock's sha256 (docs/image.md).
pub const LOCK_LABEL: &str = "dev.commstack.lock.sha256";

/// Retries of one request (a blob upload, a HEAD, a manifest PUT) on connection errors,
/// timeouts, 5xx and 429: `attempts` in all, waiting `backoff`, doubled each time up to
/// `max_backoff`, between them.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
        }
    }
}

impl RetryPolicy {
    pub(crate) fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}

/// How to push.
#[derive(Clone, Debug)]
pub struct PushOptions {
    pub target: Target,
    /// A readable tag (`--tag`); None: made from the image's labels (see [`tags_for`]).
    pub tag: Option<String>,
    /// PEM file of the CA certificates to trust besides the system's (a registry with a
    /// private CA).
    pub ca_file: Option<PathBuf>,
    /// Blobs uploaded at once.
    pub jobs: usize,
    pub retry: RetryPolicy,
    /// Draw progress bars (when stderr is a terminal).
    pub progress: bool,
    /// None: from the environment and Docker's config file ([`auth::credentials`]).
    pub credentials: Option<Credentials>,
    /// How slowly a registry may send what a pull reads (docs/bounds.md).
    pub slowest: crate::deadline::Slowest,
    /// Push the manifest by digest only, none of its tags (a signed push tags it once its
    /// signature is there).
    pub untagged: bool,
    /// A signature (or attestation) pushed as a referrer goes under cosign's tag
    /// `sha256-<hex>.<kind>` too, for verifiers that read only the tag scheme (`cosign
    /// verify` without `--experimental-oci11`, the sigstore policy controller).
    pub tag_referrers: bool,
}

impl PushOptions {
    pub fn new(target: Target) -> PushOptions {
        PushOptions {
            target,
            tag: None,
            ca_file: None,
            jobs: 4,
            retry: RetryPolicy::default(),
            progress: true,
            credentials: None,
            slowest: crate::deadline::Slowest::default(),
            untagged: false,
            tag_referrers: false,
        }
    }
}

/// What a push did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Pushed {
    /// `host/repo@sha256:<manifest digest>`.
    pub reference: String,
    pub manifest_digest: String,
    /// The config's digest: the image ID Docker gives the pulled image.
    pub config_digest: String,
    pub tags: Vec<String>,
    /// Blobs sent, and blobs the registry had already (digests).
    pub uploaded: Vec<String>,
    pub present: Vec<String>,
    pub bytes_uploaded: u64,
}

/// The tags an image gets: `lock-<sha256>` when its config has the lock label, and a
/// readable one: `tag`, else `torch<v>-cuda<v>-nvshmem<v>-deepep<v>` from its labels,
/// else index.json's ref.name.
pub fn tags_for(layout: &Layout, tag: Option<&str>) -> Result<Vec<String>> {
    let mut tags = Vec::new();
    if let Some(lock) = layout.labels.get(LOCK_LABEL) {
        tags.push(lock_tag(lock).with_context(|| {
            format!(
                "the image config's label {LOCK_LABEL} of {}",
                layout.dir.display()
            )
        })?);
    }
    let readable = match tag {
        Some(tag) => {
            if !valid_tag(tag) {
                bail!(
                    "--tag {tag:?} is not a valid tag: up to 128 of [A-Za-z0-9_.-], not starting with '.' or '-'"
                );
            }
            Some(tag.to_string())
        }
        None => {
            let parts: Option<Vec<String>> = ["torch", "cuda", "nvshmem", "deepep"]
                .iter()
                .map(|k| {
                    layout
                        .labels
                        .get(&format!("dev.commstack.{k}"))
                        .map(|v| format!("{k}{v}"))
                })
                .collect();
            parts
                .and_then(|p| tag_from(&p.join("-")))
                .or_else(|| layout.ref_name.as_deref().and_then(tag_from))
        }
    };
    tags.extend(readable.filter(|t| !tags.contains(t)));
    Ok(tags)
}

/// Pushes the OCI layout at `dir`. Builds its own tokio runtime: call from synchronous
/// code; from async code use [`push_layout_async`].
pub fn push_layout(dir: &Path, options: &PushOptions) -> Result<Pushed> {
    runtime()?.block_on(push_layout_async(dir, options))
}

/// The tokio runtime the synchronous entry points (push, pull, signatures) run on.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Names the place in every error, and says what to do.
pub(crate) struct Site {
    target: Target,
    credentials_source: String,
    anonymous: bool,
    ca_given: bool,
    attempts: u32,
    /// "push" or "pull", for the 403 hint.
    operation: &'static str,
}

impl Site {
    pub(crate) fn new(
        options: &PushOptions,
        credentials: &Credentials,
        operation: &'static str,
    ) -> Site {
        Site {
            target: options.target.clone(),
            credentials_source: credentials.source.clone(),
            anonymous: matches!(credentials.auth, RegistryAuth::Anonymous),
            ca_given: options.ca_file.is_some(),
            attempts: options.retry.attempts,
            operation,
        }
    }

    /// `err` (from `what`) with the registry, the repository and a hint.
    pub(crate) fn fail(&self, what: &str, err: OciDistributionError) -> anyhow::Error {
        let hint = self.hint(&err);
        anyhow::Error::new(err).context(format!(
            "{what} on registry {}, repository {}: {hint}",
            self.target.registry, self.target.repository
        ))
    }

    /// What a rerun keeps of this attempt (` Blobs already uploaded ...`), or nothing. A
    /// pull says what it kept itself, with the bytes of the blob it was downloading
    /// (crate::pull): a failed look-up or document read keeps nothing.
    fn rerun(&self) -> &'static str {
        match self.operation {
            "pull" => "",
            _ => " Blobs already uploaded stay there and a rerun skips them.",
        }
    }

    fn hint(&self, err: &OciDistributionError) -> String {
        let registry = &self.target.registry;
        match status_of(err) {
            Some(401) if self.anonymous => {
                return format!(
                    "the registry needs credentials (401) and none were found: `docker login {registry}` (Docker's config file), or set ${USER_ENV} and ${PASSWORD_ENV}"
                );
            }
            Some(401) => {
                return format!(
                    "the registry refused the credentials (401; credentials: {}). Check them: `docker login {registry}` writes them to Docker's config file, or set ${USER_ENV} and ${PASSWORD_ENV}",
                    self.credentials_source
                );
            }
            Some(403) => {
                return format!(
                    "the registry denied the {op} (403; credentials: {}): these credentials may not {op} {}",
                    self.credentials_source,
                    self.target.repository,
                    op = self.operation
                );
            }
            Some(code) if code >= 500 || code == 429 => {
                return format!(
                    "the registry failed {} times (HTTP {code}): try again later.{}",
                    self.attempts,
                    self.rerun()
                );
            }
            _ => {}
        }
        if let OciDistributionError::AuthenticationFailure(_) = err {
            return format!(
                "the token service refused the credentials ({}): check them (`docker login {registry}`, or ${USER_ENV} and ${PASSWORD_ENV})",
                self.credentials_source
            );
        }
        let chain = error_chain(err);
        if chain.contains("certificate") || chain.contains("UnknownIssuer") {
            return match self.ca_given {
                true => "the registry's TLS certificate is not signed by the CA given with --ca-file (or $COMMSTACK_REGISTRY_CA), or does not name this host".to_string(),
                false => "the registry's TLS certificate is not trusted: give its CA certificate (PEM) with --ca-file FILE or $COMMSTACK_REGISTRY_CA".to_string(),
            };
        }
        if chain.contains("InvalidContentType") || chain.contains("record overflow") {
            return "the registry does not speak TLS there: for a plain-HTTP registry write http://HOST[:PORT]/REPO".to_string();
        }
        if transient(err) {
            return format!(
                "no answer after {} attempts: is the registry up at {registry}, and reachable from here?{}",
                self.attempts,
                self.rerun()
            );
        }
        "see the cause below".to_string()
    }
}

/// The error and its sources, as one string (to recognise TLS failures).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = format!("{err} {err:?}");
    let mut source = err.source();
    while let Some(s) = source {
        text.push_str(&format!(" | {s} {s:?}"));
        source = s.source();
    }
    text
}

/// The innermost error: "Connection refused", not "error sending request".
pub(crate) fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(source) = last.source() {
        last = source;
    }
    last.to_string()
}

/// The HTTP status an error carries, if any.
fn status_of(err: &OciDistributionError) -> Option<u16> {
    match err {
        OciDistributionError::RequestError(e) => e.status().map(|s| s.as_u16()),
        OciDistributionError::ServerError { code, .. } => Some(*code),
        OciDistributionError::UnauthorizedError { .. } => Some(401),
        OciDistributionError::RegistryError { envelope, .. } => {
            envelope.errors.iter().find_map(|e| match e.code {
                OciErrorCode::Unauthorized => Some(401),
                OciErrorCode::Denied => Some(403),
                OciErrorCode::Toomanyrequests => Some(429),
                _ => None,
            })
        }
        _ => None,
    }
}

/// Worth another attempt: the connection, a timeout, 5xx, 429.
pub(crate) fn transient(err: &OciDistributionError) -> bool {
    if let Some(code) = status_of(err) {
        return code >= 500 || code == 429;
    }
    match err {
        OciDistributionError::RequestError(e) => {
            // A TLS failure is a connect error too, but will not get better.
            let chain = error_chain(e);
            let tls = chain.contains("certificate") || chain.contains("InvalidContentType");
            !tls && (e.is_connect() || e.is_timeout() || e.is_request() || e.is_body())
        }
        _ => false,
    }
}

/// Runs `op` until it succeeds, fails for good, or has failed `policy.attempts` times.
pub(crate) async fn with_retry<T, F, Fut>(
    policy: &RetryPolicy,
    what: &str,
    progress: &Progress,
    mut op: F,
) -> std::result::Result<T, OciDistributionError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, OciDistributionError>>,
{
    let mut failures = 0;
    loop {
        match op().await {
            Ok(value) => return Ok(value),
            Err(err) if transient(&err) && failures + 1 < policy.attempts.max(1) => {
                failures += 1;
                let wait = policy.backoff_for(failures);
                progress.println(&format!(
                    "{what}: {}; retrying in {:.1} s (attempt {} of {})",
                    root_cause(&err),
                    wait.as_secs_f64(),
                    failures + 1,
                    policy.attempts
                ));
                tokio::time::sleep(wait).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// The client: TLS roots (the system's, plus `ca_file`'s), plain HTTP when asked for.
fn client(options: &PushOptions) -> Result<Client> {
    let mut config = ClientConfig {
        // One streamed PUT per blob: chunked PATCHes of 4 MiB cost a round trip each.
        use_monolithic_push: true,
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(300)),
        user_agent: concat!("commstack/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    };
    if options.target.plain_http {
        config.protocol = ClientProtocol::HttpsExcept(vec![options.target.registry.clone()]);
    }
    if let Some(file) = &options.ca_file {
        config.extra_root_certificates = ca_certificates(file)?;
    }
    Client::try_from(config).context("cannot set up the registry client (TLS roots?)")
}

/// The client and the credentials for `options`' registry.
pub(crate) fn client_for(options: &PushOptions) -> Result<(Client, Credentials)> {
    let credentials = match &options.credentials {
        Some(c) => c.clone(),
        None => auth::credentials(&options.target.registry)?,
    };
    Ok((client(options)?, credentials))
}

/// Each certificate of a PEM file, as its own root (reqwest reads one per PEM).
pub(crate) fn ca_certificates(file: &Path) -> Result<Vec<Certificate>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the CA file {}", file.display()))?;
    const END: &str = "-----END CERTIFICATE-----";
    let mut certs = Vec::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("-----BEGIN CERTIFICATE-----") {
        let Some(end) = rest[start..].find(END) else {
            break;
        };
        let pem = &rest[start..start + end + END.len()];
        certs.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data: format!("{pem}\n").into_bytes(),
        });
        rest = &rest[start + end + END.len()..];
    }
    if certs.is_empty() {
        bail!(
            "the CA file {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            file.display()
        );
    }
    Ok(certs)
}

/// See [`push_layout`].
pub async fn push_layout_async(dir: &Path, options: &PushOptions) -> Result<Pushed> {
    let layout = Layout::open(dir)?;
    let tags = match options.untagged {
        true => Vec::new(),
        false => tags_for(&layout, options.tag.as_deref())?,
    };
    let target = &options.target;
    let (client, credentials) = client_for(options)?;
    let site = Site::new(options, &credentials, "push");
    let progress = Progress::new(options.progress);
    let image = Reference::with_digest(
        target.registry.clone(),
        target.repository.clone(),
        layout.manifest_digest.clone(),
    );

    // Logs in (for a bearer registry: fetches the push token, so bad credentials fail here).
    with_retry(&options.retry, "logging in", &progress, || {
        client.auth(&image, &credentials.auth, RegistryOperation::Push)
    })
    .await
    .map_err(|e| site.fail("logging in", e))?;

    // Which blobs the registry has (HEAD), a few at once.
    let jobs = options.jobs.max(1);
    let found: Vec<(Blob, bool)> = futures::stream::iter(layout.blobs.iter().cloned())
        .map(|blob| {
            let (client, image, site, progress) = (&client, &image, &site, &progress);
            async move {
                let what = format!("checking for the {} blob {}", blob.role, blob.digest);
                let has = with_retry(&options.retry, &what, progress, || {
                    client.blob_exists(image, &blob.digest)
                })
                .await
                .map_err(|e| site.fail(&what, e))?;
                anyhow::Ok((blob, has))
            }
        })
        .buffered(jobs)
        .try_collect()
        .await?;
    let (present, missing): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, has)| *has);
    let missing: Vec<Blob> = missing.into_iter().map(|(b, _)| b).collect();

    // Every blob to send is checked first: a damaged layout sends nothing.
    check_blobs(&missing, &progress)
        .await
        .with_context(|| format!("refusing to push {} to {}", dir.display(), target.name()))?;

    futures::stream::iter(missing.iter())
        .map(|blob| {
            let (client, image, site, progress) = (&client, &image, &site, &progress);
            async move {
                let what = format!(
                    "uploading the {} blob {} ({} bytes)",
                    blob.role, blob.digest, blob.size
                );
                let bar = blob_bar(progress, &blob.role, blob.size);
                with_retry(&options.retry, &what, progress, || {
                    bar.set_position(0);
                    client.push_blob_stream(
                        image,
                        file_stream(blob.path.clone(), bar.clone()),
                        &blob.digest,
                        Some(blob.size),
                    )
                })
                .await
                .map_err(|e| site.fail(&what, e))?;
                bar.finish_and_clear();
                anyhow::Ok(())
            }
        })
        .buffer_unordered(jobs)
        .try_collect::<Vec<()>>()
        .await?;

    // The manifest, as the layout's bytes: by digest, then under each tag.
    let content_type: reqwest::header::HeaderValue = layout
        .media_type
        .parse()
        .context("the manifest's media type is not a header value")?;
    let mut references = vec![image.clone()];
    references.extend(tags.iter().map(|tag| {
        Reference::with_tag(
            target.registry.clone(),
            target.repository.clone(),
            tag.clone(),
        )
    }));
    for reference in &references {
        let what = match reference.tag() {
            Some(tag) => format!("tagging the manifest {} as {tag}", layout.manifest_digest),
            None => format!("pushing the manifest {}", layout.manifest_digest),
        };
        with_retry(&options.retry, &what, &progress, || {
            client.push_manifest_raw(
                reference,
                Bytes::from(layout.manifest.clone()),
                content_type.clone(),
            )
        })
        .await
        .map_err(|e| site.fail(&what, e))?;
    }

    Ok(Pushed {
        reference: format!("{}@{}", target.name(), layout.manifest_digest),
        manifest_digest: layout.manifest_digest.clone(),
        config_digest: layout.blobs[0].digest.clone(),
        tags,
        bytes_uploaded: missing.iter().map(|b| b.size).sum(),
        uploaded: missing.into_iter().map(|b| b.digest).collect(),
        present: present.into_iter().map(|(b, _)| b.digest).collect(),
    })
}

/// Each of `blobs` against its digest, off the async threads, with a progress bar.
async fn check_blobs(blobs: &[Blob], progress: &Progress) -> Result<()> {
    let to_check: u64 = blobs.iter().map(|b| b.size).sum();
    if to_check == 0 {
        return Ok(());
    }
    let bar = blob_bar(progress, "checking digests", to_check);
    let blobs = blobs.to_vec();
    let hashing = bar.clone();
    tokio::task::spawn_blocking(move || {
        blobs
            .iter()
            .try_for_each(|b| verify_blob(b, &|n| hashing.inc(n)))
    })
    .await
    .context("the digest check stopped")??;
    bar.finish_and_clear();
    Ok(())
}

/// A blob's file as a stream of 1 MiB pieces, counted on `bar`.
fn file_stream(
    path: PathBuf,
    bar: ProgressBar,
) -> impl Stream<Item = std::result::Result<Bytes, OciDistributionError>> + Send + 'static {
    futures::stream::try_unfold(
        (None::<tokio::fs::File>, path, bar),
        |(file, path, bar)| async move {
            let mut file = match file {
                Some(file) => file,
                None => tokio::fs::File::open(&path).await?,
            };
            let mut buf = vec![0u8; 1 << 20];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.truncate(n);
            bar.inc(n as u64);
            Ok(Some((Bytes::from(buf), (Some(file), path, bar))))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_5xx_429_and_connection_failures_are_retried() {
        let server = |code| OciDistributionError::ServerError {
            code,
            url: "https://r/v2/".into(),
            message: String::new(),
        };
        assert!(transient(&server(500)));
        assert!(transient(&server(503)));
        assert!(transient(&server(429)));
        assert!(!transient(&server(401)));
        assert!(!transient(&server(404)));
        assert!(!transient(&OciDistributionError::UnauthorizedError {
            url: "u".into()
        }));
        assert!(!transient(&OciDistributionError::AuthenticationFailure(
            "no".into()
        )));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy {
            attempts: 9,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        let waits: Vec<_> = (1..=4).map(|n| policy.backoff_for(n).as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
    }
}
