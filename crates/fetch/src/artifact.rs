//! What to fetch: one locked file, its upstream URLs and its digest.

use serde::{Deserialize, Serialize};

/// One locked file. `filename` is also the name a mirror directory holds it under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// The name the lock gives it (e.g. `nvshmem-src`, `torch`); `--source NAME=PATH` uses it.
    pub name: String,
    /// The upstream file name: the last path segment of its URL.
    pub filename: String,
    /// Upstream URLs, tried in order after the mirrors.
    pub urls: Vec<String>,
    /// Lowercase hex sha256 of the file's bytes. `None` for archives pinned by their tree
    /// hash alone (git archives, whose bytes are not stable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// For source archives: the tree hash (`sha256:<hex>`, see [`crate::tree`]) of the
    /// unpacked contents. With `sha256` set it serves `accept_tree_match`; alone, it is
    /// what the download is checked against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree_sha256: Option<String>,
}

impl Artifact {
    /// An artifact pinned by sha256, with one upstream URL; the file name is the URL's
    /// last path segment.
    pub fn new(name: &str, url: &str, sha256: &str) -> Result<Artifact, String> {
        let artifact = Artifact {
            name: name.to_string(),
            filename: filename_of_url(url)?,
            urls: vec![url.to_string()],
            sha256: Some(normalize_sha256(sha256)?),
            size: None,
            tree_sha256: None,
        };
        Ok(artifact)
    }

    /// A source archive pinned by its tree hash alone (`sha256:<hex>`).
    pub fn tree_only(name: &str, url: &str, tree_sha256: &str) -> Result<Artifact, String> {
        let artifact = Artifact {
            name: name.to_string(),
            filename: filename_of_url(url)?,
            urls: vec![url.to_string()],
            sha256: None,
            size: None,
            tree_sha256: Some(tree_sha256.to_string()),
        };
        artifact.validate()?;
        Ok(artifact)
    }

    /// Names this artifact's lock file and partial download in the cache: the sha256, or
    /// `tree-<hex>` for tree-pinned archives.
    pub fn cache_key(&self) -> String {
        match (&self.sha256, &self.tree_sha256) {
            (Some(sha256), _) => sha256.clone(),
            (None, Some(tree)) => format!("tree-{}", tree.trim_start_matches("sha256:")),
            (None, None) => panic!(
                "artifact {} has neither sha256 nor tree hash (check is_pinned() first)",
                self.name
            ),
        }
    }

    /// How the lock pins it, for messages: `sha256 <hex>` or `tree sha256:<hex>`.
    pub fn pin(&self) -> String {
        match (&self.sha256, &self.tree_sha256) {
            (Some(sha256), _) => format!("sha256 {sha256}"),
            (None, Some(tree)) => format!("tree {tree}"),
            (None, None) => "no hash".to_string(),
        }
    }

    pub fn with_size(mut self, size: u64) -> Artifact {
        self.size = Some(size);
        self
    }

    pub fn with_tree_sha256(mut self, tree: &str) -> Artifact {
        self.tree_sha256 = Some(tree.to_string());
        self
    }

    /// Whether the lock gives a hash to check the download with (sha256 or tree hash).
    /// An unpinned artifact is never fetched: `fetch_all` reports it as a failure.
    pub fn is_pinned(&self) -> bool {
        self.sha256.is_some() || self.tree_sha256.is_some()
    }

    /// Checks the form of the fields a fetch relies on (not whether it is pinned, see
    /// [`Artifact::is_pinned`]); the message names the artifact and field.
    pub fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() {
            return Err(format!(
                "an artifact has an empty name (file {:?})",
                self.filename
            ));
        }
        let bad_filename = self.filename.is_empty()
            || self.filename.contains(['/', '\\', '\0'])
            || self.filename == "."
            || self.filename == "..";
        if bad_filename {
            return Err(format!(
                "artifact {name}: filename {:?} is not a plain file name",
                self.filename
            ));
        }
        if let Some(sha256) = &self.sha256
            && normalize_sha256(sha256).as_deref() != Ok(sha256.as_str())
        {
            return Err(format!(
                "artifact {name}: sha256 {sha256:?} is not 64 lowercase hex digits"
            ));
        }

        if let Some(tree) = &self.tree_sha256 {
            let valid = tree
                .strip_prefix("sha256:")
                .is_some_and(|hex| normalize_sha256(hex).as_deref() == Ok(hex));
            if !valid {
                return Err(format!(
                    "artifact {name}: tree_sha256 {tree:?} is not `sha256:` + 64 lowercase hex digits"
                ));
            }
        }
        Ok(())
    }
}

/// `sha256:ABC...` or `abc...` -> `abc...` (64 lowercase hex digits), else an error.
pub fn normalize_sha256(text: &str) -> Result<String, String> {
    let hex = text
        .strip_prefix("sha256:")
        .unwrap_or(text)
        .to_ascii_lowercase();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex)
    } else {
        Err(format!(
            "{text:?} is not a sha256 (64 hex digits, optionally prefixed `sha256:`)"
        ))
    }
}

/// The last path segment of `url`, percent-decoded (`.../torch-2.11.0%2Bcu130-...whl`
/// -> `torch-2.11.0+cu130-...whl`).
pub fn filename_of_url(url: &str) -> Result<String, String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("URL {url:?}: {e}"))?;
    let segment = parsed
        .path_segments()
        .and_then(|mut segments| segments.next_back())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("URL {url:?} has no file name in its path"))?;
    let decoded: Vec<u8> = percent_decode(segment);
    String::from_utf8(decoded).map_err(|_| format!("URL {url:?}: file name is not UTF-8"))
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filename_is_the_decoded_last_segment() {
        let url = "https://files.example/packages/ab/torch-2.11.0%2Bcu130-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=x";
        assert_eq!(
            filename_of_url(url).unwrap(),
            "torch-2.11.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
        );
        assert!(filename_of_url("https://example.org/").is_err());
    }

    #[test]
    fn sha256_forms() {
        let hex = "ab".repeat(32);
        assert_eq!(
            normalize_sha256(&format!("sha256:{}", hex.to_uppercase())).unwrap(),
            hex
        );
        assert!(normalize_sha256("abc").is_err());
    }

    #[test]
    fn validate_names_the_field() {
        let mut a = Artifact::new("x", "http://h/x.tar.gz", &"0".repeat(64)).unwrap();
        assert!(a.validate().is_ok());
        a.filename = "../evil".into();
        assert!(a.validate().unwrap_err().contains("filename"));
    }
}
