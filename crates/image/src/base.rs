//! The base step's output as the image reads it: `rootfs.tar` (the bottom layer, used as
//! is) and `base.json` (its diff_id, Python version, packages, and the origin of every file).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::layer::Layer;

// One model of base.json: the base step's own (commstack-base, an earlier layer).
pub use commstack_base::manifest::{
    BaseManifest, LayerInfo as BaseLayer, MANIFEST_FILE as BASE_MANIFEST_FILE,
    Package as BasePackage, ROOTFS_FILE,
};

/// An opened base step directory.
#[derive(Clone, Debug)]
pub struct Base {
    pub dir: PathBuf,
    pub manifest: BaseManifest,
}

impl Base {
    /// Reads `base.json` and checks that `rootfs.tar` is there with the recorded size.
    pub fn open(dir: &Path) -> Result<Base> {
        let json = dir.join(BASE_MANIFEST_FILE);
        let text = std::fs::read_to_string(&json).with_context(|| {
            format!(
                "the base step output {} is missing: run `cargo xtask build image` again to rebuild the base step",
                json.display()
            )
        })?;
        let manifest: BaseManifest = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a base manifest", json.display()))?;
        let rootfs = dir.join(ROOTFS_FILE);
        let size = std::fs::metadata(&rootfs).map(|m| m.len()).map_err(|e| {
            anyhow::anyhow!(
                "the base step output {} is missing ({e}): remove {} and run `cargo xtask build image` again to rebuild the base step",
                rootfs.display(),
                dir.display()
            )
        })?;
        if size != manifest.layer.size {
            bail!(
                "{} has {size} bytes, base.json says {}: the base step output is damaged; remove {} and run `cargo xtask build image` again",
                rootfs.display(),
                manifest.layer.size,
                dir.display()
            );
        }
        Ok(Base {
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// The bottom layer (as recorded; [`Base::check_layer`] hashes it).
    pub fn layer(&self) -> Layer {
        Layer {
            path: self.dir.join(ROOTFS_FILE),
            diff_id: self.manifest.layer.diff_id.clone(),
            size: self.manifest.layer.size,
        }
    }

    /// Hashes rootfs.tar and compares it with base.json's diff_id.
    pub fn check_layer(&self) -> Result<()> {
        let path = self.dir.join(ROOTFS_FILE);
        let actual = format!("sha256:{}", commstack_digest::sha256_file(&path)?);
        if actual != self.manifest.layer.diff_id {
            bail!(
                "{} has {actual}, base.json says {}: the base step output is damaged; remove {} and run `cargo xtask build image` again",
                path.display(),
                self.manifest.layer.diff_id,
                self.dir.display()
            );
        }
        Ok(())
    }

    /// `major.minor` of the base's Python (`3.11`).
    pub fn python_minor(&self) -> Result<String> {
        let mut parts = self.manifest.python.split('.');
        match (parts.next(), parts.next()) {
            (Some(major), Some(minor))
                if !major.is_empty() && minor.chars().all(|c| c.is_ascii_digit()) =>
            {
                Ok(format!("{major}.{minor}"))
            }
            _ => bail!(
                "{}: python {:?} is not a `3.X.Y` version",
                self.dir.join(BASE_MANIFEST_FILE).display(),
                self.manifest.python
            ),
        }
    }

    /// The bytes of one regular file of rootfs.tar (`etc/passwd`).
    pub fn read_file(&self, inner: &str) -> Result<Vec<u8>> {
        let path = self.dir.join(ROOTFS_FILE);
        let file = File::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut archive = tar::Archive::new(file);
        for entry in archive
            .entries_with_seek()
            .with_context(|| format!("cannot read {}", path.display()))?
        {
            let mut entry = entry.with_context(|| format!("cannot read {}", path.display()))?;
            let name = entry.path()?.to_string_lossy().into_owned();
            if name.trim_start_matches("./") == inner
                && entry.header().entry_type() == tar::EntryType::Regular
            {
                let mut buf = Vec::new();
                entry.read_to_end(&mut buf)?;
                return Ok(buf);
            }
        }
        bail!("{} has no file {inner}", path.display())
    }
}
