//! HTTP access to a Debian/Ubuntu mirror: the suite's InRelease, then the Packages index of
//! one component and architecture, checked against the signed size and sha256 before it is
//! decompressed or parsed. Every download is bounded in bytes and in overall time
//! ([`IndexBounds`]; docs/bounds.md), the bound checked while the bytes arrive.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use commstack_http::{Bound, Get, HttpError, RetryPolicy};
use sha2::{Digest, Sha256};

use crate::freshness::Freshness;
use crate::packages::{self, Package};
use crate::release::{self, Release};

/// What one index download may cost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexBounds {
    /// The InRelease: its size is unknown until read, so a fixed cap (Debian's and
    /// Ubuntu's are under 300 KiB) and a fixed time.
    pub inrelease: Bound,
    /// The Packages index may take this long plus its signed size at `packages_rate`.
    pub packages_time: Duration,
    /// Bytes per second: the slowest mirror that is still waited for.
    pub packages_rate: u64,
    /// The decompressed Packages text, when the InRelease does not list its size: this many
    /// times the compressed size (Debian's compress about 5:1).
    pub packages_ratio: u64,
}

impl Default for IndexBounds {
    fn default() -> IndexBounds {
        IndexBounds {
            inrelease: Bound {
                max_bytes: 4 << 20,
                time: Duration::from_secs(120),
            },
            packages_time: Duration::from_secs(60),
            packages_rate: 64 << 10,
            packages_ratio: 32,
        }
    }
}

impl IndexBounds {
    /// The bound of a Packages index of `size` bytes (its signed size): exactly that many
    /// bytes, within `packages_time` plus `size` at `packages_rate`.
    pub fn packages(&self, size: u64) -> Bound {
        let transfer = Duration::from_secs_f64(size as f64 / self.packages_rate.max(1) as f64);
        Bound {
            max_bytes: size,
            time: self.packages_time + transfer,
        }
    }
}

/// Mirrors answer quickly or not at all: two more tries, a short wait.
const RETRY: RetryPolicy = RetryPolicy {
    retries: 2,
    backoff: Duration::from_millis(600),
    max_backoff: Duration::from_secs(5),
    max_retry_after: Duration::from_secs(30),
};

/// One mirror, e.g. `http://deb.debian.org/debian`.
pub struct Mirror {
    client: reqwest::Client,
    root: String,
    bounds: IndexBounds,
}

/// A suite's verified release and the packages of one component and architecture.
pub struct Index {
    pub release: Release,
    /// sha256 of the compressed Packages file read.
    pub packages_sha256: String,
    pub packages: Vec<Package>,
}

impl Mirror {
    pub fn new(root: &str, bounds: IndexBounds) -> Result<Mirror> {
        let client = commstack_http::client(&commstack_http::ClientSettings::default())?;
        Ok(Mirror {
            client,
            root: root.trim_end_matches('/').to_string(),
            bounds,
        })
    }

    /// `dists/<suite>/InRelease` verified with `keyring` and judged by `freshness`, then
    /// `<component>/binary-<arch>/Packages.gz` (by hash when the release offers it).
    pub async fn index(
        &self,
        suite: &str,
        component: &str,
        arch: &str,
        keyring: &Path,
        freshness: &Freshness,
    ) -> Result<Index> {
        let dists = format!("{}/dists/{suite}", self.root);
        let url = format!("{dists}/InRelease");
        let signed = self
            .get(&url, "the InRelease", self.bounds.inrelease)
            .await?;
        let text = release::verify(&signed, &url, keyring)?;
        let release = Release::parse(&text, &url)?;
        let names = [release.suite.as_deref(), release.codename.as_deref()];
        if !names.contains(&Some(suite)) {
            bail!(
                "{url} is signed for suite {:?} (codename {:?}), not {suite:?}: the mirror serves another release under that name",
                release.suite.as_deref().unwrap_or(""),
                release.codename.as_deref().unwrap_or("")
            );
        }
        freshness.check(&release, &url)?;
        if !release.architectures.is_empty() && !release.architectures.iter().any(|a| a == arch) {
            bail!(
                "{url}: the release has no architecture {arch} (it has {})",
                release.architectures.join(" ")
            );
        }
        let path = format!("{component}/binary-{arch}/Packages.gz");
        let Some((size, sha256)) = release.sha256.get(&path).cloned() else {
            bail!(
                "{url} lists no {path} in its SHA256 list: the mirror has no {component} for {arch}"
            );
        };
        let packages_url = if release.acquire_by_hash {
            format!("{dists}/{component}/binary-{arch}/by-hash/SHA256/{sha256}")
        } else {
            format!("{dists}/{path}")
        };
        let mismatch = |what: String| {
            anyhow!(
                "{what}, but the signed {url} lists {size} bytes with sha256 {sha256}: \
                 the mirror is in the middle of an update or serves a damaged or altered file; run the command again later \
                 or use another mirror (image.mirror)"
            )
        };
        let bound = self.bounds.packages(size);
        let gz = match self
            .get_raw(&packages_url, "the Packages index", bound)
            .await
        {
            Err(e @ HttpError::TooLarge { .. }) => return Err(mismatch(e.to_string())),
            other => self.answer(other, &packages_url)?,
        };
        let actual = hex::encode(Sha256::digest(&gz));
        if gz.len() as u64 != size || actual != sha256 {
            return Err(mismatch(format!(
                "{packages_url}: {} bytes with sha256 {actual}",
                gz.len()
            )));
        }
        let text = self.decompress(&gz, &release, component, arch, &packages_url)?;
        let packages = packages::parse_index(&text, &packages_url)?;
        Ok(Index {
            release,
            packages_sha256: sha256,
            packages,
        })
    }

    /// The Packages text, at most as long as the InRelease says it is (or
    /// `packages_ratio` times the compressed size when it does not say).
    fn decompress(
        &self,
        gz: &[u8],
        release: &Release,
        component: &str,
        arch: &str,
        url: &str,
    ) -> Result<String> {
        let listed = release
            .sha256
            .get(&format!("{component}/binary-{arch}/Packages"))
            .map(|(size, _)| *size);
        let limit = listed.unwrap_or(gz.len() as u64 * self.bounds.packages_ratio);
        let mut text = String::new();
        flate2::read::GzDecoder::new(gz)
            .take(limit + 1)
            .read_to_string(&mut text)
            .with_context(|| format!("{url}: not gzip-compressed UTF-8 text"))?;
        if text.len() as u64 > limit {
            let bound = match listed {
                Some(_) => "the Packages size the InRelease lists".to_string(),
                None => format!("{} times its compressed size", self.bounds.packages_ratio),
            };
            bail!(
                "{url}: decompresses to more than {limit} bytes ({bound}): refused before reading more; \
                 the signed index is inconsistent: use another mirror (image.mirror)"
            );
        }
        Ok(text)
    }

    /// A bounded GET of `url` (`what` names it in messages).
    async fn get(&self, url: &str, what: &str, bound: Bound) -> Result<Vec<u8>> {
        let answer = self.get_raw(url, what, bound).await;
        self.answer(answer, url)
    }

    async fn get_raw(
        &self,
        url: &str,
        what: &str,
        bound: Bound,
    ) -> Result<commstack_http::Answer, HttpError> {
        let request = Get {
            url,
            accept: None,
            what,
            bound,
        };
        commstack_http::get(&self.client, &request, &RETRY).await
    }

    /// The body of a successful answer; each failure with what to do about it.
    fn answer(
        &self,
        answer: Result<commstack_http::Answer, HttpError>,
        url: &str,
    ) -> Result<Vec<u8>> {
        match answer {
            Ok(a) if a.status.is_success() => Ok(a.body),
            Ok(a) => bail!(
                "{url} answered {}: is image.mirror ({}) a Debian or Ubuntu mirror with this suite?",
                a.status,
                self.root
            ),
            Err(e @ HttpError::GaveUp { .. }) => Err(anyhow!(
                "{e}; is the mirror reachable? set image.mirror to one that is"
            )),
            Err(e @ (HttpError::TooLarge { .. } | HttpError::TooSlow { .. })) => Err(anyhow!(
                "{e}; the bounds are in docs/bounds.md: try again later or use another mirror (image.mirror)"
            )),
            Err(e) => Err(e.into()),
        }
    }
}
