//! Core metadata (the METADATA file of a wheel, or a PEP 658 `.metadata` file): the fields
//! a resolver needs. The format is RFC 822 headers; mailparse reads them (folding included).

use std::str::FromStr;

use anyhow::{Context, Result, bail};
use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{ExtraName, PackageName, Requirement};

#[derive(Clone, Debug)]
pub struct CoreMetadata {
    pub name: PackageName,
    pub version: Version,
    pub requires_dist: Vec<Requirement>,
    pub requires_python: Option<VersionSpecifiers>,
    pub provides_extra: Vec<ExtraName>,
}

impl CoreMetadata {
    /// Parse; `origin` (a URL or path) is named in every error.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<CoreMetadata> {
        let (headers, _) = mailparse::parse_headers(bytes)
            .with_context(|| format!("{origin}: core metadata is not in RFC 822 header format"))?;
        let mut name = None;
        let mut version = None;
        let mut requires_dist = Vec::new();
        let mut requires_python = None;
        let mut provides_extra = Vec::new();
        for h in &headers {
            let key = h.get_key();
            let value = h.get_value();
            let value = value.trim();
            match key.to_ascii_lowercase().as_str() {
                "name" => {
                    name = Some(
                        PackageName::from_str(value)
                            .with_context(|| format!("{origin}: Name {value:?}"))?,
                    )
                }
                "version" => {
                    version = Some(
                        Version::from_str(value)
                            .map_err(|e| anyhow::anyhow!("{origin}: Version {value:?}: {e}"))?,
                    )
                }
                "requires-dist" => requires_dist.push(
                    Requirement::from_str(value)
                        .with_context(|| format!("{origin}: Requires-Dist {value:?}"))?,
                ),
                "requires-python" => {
                    requires_python = Some(
                        VersionSpecifiers::from_str(value)
                            .with_context(|| format!("{origin}: Requires-Python {value:?}"))?,
                    )
                }
                "provides-extra" => {
                    if let Ok(extra) = ExtraName::from_str(value) {
                        provides_extra.push(extra);
                    }
                }
                _ => {}
            }
        }
        let (Some(name), Some(version)) = (name, version) else {
            bail!("{origin}: core metadata has no Name or no Version header");
        };
        Ok(CoreMetadata {
            name,
            version,
            requires_dist,
            requires_python,
            provides_extra,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_torch_like_metadata() {
        let text = b"Metadata-Version: 2.4\nName: torch\nVersion: 2.11.0\nRequires-Python: >=3.10\n\
Requires-Dist: filelock\nRequires-Dist: cuda-toolkit[cublas,cudart]==13.0.2; platform_system == \"Linux\"\n\
Requires-Dist: nvidia-nccl-cu13==2.28.9; platform_system == \"Linux\"\nProvides-Extra: optree\n\
Requires-Dist: optree>=0.13.0; extra == \"optree\"\n\nlong description\nRequires-Dist: not-a-header\n";
        let m = CoreMetadata::parse(text, "test").unwrap();
        assert_eq!(m.name.as_ref(), "torch");
        assert_eq!(m.version.to_string(), "2.11.0");
        assert_eq!(m.requires_dist.len(), 4, "the body is not headers");
        assert_eq!(m.requires_dist[1].extras.len(), 2);
        assert_eq!(m.provides_extra.len(), 1);
        assert!(
            CoreMetadata::parse(b"Name: x\n", "origin-url")
                .unwrap_err()
                .to_string()
                .contains("origin-url")
        );
    }
}
