//! The signed `InRelease` of a suite: checked with gpgv against the archive keyring, then
//! read for its date, suite, architectures and the SHA256 list of the index files.
//!
//! Only the text gpgv wrote out (the part the signature covers) is parsed, never the
//! file as downloaded, so nothing outside the signature can add or change an index hash.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

use crate::deb822;

/// What the signed part of an InRelease says.
#[derive(Clone, Debug)]
pub struct Release {
    /// `Date:`, as a time.
    pub date: jiff::Timestamp,
    /// `Valid-Until:`, when the archive sets one (Debian's testing, unstable and security
    /// suites do; stable releases and Ubuntu do not).
    pub valid_until: Option<jiff::Timestamp>,
    pub suite: Option<String>,
    pub codename: Option<String>,
    pub architectures: Vec<String>,
    pub components: Vec<String>,
    /// Whether index files can be had under `by-hash/SHA256/<sha256>` (never replaced in
    /// place, so no race with a mirror update between InRelease and the index).
    pub acquire_by_hash: bool,
    /// Path relative to `dists/<suite>/` -> (size, sha256).
    pub sha256: BTreeMap<String, (u64, String)>,
}

/// Check `inrelease` (the bytes as downloaded from `url`) with `gpgv --keyring keyring`
/// and return the signed text. At least one good signature and no bad one, as apt asks.
pub fn verify(inrelease: &[u8], url: &str, keyring: &Path) -> Result<String> {
    if !keyring.is_file() {
        bail!(
            "the archive keyring {} does not exist: install it (`apt-get install gpgv debian-archive-keyring`; \
             ubuntu-keyring for Ubuntu) or point image.keyring at the keyring that signs the mirror's InRelease",
            keyring.display()
        );
    }
    let dir = tempfile::tempdir().context("a temporary directory for gpgv")?;
    let signed = dir.path().join("InRelease");
    let text = dir.path().join("InRelease.txt");
    let home = dir.path().join("gnupg");
    std::fs::write(&signed, inrelease).with_context(|| format!("writing {}", signed.display()))?;
    std::fs::create_dir(&home).with_context(|| format!("creating {}", home.display()))?;
    let out = Command::new("gpgv")
        // A private home: nothing from the user's ~/.gnupg takes part.
        .arg("--homedir")
        .arg(&home)
        .args(["--status-fd", "1", "--keyring"])
        .arg(keyring)
        .arg("--output")
        .arg(&text)
        .arg(&signed)
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "gpgv is not installed: it checks the signature of {url}; install it with \
             `apt-get install gpgv debian-archive-keyring`"
        ),
        Err(e) => return Err(anyhow!(e).context("running gpgv")),
    };
    let status = String::from_utf8_lossy(&out.stdout);
    let has = |tag: &str| {
        status
            .lines()
            .any(|l| l.starts_with(&format!("[GNUPG:] {tag} ")))
    };
    // Like apt: gpgv itself must succeed (it fails, e.g., on a second signed block
    // appended to the file), and exactly one clearsigned message with nothing around it.
    let single_block = inrelease.starts_with(b"-----BEGIN PGP SIGNED MESSAGE-----")
        && inrelease
            .windows(b"-----BEGIN PGP SIGNED MESSAGE-----".len())
            .filter(|w| *w == b"-----BEGIN PGP SIGNED MESSAGE-----")
            .count()
            == 1
        && String::from_utf8_lossy(inrelease)
            .trim_end()
            .ends_with("-----END PGP SIGNATURE-----");
    if !out.status.success()
        || !single_block
        || has("BADSIG")
        || has("ERRSIG")
        || has("NODATA")
        || !has("GOODSIG")
        || !has("VALIDSIG")
    {
        bail!(
            "{url}: the signature does not verify against {}: the file is damaged, was changed, or \
             is signed by a key that keyring does not hold (set image.keyring to the archive's keyring)\n{}",
            keyring.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read(&text)
        .with_context(|| format!("{url}: gpgv verified the signature but wrote no text"))?;
    String::from_utf8(text).map_err(|_| anyhow!("{url}: the signed text is not UTF-8"))
}

impl Release {
    /// Parse the signed text of an InRelease (`url` names it in errors).
    pub fn parse(text: &str, url: &str) -> Result<Release> {
        let paragraphs = deb822::paragraphs(text).map_err(|e| anyhow!("{url}: {e}"))?;
        let Some(p) = paragraphs.first() else {
            bail!("{url}: the signed text is empty");
        };
        let date_text = p
            .get("Date")
            .ok_or_else(|| anyhow!("{url}: no Date field"))?;
        let date = parse_date(date_text)
            .ok_or_else(|| anyhow!("{url}: Date {date_text:?} is not an RFC 2822 time"))?;
        let valid_until =
            match p.get("Valid-Until") {
                None => None,
                Some(text) => Some(parse_date(text).ok_or_else(|| {
                    anyhow!("{url}: Valid-Until {text:?} is not an RFC 2822 time")
                })?),
            };
        let words = |f: &str| -> Vec<String> {
            p.get(f)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect()
        };
        let mut sha256 = BTreeMap::new();
        for line in p.get("SHA256").unwrap_or_default().lines() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [sha, size, path] = parts[..] else {
                if parts.is_empty() {
                    continue;
                }
                bail!("{url}: SHA256 line {line:?} is not `sha256 size path`");
            };
            let size: u64 = size
                .parse()
                .map_err(|_| anyhow!("{url}: SHA256 line {line:?}: bad size"))?;
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("{url}: SHA256 line {line:?}: bad sha256");
            }
            sha256.insert(path.to_string(), (size, sha.to_ascii_lowercase()));
        }
        if sha256.is_empty() {
            bail!("{url}: no SHA256 list: commstack only trusts index files by sha256");
        }
        Ok(Release {
            date,
            valid_until,
            suite: p.get("Suite").map(str::to_string),
            codename: p.get("Codename").map(str::to_string),
            architectures: words("Architectures"),
            components: words("Components"),
            acquire_by_hash: p
                .get("Acquire-By-Hash")
                .is_some_and(|v| v.eq_ignore_ascii_case("yes")),
            sha256,
        })
    }
}

/// `Sat, 11 Jul 2026 10:16:37 UTC` (RFC 2822, with the `UTC` Debian writes).
fn parse_date(text: &str) -> Option<jiff::Timestamp> {
    let t = text.trim();
    let t = t
        .strip_suffix(" UTC")
        .or_else(|| t.strip_suffix(" GMT"))
        .or_else(|| t.strip_suffix(" Z"))
        .map(|s| format!("{s} +0000"))
        .unwrap_or_else(|| t.to_string());
    jiff::fmt::rfc2822::parse(&t).ok().map(|z| z.timestamp())
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_as_debian_writes_them() {
        let t = super::parse_date("Sat, 11 Jul 2026 10:16:37 UTC").unwrap();
        assert_eq!(t.to_string(), "2026-07-11T10:16:37Z");
        let t = super::parse_date("Thu, 03 Dec 2026 12:00:00 +0100").unwrap();
        assert_eq!(t.to_string(), "2026-12-03T11:00:00Z");
        assert!(super::parse_date("yesterday").is_none());
    }
}
