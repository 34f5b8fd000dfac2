//! What a resolution gives: one wheel per package. Below the solver (provider.rs), which
//! builds it, and the crate's face, which returns it.

use commstack_pypi::IndexFile;
use pep440_rs::Version;
use pep508_rs::PackageName;

/// One resolved package.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub name: PackageName,
    pub version: Version,
    /// The wheel chosen for the target (best platform tag).
    pub wheel: IndexFile,
    /// Packages this one requires in the target, after markers and the extras in use.
    pub requires: Vec<PackageName>,
}

#[derive(Debug)]
pub struct Resolution {
    /// Sorted by name.
    pub packages: Vec<Resolved>,
}

impl Resolution {
    pub fn get(&self, name: &str) -> Option<&Resolved> {
        self.packages.iter().find(|p| p.name.as_ref() == name)
    }
}
