//! What a resolution gives: one wheel per package. Below the solver (provider.rs), which
//! builds it, and the crate's face, which returns it.

use commstack_pypi::IndexFile;
use pep440_rs::Version;
use pep508_rs::{PackageName, Requirement};

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

/// A requirement of a resolved package that an override replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overridden {
    /// The package whose metadata has the requirement (`torch`), at its resolved version;
    /// None for the request's own requirements.
    pub by: Option<(PackageName, Version)>,
    /// As its metadata writes it: `nvidia-nccl-cu13==2.28.9; platform_system == "Linux"`.
    pub original: Requirement,
    /// What was used instead (its specifier, the original's markers).
    pub replacement: Requirement,
}

#[derive(Debug)]
pub struct Resolution {
    /// Sorted by name.
    pub packages: Vec<Resolved>,
    /// The requirements of resolved packages that the request's overrides replaced, in
    /// package order.
    pub overridden: Vec<Overridden>,
}

impl Resolution {
    pub fn get(&self, name: &str) -> Option<&Resolved> {
        self.packages.iter().find(|p| p.name.as_ref() == name)
    }
}
