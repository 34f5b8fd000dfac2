//! The image a deploy runs: by digest only. A tag moves (`:latest` today is another image
//! tomorrow, and `imagePullPolicy: Always` pulls 25 GB again on every start); a digest
//! names exactly the bytes `push` sent and verify checked.

use std::fmt;

use anyhow::{Result, bail};
use commstack_digest::terminal_safe;

/// `[HOST[:PORT]/]REPO@sha256:<64 hex>`, as `cargo xtask push` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// `HOST[:PORT]/REPO` (or `REPO` for Docker Hub), without a tag.
    pub repository: String,
    /// The 64 lowercase hex digits.
    pub digest_hex: String,
}

/// The longest reference shown in a message.
const SHOWN: usize = 200;

fn shown(text: &str) -> String {
    let safe = terminal_safe(text);
    match safe.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &safe[..cut]),
        None => safe.into_owned(),
    }
}

impl ImageRef {
    /// Parses a reference; a tag alone (or none) is refused, naming the command that
    /// prints the digest reference.
    pub fn parse(text: &str) -> Result<ImageRef> {
        let text = text.trim();
        let Some((name, digest)) = text.split_once('@') else {
            bail!(
                "the image {:?} has no digest: a deploy pulls by digest (a tag can move, and pods pulled by tag on different days run different images); `cargo xtask push --registry HOST/REPO` prints the reference to give, HOST/REPO@sha256:<64 hex>",
                shown(text)
            );
        };
        let Some(hex) = digest.strip_prefix("sha256:") else {
            bail!(
                "the image {:?}: the digest must be sha256:<64 hex> (what `cargo xtask push` prints)",
                shown(text)
            );
        };
        if hex.len() != 64
            || !hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        {
            bail!(
                "the image {:?}: sha256:{} is not 64 lowercase hex digits (copy the reference `cargo xtask push` printed)",
                shown(text),
                shown(hex)
            );
        }
        // A tag together with a digest (`repo:tag@sha256:...`) is legal for Docker but
        // ignored by it; drop it so the rendered reference says only what is pulled.
        let (head, last) = match name.rsplit_once('/') {
            Some((head, last)) => (Some(head), last),
            None => (None, name),
        };
        let last = last.split_once(':').map_or(last, |(repo, _tag)| repo);
        let repository = match head {
            Some(head) => format!("{head}/{last}"),
            None => last.to_string(),
        };
        let repo_ok = !repository.is_empty()
            && repository.split('/').enumerate().all(|(i, part)| {
                !part.is_empty()
                    && if i == 0 && repository.contains('/') {
                        // A registry host, with an optional port.
                        part.chars()
                            .all(|c| c.is_ascii_alphanumeric() || ".-:".contains(c))
                    } else {
                        part.chars().all(|c| {
                            c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c)
                        })
                    }
            });
        if !repo_ok {
            bail!(
                "the image {:?}: {:?} is not a repository name (HOST[:PORT]/REPO, lowercase)",
                shown(text),
                shown(&repository)
            );
        }
        Ok(ImageRef {
            repository,
            digest_hex: hex.to_string(),
        })
    }

    /// The reference from what `push` wrote: its `--json` report (`reference`) or its
    /// plain output, whose last line is the reference.
    pub fn from_push_output(text: &str) -> Result<ImageRef> {
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(text) {
            if let Some(r) = json.get("reference").and_then(|r| r.as_str()) {
                return ImageRef::parse(r);
            }
            bail!(
                "push's JSON report has no \"reference\": give the output of `cargo xtask push --json`"
            );
        }
        match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => ImageRef::parse(line),
            None => {
                bail!("push's output is empty: its last line is the reference HOST/REPO@sha256:...")
            }
        }
    }

    /// `sha256:<hex>`.
    pub fn digest(&self) -> String {
        format!("sha256:{}", self.digest_hex)
    }

    /// The registry host (Docker Hub's when the repository names none).
    pub fn registry(&self) -> &str {
        match self.repository.split_once('/') {
            Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
            _ => "docker.io",
        }
    }

    /// The repository without its registry.
    pub fn path(&self) -> &str {
        match self.repository.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => rest,
            _ => &self.repository,
        }
    }

    /// A 64-bit number from the digest, the same wherever it is computed: the self-test's
    /// seed, so every rank of the gate draws the same inputs.
    pub fn seed(&self) -> u64 {
        u64::from_str_radix(&self.digest_hex[..15], 16).expect("checked hex")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@sha256:{}", self.repository, self.digest_hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "390fb29b8501aa6f0e8ef8d0c2b9d0f6a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1";

    #[test]
    fn digest_references_parse_and_tags_are_dropped() {
        let r = ImageRef::parse(&format!(
            "registry.example.com:5000/commstack/debian-12@sha256:{HEX}"
        ))
        .unwrap();
        assert_eq!(
            r.repository,
            "registry.example.com:5000/commstack/debian-12"
        );
        assert_eq!(r.registry(), "registry.example.com:5000");
        assert_eq!(r.path(), "commstack/debian-12");
        let t = ImageRef::parse(&format!(
            "registry.example.com:5000/commstack/debian-12:nightly@sha256:{HEX}"
        ))
        .unwrap();
        assert_eq!(t, r);
        let hub = ImageRef::parse(&format!("commstack/debian-12@sha256:{HEX}")).unwrap();
        assert_eq!(hub.registry(), "docker.io");
        assert_eq!(hub.to_string(), format!("commstack/debian-12@sha256:{HEX}"));
    }

    #[test]
    fn a_tag_alone_is_refused_naming_push() {
        let err = ImageRef::parse("registry.example.com/commstack/debian-12:latest")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("has no digest") && err.contains("cargo xtask push --registry"),
            "{err}"
        );
        let err = ImageRef::parse(&format!("r.example.com/x@sha256:{}", &HEX[..60]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not 64 lowercase hex digits"), "{err}");
        let err = ImageRef::parse(&format!("r.example.com/x@md5:{HEX}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("sha256:<64 hex>"), "{err}");
        let err = ImageRef::parse(&format!("r.example.com/X\u{1b}[31m@sha256:{HEX}"))
            .unwrap_err()
            .to_string();
        assert!(!err.contains('\u{1b}'), "{err}");
    }

    #[test]
    fn pushs_output_gives_the_reference() {
        let plain = format!(
            "blobs: 3 uploaded (1 GB), 15 already in the registry\ntags: lock-x\nr.example.com/a/b@sha256:{HEX}\n"
        );
        assert_eq!(
            ImageRef::from_push_output(&plain).unwrap().repository,
            "r.example.com/a/b"
        );
        let json = format!("{{\"reference\": \"r.example.com/a/b@sha256:{HEX}\", \"tags\": []}}");
        assert_eq!(ImageRef::from_push_output(&json).unwrap().digest_hex, HEX);
    }
}
