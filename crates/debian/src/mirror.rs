//! HTTP access to a Debian/Ubuntu mirror: the suite's InRelease, then the Packages index of
//! one component and architecture, checked against the signed size and sha256 before it is
//! decompressed or parsed.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};

use crate::packages::{self, Package};
use crate::release::{self, Release};

const ATTEMPTS: u32 = 3;

/// One mirror, e.g. `http://deb.debian.org/debian`.
pub struct Mirror {
    client: reqwest::Client,
    root: String,
}

/// A suite's verified release and the packages of one component and architecture.
pub struct Index {
    pub release: Release,
    /// sha256 of the compressed Packages file read.
    pub packages_sha256: String,
    pub packages: Vec<Package>,
}

impl Mirror {
    pub fn new(root: &str) -> Result<Mirror> {
        let client = reqwest::Client::builder()
            .user_agent(concat!("commstack/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(15))
            .read_timeout(Duration::from_secs(60))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Mirror {
            client,
            root: root.trim_end_matches('/').to_string(),
        })
    }

    /// `dists/<suite>/InRelease` verified with `keyring`, then
    /// `<component>/binary-<arch>/Packages.gz` (by hash when the release offers it).
    pub async fn index(
        &self,
        suite: &str,
        component: &str,
        arch: &str,
        keyring: &Path,
    ) -> Result<Index> {
        let dists = format!("{}/dists/{suite}", self.root);
        let url = format!("{dists}/InRelease");
        let signed = self.get(&url).await?;
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
        let gz = self.get(&packages_url).await?;
        let actual = hex::encode(Sha256::digest(&gz));
        if gz.len() as u64 != size || actual != sha256 {
            bail!(
                "{packages_url}: {} bytes with sha256 {actual}, but the signed {url} lists {size} bytes with sha256 {sha256}: \
                 the mirror is in the middle of an update or serves a damaged or altered file; run the command again later \
                 or use another mirror (image.mirror)",
                gz.len()
            );
        }
        let mut text = String::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_string(&mut text)
            .with_context(|| format!("{packages_url}: not gzip-compressed UTF-8 text"))?;
        let packages = packages::parse_index(&text, &packages_url)?;
        Ok(Index {
            release,
            packages_sha256: sha256,
            packages,
        })
    }

    /// GET with a few retries on connection errors and 5xx.
    async fn get(&self, url: &str) -> Result<Vec<u8>> {
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(300 * 2u64.pow(attempt))).await;
            }
            match self.client.get(url).send().await {
                Ok(resp) if resp.status().is_success() => {
                    return Ok(resp
                        .bytes()
                        .await
                        .with_context(|| format!("reading {url}"))?
                        .to_vec());
                }
                Ok(resp) if resp.status().is_server_error() => {
                    last = format!("{url} answered {}", resp.status());
                }
                Ok(resp) => bail!(
                    "{url} answered {}: is image.mirror ({}) a Debian or Ubuntu mirror with this suite?",
                    resp.status(),
                    self.root
                ),
                Err(e) if e.is_connect() || e.is_timeout() || e.is_request() => {
                    last = format!("{url}: {e}");
                }
                Err(e) => return Err(anyhow!(e).context(format!("GET {url}"))),
            }
        }
        bail!(
            "{last} (gave up after {ATTEMPTS} attempts; is the mirror reachable? set image.mirror to one that is)"
        )
    }
}
