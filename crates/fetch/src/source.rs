//! Where an artifact's bytes can come from: mirrors first (in the order given), then the
//! upstream URLs (in the lock's order).

use std::path::{Path, PathBuf};

use crate::artifact::Artifact;

/// A place tried before upstream: a directory of files named as upstream names them
/// (`--mirror DIR` or `file:///DIR`), or an http(s) base URL serving the same names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mirror {
    Dir(PathBuf),
    Http(url::Url),
}

impl Mirror {
    /// `http(s)://...` -> Http, `file://...` -> Dir, anything else -> a directory path.
    pub fn parse(text: &str) -> Result<Mirror, String> {
        if text.starts_with("http://") || text.starts_with("https://") {
            let mut url = url::Url::parse(text).map_err(|e| format!("mirror URL {text:?}: {e}"))?;
            // `base/` + `file` keeps the base's last segment; `base` + `file` would drop it.
            if !url.path().ends_with('/') {
                url.set_path(&format!("{}/", url.path()));
            }
            Ok(Mirror::Http(url))
        } else if text.starts_with("file:") {
            let url = url::Url::parse(text).map_err(|e| format!("mirror URL {text:?}: {e}"))?;
            let path = url
                .to_file_path()
                .map_err(|()| format!("mirror {text:?} is not a local file URL"))?;
            Ok(Mirror::Dir(path))
        } else if text.is_empty() {
            Err("an empty --mirror".to_string())
        } else {
            Ok(Mirror::Dir(PathBuf::from(text)))
        }
    }
}

/// One place to try for one artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// A local file (from a mirror directory or a `file://` URL).
    File {
        path: PathBuf,
        mirror: bool,
    },
    Http {
        url: url::Url,
        mirror: bool,
    },
}

impl Source {
    /// How errors and results name it.
    pub fn label(&self) -> String {
        match self {
            Source::File { path, .. } => url::Url::from_file_path(path)
                .map(|u| u.to_string())
                .unwrap_or_else(|()| path.display().to_string()),
            Source::Http { url, .. } => url.to_string(),
        }
    }

    pub fn is_mirror(&self) -> bool {
        match self {
            Source::File { mirror, .. } | Source::Http { mirror, .. } => *mirror,
        }
    }

    pub fn needs_network(&self) -> bool {
        matches!(self, Source::Http { .. })
    }
}

/// Mirrors first, then upstream; an unparsable upstream URL becomes an error source.
pub(crate) fn sources_for(artifact: &Artifact, mirrors: &[Mirror]) -> Result<Vec<Source>, String> {
    let mut sources = Vec::new();
    for mirror in mirrors {
        match mirror {
            Mirror::Dir(dir) => sources.push(Source::File {
                path: dir.join(&artifact.filename),
                mirror: true,
            }),
            Mirror::Http(base) => {
                let url = base
                    .join(&encode_segment(&artifact.filename))
                    .map_err(|e| format!("mirror {base} + {:?}: {e}", artifact.filename))?;
                sources.push(Source::Http { url, mirror: true });
            }
        }
    }
    for text in &artifact.urls {
        let url = url::Url::parse(text)
            .map_err(|e| format!("artifact {}: URL {text:?}: {e}", artifact.name))?;
        match url.scheme() {
            "http" | "https" => sources.push(Source::Http { url, mirror: false }),
            "file" => {
                let path = url.to_file_path().map_err(|()| {
                    format!(
                        "artifact {}: {text:?} is not a local file URL",
                        artifact.name
                    )
                })?;
                sources.push(Source::File {
                    path,
                    mirror: false,
                });
            }
            other => {
                return Err(format!(
                    "artifact {}: URL {text:?}: scheme {other:?} is not supported",
                    artifact.name
                ));
            }
        }
    }
    Ok(sources)
}

/// Percent-encodes what a path segment cannot hold literally (`%`, `#`, `?`, spaces...).
fn encode_segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        let plain = byte.is_ascii_alphanumeric() || b"-._~+!$&'()*,;=:@".contains(&byte);
        if plain {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `DIR/filename` as a mirror directory would hold it.
pub fn mirror_file(dir: &Path, filename: &str) -> PathBuf {
    dir.join(filename)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_come_first_and_keep_their_base_path() {
        let mut artifact =
            Artifact::new("t", "https://up.example/p/t-1.0+x.whl", &"a".repeat(64)).unwrap();
        artifact.urls.push("file:///srv/t-1.0+x.whl".into());
        let mirrors = [
            Mirror::parse("/bundle").unwrap(),
            Mirror::parse("http://m.example/pypi").unwrap(),
        ];
        let labels: Vec<_> = sources_for(&artifact, &mirrors)
            .unwrap()
            .iter()
            .map(Source::label)
            .collect();
        assert_eq!(
            labels,
            [
                "file:///bundle/t-1.0+x.whl",
                "http://m.example/pypi/t-1.0+x.whl",
                "https://up.example/p/t-1.0+x.whl",
                "file:///srv/t-1.0+x.whl"
            ]
        );
        assert_eq!(
            Mirror::parse("file:///a/b").unwrap(),
            Mirror::Dir("/a/b".into())
        );
    }
}
