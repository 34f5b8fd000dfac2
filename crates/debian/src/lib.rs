//! commstack-debian: the Debian side of an image's lock. It reads a mirror the way apt
//! does, trusting nothing unsigned: the suite's `InRelease` is checked with gpgv against
//! the archive keyring ([`release`]), the Packages index must have the size and sha256
//! the signed text lists ([`mirror`]), and only then are its paragraphs read
//! ([`deb822`], [`packages`]). A signed index must also be current ([`freshness`]): not
//! expired, not from the future, not older than a stated age or than the one the lock
//! already recorded. Every download is bounded in bytes and time ([`mirror::IndexBounds`]). [`resolve`] computes the package set of an mmdebstrap
//! `essential` base with extra packages, with Debian's version order ([`version`]).
//!
//! The result ([`LockedBase`]) is what `lock` writes as `[base]` and `[[deb]]`.

pub mod deb822;
pub mod freshness;
pub mod mirror;
pub mod packages;
pub mod release;
pub mod resolve;
pub mod version;

use std::path::PathBuf;

use anyhow::Result;

pub use packages::Package;

/// What to lock: one suite of one mirror, one architecture, component `main`.
#[derive(Clone, Debug)]
pub struct BaseRequest {
    /// The mirror's root URL (it has `dists/` and `pool/`), without a trailing slash.
    pub mirror: String,
    pub suite: String,
    /// Debian's architecture name (`amd64`, `arm64`).
    pub architecture: String,
    pub keyring: PathBuf,
    /// Packages on top of the `essential` set.
    pub include: Vec<String>,
    /// What the signed index's dates are judged against.
    pub freshness: freshness::Freshness,
    pub bounds: mirror::IndexBounds,
}

/// A base's locked package set and where it was read from.
#[derive(Clone, Debug)]
pub struct LockedBase {
    /// `Date:` of the signed InRelease.
    pub release_date: jiff::Timestamp,
    /// sha256 of the Packages index read (the compressed file, as the InRelease lists it).
    pub packages_sha256: String,
    /// The closure, sorted by name.
    pub packages: Vec<Package>,
}

impl LockedBase {
    /// A package's download URL: the mirror root and its pool path.
    pub fn url(mirror: &str, package: &Package) -> String {
        format!("{}/{}", mirror.trim_end_matches('/'), package.filename)
    }
}

/// Read the mirror's signed index and resolve the base's package set.
pub async fn lock_base(request: &BaseRequest) -> Result<LockedBase> {
    let client = mirror::Mirror::new(&request.mirror, request.bounds.clone())?;
    let index = client
        .index(
            &request.suite,
            "main",
            &request.architecture,
            &request.keyring,
            &request.freshness,
        )
        .await?;
    let universe = resolve::Universe::new(&index.packages, &request.architecture);
    let packages = resolve::essential_closure(&universe, &request.include)?
        .into_iter()
        .cloned()
        .collect();
    Ok(LockedBase {
        release_date: index.release.date,
        packages_sha256: index.packages_sha256,
        packages,
    })
}
