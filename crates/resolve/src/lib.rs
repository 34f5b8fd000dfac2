//! Resolve Python requirements for one target (CPython version, arch, glibc) to exactly one
//! wheel per package.
//!
//! The solver is PubGrub (the algorithm and crate uv uses); versions and ranges are PEP 440
//! (pep440_rs converts specifiers to ranges with PEP 440's rules for pre-, post- and local
//! versions). Packages with extras are modelled the usual way: `torch[x]` is a package of
//! its own that depends on `torch` at the same version plus the requirements of extra `x`.
//!
//! Network work is the slow part, so it is done ahead: whenever a package's dependencies are
//! known, the project pages of all of them are fetched in parallel, and as soon as a page
//! arrives the metadata of the version most likely to be chosen is fetched too. The solver
//! itself runs on a blocking thread and waits only for what it really needs next.

mod candidates;
mod provider;
mod resolution;

use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use commstack_pypi::{IndexClient, TargetPlatform};
use pep440_rs::Version;
use pep508_rs::{MarkerEnvironment, MarkerEnvironmentBuilder, Requirement};
use pubgrub::PubGrubError;

use crate::provider::{Asked, Pkg, Provider};
pub use crate::resolution::{Overridden, Resolution, Resolved};

/// What to resolve.
#[derive(Clone, Debug)]
pub struct Request {
    pub requirements: Vec<Requirement>,
    pub target: TargetPlatform,
    /// Full interpreter version for markers (`python_full_version`), e.g. 3.12.3.
    pub python_full: (u64, u64, u64),
    /// Ignore files uploaded after this time.
    pub exclude_newer: Option<jiff::Timestamp>,
    /// Requirements that replace every package's requirement on the same name, as uv's
    /// `override-dependencies` do: the version specifier of the override is taken, the
    /// markers and extras of the requirement it replaces are kept (an override never adds a
    /// dependency a package does not have on the target). Each one applied is recorded in
    /// [`Resolution::overridden`].
    pub overrides: Vec<Requirement>,
}

/// The marker environment of a CPython on Linux.
pub fn marker_environment(
    target: &TargetPlatform,
    python_full: (u64, u64, u64),
) -> Result<MarkerEnvironment> {
    let full = format!("{}.{}.{}", python_full.0, python_full.1, python_full.2);
    let short = format!("{}.{}", target.python.0, target.python.1);
    MarkerEnvironment::try_from(MarkerEnvironmentBuilder {
        implementation_name: "cpython",
        implementation_version: &full,
        os_name: "posix",
        platform_machine: &target.arch,
        platform_python_implementation: "CPython",
        platform_release: "",
        platform_system: "Linux",
        platform_version: "",
        python_full_version: &full,
        python_version: &short,
        sys_platform: "linux",
    })
    .map_err(|e| anyhow!("cannot build the marker environment: {e}"))
}

/// Resolve. Must be called from within a multi-threaded tokio runtime.
pub async fn resolve(client: &IndexClient, request: &Request) -> Result<Resolution> {
    let markers = marker_environment(&request.target, request.python_full)?;
    let (a, b, c) = request.python_full;
    let python = Version::from_str(&format!("{a}.{b}.{c}")).expect("a version");
    let provider = Arc::new(Provider::new(
        client.clone(),
        tokio::runtime::Handle::current(),
        request.target.clone(),
        markers,
        python,
        request.exclude_newer,
        Asked {
            roots: request.requirements.clone(),
            overrides: request.overrides.clone(),
        },
    ));
    let p = provider.clone();
    // The solver calls back synchronously and waits for the network: it runs on a
    // blocking thread, and so does turning its answer into wheels (which may wait too).
    let (solved, finished) = tokio::task::spawn_blocking(move || {
        let solved = pubgrub::resolve(&*p, Pkg::Root, Version::from_str("0").unwrap());
        let finished = solved.as_ref().ok().map(|s| p.finish(s));
        (solved, finished)
    })
    .await
    .context("the resolver thread panicked")?;
    match solved {
        Ok(_) => {}
        Err(PubGrubError::NoSolution(mut tree)) => {
            tree.collapse_no_versions();
            let report =
                <pubgrub::DefaultStringReporter as pubgrub::Reporter<_, _, _>>::report(&tree);
            let notes = provider.notes(&report);
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!("\nwhy versions were left out: {}", notes.join("; "))
            };
            return Err(anyhow!(
                "the requirements cannot be satisfied for {} / {}:\n{report}{notes}",
                request.target.python_tag(),
                request.target.platform_tag()
            ));
        }
        Err(PubGrubError::ErrorRetrievingDependencies {
            package,
            version,
            source,
        }) => {
            return Err(anyhow!("{source}")
                .context(format!("reading the dependencies of {package} {version}")));
        }
        Err(PubGrubError::ErrorChoosingVersion { package, source }) => {
            return Err(anyhow!("{source}").context(format!("choosing a version of {package}")));
        }
        Err(err) => return Err(anyhow!("resolution failed: {err:?}")),
    }
    finished.expect("finished when solved")
}
