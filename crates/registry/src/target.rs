//! Where to push: `HOST[:PORT]/REPO` (optionally `https://` or `http://` first), and the
//! tags' grammar (distribution spec: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`).

use anyhow::{Context, Result, bail};

/// A registry and a repository in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host[:port]`, as in an image reference.
    pub registry: String,
    /// `path/name`, lower case.
    pub repository: String,
    /// `http://` was asked for: no TLS (a registry on a trusted network only).
    pub plain_http: bool,
}

/// The longest tag the distribution spec allows.
pub const MAX_TAG_LEN: usize = 128;

impl Target {
    /// Parses `HOST[:PORT]/REPO`. The first component is always the registry (no Docker
    /// Hub default: a push names where it goes).
    pub fn parse(text: &str) -> Result<Target> {
        let (rest, plain_http) = match text {
            t if t.starts_with("http://") => (&t["http://".len()..], true),
            t if t.starts_with("https://") => (&t["https://".len()..], false),
            t => (t, false),
        };
        let rest = rest.trim_end_matches('/');
        let Some((registry, repository)) = rest.split_once('/') else {
            bail!(
                "{text:?}: give the registry and the repository, HOST[:PORT]/REPO (e.g. registry.example.com:5000/commstack/debian-12)"
            );
        };
        if registry.is_empty() || registry.contains(['@', '?', '#']) {
            bail!("{text:?}: {registry:?} is not a registry host[:port]");
        }
        if let Some(bad) = repository.split('/').find(|c| !valid_component(c)) {
            bail!(
                "{text:?}: the repository component {bad:?} is not valid (lower-case letters and digits, separated by '.', '_', '__' or '-')"
            );
        }
        if repository.contains(['@', ':']) {
            bail!("{text:?}: give the repository without a tag or digest (use --tag)");
        }
        Ok(Target {
            registry: registry.to_string(),
            repository: repository.to_string(),
            plain_http,
        })
    }

    /// `host[:port]/repo`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`: one path component of a repository name.
fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(&bytes[0]) || !alnum(&bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(&bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(&bytes[i]) {
            i += 1;
        }
        let sep = &component[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// Whether `tag` is a valid tag.
pub fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_TAG_LEN
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// `text` made into a tag: characters a tag cannot hold become '-' ('+' of a local
/// version too), cut at [`MAX_TAG_LEN`]. None when nothing usable is left.
pub fn tag_from(text: &str) -> Option<String> {
    let mut tag: String = text
        .chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') => c,
            _ => '-',
        })
        .collect();
    let first_ok = |t: &str| {
        t.as_bytes()
            .first()
            .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    };
    while !tag.is_empty() && !first_ok(&tag) {
        tag.remove(0);
    }
    tag.truncate(MAX_TAG_LEN);
    valid_tag(&tag).then_some(tag)
}

/// The tag that names an image by the lock it was built from: `lock-<sha256 hex>`
/// (69 characters, within [`MAX_TAG_LEN`]).
pub fn lock_tag(lock_sha256: &str) -> Result<String> {
    if lock_sha256.len() != 64 || !lock_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("{lock_sha256:?} is not a sha256 (64 hex digits)");
    }
    Ok(format!("lock-{}", lock_sha256.to_ascii_lowercase()))
}

/// The tag of `kind` attached to the manifest `digest` (`sig` for its signature).
pub fn attachment_tag(digest: &str, kind: &str) -> Result<String> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64)
        .with_context(|| format!("{digest:?} is not a sha256 digest"))?;
    Ok(format!("sha256-{hex}.{kind}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_with_port_scheme_and_nested_repositories() {
        let t = Target::parse("127.0.0.1:5000/commstack/debian-12").unwrap();
        assert_eq!(t.registry, "127.0.0.1:5000");
        assert_eq!(t.repository, "commstack/debian-12");
        assert!(!t.plain_http);
        let t = Target::parse("http://localhost:5000/a__b/c.d-e/").unwrap();
        assert!(t.plain_http);
        assert_eq!(t.name(), "localhost:5000/a__b/c.d-e");
        for bad in [
            "registry.example.com",
            "registry.example.com/",
            "host/Upper",
            "host/repo:tag",
            "host/repo@sha256:00",
            "host/a..b",
            "host/-a",
            "/repo",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn tags_follow_the_spec_grammar_and_length() {
        assert!(valid_tag("lock-0123"));
        assert!(valid_tag("_x"));
        assert!(!valid_tag(".x"));
        assert!(!valid_tag("-x"));
        assert!(!valid_tag("a+b"));
        assert!(valid_tag(&"a".repeat(128)));
        assert!(!valid_tag(&"a".repeat(129)));
        assert_eq!(
            tag_from("torch2.11.0+cu130").as_deref(),
            Some("torch2.11.0-cu130")
        );
        assert_eq!(tag_from("..x y").as_deref(), Some("x-y"));
        assert_eq!(tag_from("+++"), None);
        assert_eq!(tag_from(&"b".repeat(300)).unwrap().len(), 128);
        let hex = "AB".repeat(32);
        assert_eq!(lock_tag(&hex).unwrap(), format!("lock-{}", "ab".repeat(32)));
        assert!(valid_tag(&lock_tag(&hex).unwrap()));
        assert!(lock_tag("abc").is_err());
    }
}
