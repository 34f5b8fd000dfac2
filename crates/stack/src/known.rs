//! The known-hash table for published source releases (`known-sources.toml`).

use std::sync::OnceLock;

use serde::Deserialize;

use crate::model::DeepEpApi;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Table {
    nvshmem: Vec<NvshmemRelease>,
    deepep: Vec<DeepEpRev>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NvshmemRelease {
    pub version: String,
    pub url: String,
    pub sha256: String,
    /// Where the sha256 was published.
    pub sha256_from: String,
    /// The matching tag of github.com/NVIDIA/nvshmem.
    pub git_tag: String,
    /// commstack tree hash of the unpacked release, when known.
    pub tree: Option<String>,
    /// What the tree hash was computed from.
    pub tree_from: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DeepEpRev {
    pub rev: String,
    pub note: String,
    api: String,
    /// Result of `rules::deepep_v1_has_rdc_fix` on this revision's sources.
    pub rdc_fix: Option<bool>,
    pub tree: Option<String>,
}

impl DeepEpRev {
    pub fn api(&self) -> DeepEpApi {
        if self.api == "v2" {
            DeepEpApi::V2
        } else {
            DeepEpApi::V1
        }
    }
}

pub(crate) const TABLE_TEXT: &str = include_str!("known-sources.toml");

fn table() -> &'static Table {
    static TABLE: OnceLock<Table> = OnceLock::new();
    TABLE.get_or_init(|| toml::from_str(TABLE_TEXT).expect("known-sources.toml parses (tested)"))
}

pub fn nvshmem_release(version: &str) -> Option<&'static NvshmemRelease> {
    table().nvshmem.iter().find(|r| r.version == version)
}

pub fn nvshmem_versions() -> Vec<&'static str> {
    table().nvshmem.iter().map(|r| r.version.as_str()).collect()
}

/// A revision given as a prefix of at least 7 hex digits; None if unknown or ambiguous.
pub fn deepep_rev(rev: &str) -> Option<&'static DeepEpRev> {
    let mut hits = table().deepep.iter().filter(|r| r.rev.starts_with(rev));
    let first = hits.next()?;
    hits.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_parses_and_is_consistent() {
        assert!(nvshmem_release("3.4.5").is_some());
        for r in &table().nvshmem {
            assert_eq!(r.sha256.len(), 64, "{}", r.version);
            assert!(
                r.url
                    .ends_with(&format!("nvshmem_src_cuda12-all-all-{}.tar.gz", r.version))
            );
        }
        for r in &table().deepep {
            assert_eq!(r.rev.len(), 40);
            assert!(
                r.tree
                    .as_ref()
                    .is_some_and(|t| t.starts_with("sha256:") && t.len() == 71),
                "{}",
                r.rev
            );
        }
        assert_eq!(deepep_rev("567632d").unwrap().api(), DeepEpApi::V1);
        assert_eq!(deepep_rev("567632d").unwrap().rdc_fix, Some(true));
        assert!(deepep_rev("0000000").is_none());
    }
}
