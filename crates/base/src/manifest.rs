//! `base.json`: what the base step made, for the image step (commstack-image) to read.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub const MANIFEST_FILE: &str = "base.json";
pub const ROOTFS_FILE: &str = "rootfs.tar";

/// The base layer's identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// `sha256:<hex>` of `rootfs.tar` (uncompressed): the image config's diff_id.
    pub diff_id: String,
    pub size: u64,
}

/// One installed package (what dpkg says, equal to the lock's `[[deb]]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    pub name: String,
    pub version: String,
    pub architecture: String,
    /// The .deb's sha256, from the lock (checked before the build).
    pub sha256: String,
}

/// `<step>/base.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaseManifest {
    pub schema: u32,
    /// The base step's key (sha256 hex).
    pub key: String,
    /// SOURCE_DATE_EPOCH: every mtime in rootfs.tar is at most this.
    pub epoch: u64,
    pub suite: String,
    pub architecture: String,
    /// The base's Python, e.g. "3.11.2" (from the installed python3.X package).
    pub python: String,
    /// mmdebstrap's version, e.g. "1.3.5".
    pub mmdebstrap: String,
    /// How the network was cut while mmdebstrap ran: "unshare --net" or "none".
    pub network_isolation: String,
    pub layer: LayerInfo,
    /// Sorted by name, then architecture.
    pub packages: Vec<Package>,
    /// Every file and symlink of rootfs.tar -> "deb:<package>" or "generated:<rule id>".
    pub files: BTreeMap<String, String>,
    /// Generated-file rule id -> how many files it claimed (0 included).
    pub generated_rules: BTreeMap<String, u64>,
}

impl BaseManifest {
    /// Read `dir/base.json` (a base step's directory).
    pub fn open(dir: &Path) -> Result<BaseManifest> {
        let path = dir.join(MANIFEST_FILE);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}: not a complete base step (build it again: `cargo xtask build image`)",
                path.display()
            )
        })?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a base manifest", path.display()))
    }

    pub(crate) fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_FILE);
        fs::write(&path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    }
}
