//! The PubGrub dependency provider: index pages and metadata, fetched ahead in parallel.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use anyhow::{Result, anyhow};
use commstack_pypi::tags::TargetTags;
use commstack_pypi::{CoreMetadata, IndexClient, TargetPlatform};
use pep440_rs::Version;
use pep508_rs::{ExtraName, MarkerEnvironment, PackageName, Requirement, VersionOrUrl};
use pubgrub::{
    Dependencies, DependencyProvider, PackageResolutionStatistics, Ranges, SelectedDependencies,
};
use tokio::runtime::Handle;
use tokio::sync::OnceCell;

use crate::candidates::Candidates;
use crate::resolution::{Overridden, Resolution, Resolved};

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pkg {
    Root,
    Dist(PackageName),
    Extra(PackageName, ExtraName),
}

impl Pkg {
    fn name(&self) -> Option<&PackageName> {
        match self {
            Pkg::Root => None,
            Pkg::Dist(n) | Pkg::Extra(n, _) => Some(n),
        }
    }
}

impl fmt::Display for Pkg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pkg::Root => write!(f, "the stack"),
            Pkg::Dist(n) => write!(f, "{n}"),
            Pkg::Extra(n, e) => write!(f, "{n}[{e}]"),
        }
    }
}

/// An error the solver can carry (anyhow::Error is not a std Error).
#[derive(Debug)]
pub struct ProviderError(pub String);

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProviderError {}

type PageCell = Arc<OnceCell<Result<Arc<Candidates>, String>>>;
type MetaCell = Arc<OnceCell<Result<Arc<CoreMetadata>, String>>>;

struct Inner {
    client: IndexClient,
    tags: TargetTags,
    markers: MarkerEnvironment,
    python: Version,
    exclude_newer: Option<jiff::Timestamp>,
    pages: Mutex<HashMap<PackageName, PageCell>>,
    metas: Mutex<HashMap<(PackageName, Version), MetaCell>>,
    discovered: Mutex<HashMap<Pkg, usize>>,
}

/// What the request asks for: its requirements, and the overrides of anyone's requirement
/// on the same names.
pub struct Asked {
    pub roots: Vec<Requirement>,
    pub overrides: Vec<Requirement>,
}

pub struct Provider {
    inner: Arc<Inner>,
    handle: Handle,
    roots: Vec<Requirement>,
    overrides: Vec<Requirement>,
    /// Every override applied, for any version the solver looked at (finish keeps those
    /// of the chosen versions).
    overridden: Mutex<BTreeSet<OverrideKey>>,
}

/// (the package and version whose requirement it was, the original, the replacement), as
/// text so that it orders.
type OverrideKey = (Option<(PackageName, Version)>, String, String);

impl Provider {
    pub fn new(
        client: IndexClient,
        handle: Handle,
        target: TargetPlatform,
        markers: MarkerEnvironment,
        python: Version,
        exclude_newer: Option<jiff::Timestamp>,
        asked: Asked,
    ) -> Provider {
        let Asked { roots, overrides } = asked;
        let inner = Arc::new(Inner {
            client,
            tags: TargetTags::new(&target),
            markers,
            python,
            exclude_newer,
            pages: Mutex::default(),
            metas: Mutex::default(),
            discovered: Mutex::default(),
        });
        let provider = Provider {
            inner,
            handle,
            roots,
            overrides,
            overridden: Mutex::default(),
        };
        // Start on the roots at once.
        if let Ok(deps) = provider.deps_of(provider.roots.iter(), &[], None) {
            provider.prefetch(&deps);
        }
        provider
    }

    /// `reqs` (of the package `by`, None for the roots) with the overrides applied, as
    /// solver terms: an override replaces the specifier of a requirement on its name, the
    /// requirement's markers and extras stay. Each replacement whose markers hold is recorded.
    fn deps_of<'a>(
        &self,
        reqs: impl Iterator<Item = &'a Requirement>,
        extras: &[ExtraName],
        by: Option<(&PackageName, &Version)>,
    ) -> Result<Vec<(Pkg, Ranges<Version>)>, ProviderError> {
        let mut used = Vec::new();
        for req in reqs {
            let Some(o) = self.overrides.iter().find(|o| o.name == req.name) else {
                used.push(req.clone());
                continue;
            };
            let mut replaced = req.clone();
            replaced.version_or_url = o.version_or_url.clone();
            if req.evaluate_markers(&self.inner.markers, extras) {
                self.overridden.lock().unwrap().insert((
                    by.map(|(n, v)| (n.clone(), v.clone())),
                    req.to_string(),
                    replaced.to_string(),
                ));
            }
            used.push(replaced);
        }
        requirements_to_deps(used.iter(), &self.inner.markers, extras)
    }

    /// The overrides applied to the requirements of the packages in `selected`.
    fn overridden_in(&self, selected: &SelectedDependencies<Pkg, Version>) -> Vec<Overridden> {
        let chosen = |n: &PackageName, v: &Version| {
            selected
                .iter()
                .any(|(p, sv)| *p == Pkg::Dist(n.clone()) && sv == v)
        };
        let parse = |s: &str| Requirement::from_str(s).expect("written by Requirement's Display");
        self.overridden
            .lock()
            .unwrap()
            .iter()
            .filter(|(by, _, _)| by.as_ref().is_none_or(|(n, v)| chosen(n, v)))
            .map(|(by, original, replacement)| Overridden {
                by: by.clone(),
                original: parse(original),
                replacement: parse(replacement),
            })
            .collect()
    }

    fn prefetch(&self, deps: &[(Pkg, Ranges<Version>)]) {
        for (pkg, range) in deps {
            let Some(name) = pkg.name().cloned() else {
                continue;
            };
            let inner = self.inner.clone();
            let range = range.clone();
            self.handle.spawn(async move {
                if let Ok(c) = inner.clone().page(&name).await
                    && let Some(v) = c.choose(&range)
                {
                    let _ = inner.metadata(&name, v, &c).await;
                }
            });
        }
    }

    fn page(&self, name: &PackageName) -> Result<Arc<Candidates>, ProviderError> {
        let inner = self.inner.clone();
        self.handle
            .block_on(inner.page(name))
            .map_err(ProviderError)
    }

    fn metadata(
        &self,
        name: &PackageName,
        version: &Version,
    ) -> Result<Arc<CoreMetadata>, ProviderError> {
        let candidates = self.page(name)?;
        self.handle
            .block_on(self.inner.metadata(name, version, &candidates))
            .map_err(ProviderError)
    }

    /// Turn the solver's answer into resolved packages with their chosen wheels.
    pub fn finish(&self, selected: &SelectedDependencies<Pkg, Version>) -> Result<Resolution> {
        let mut extras: BTreeMap<PackageName, Vec<ExtraName>> = BTreeMap::new();
        for (pkg, _) in selected.iter() {
            if let Pkg::Extra(n, e) = pkg {
                extras.entry(n.clone()).or_default().push(e.clone());
            }
        }
        let mut packages = Vec::new();
        for (pkg, version) in selected.iter() {
            let Pkg::Dist(name) = pkg else { continue };
            let candidates = self.page(name).map_err(|e| anyhow!(e))?;
            let wheel = candidates.versions[version].wheel.clone();
            let meta = self.metadata(name, version).map_err(|e| anyhow!(e))?;
            let mut requires = BTreeSet::new();
            let used: &[ExtraName] = extras.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let mut activations: Vec<&[ExtraName]> = vec![&[]];
            for e in used {
                activations.push(std::slice::from_ref(e));
            }
            for extras in activations {
                for req in &meta.requires_dist {
                    if req.evaluate_markers(&self.inner.markers, extras) && req.name != *name {
                        requires.insert(req.name.clone());
                    }
                }
            }
            packages.push(Resolved {
                name: name.clone(),
                version: version.clone(),
                wheel,
                requires: requires.into_iter().collect(),
            });
        }
        packages.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Resolution {
            packages,
            overridden: self.overridden_in(selected),
        })
    }

    fn discovery(&self, pkg: &Pkg) -> usize {
        let mut d = self.inner.discovered.lock().unwrap();
        let next = d.len();
        *d.entry(pkg.clone()).or_insert(next)
    }

    /// Explain packages that had no usable version: the solver's report says "no versions",
    /// this says why (platform, Requires-Python, exclude-newer, not on the index).
    fn explain_missing(&self, name: &PackageName) -> String {
        let pages = self.inner.pages.lock().unwrap();
        let Some(Some(Ok(c))) = pages.get(name).map(|cell| cell.get().cloned()) else {
            return String::new();
        };
        let reasons: Vec<String> = c
            .excluded
            .iter()
            .take(3)
            .map(|(v, why)| format!("{name} {v}: {why}"))
            .collect();
        reasons.join("; ")
    }
}

impl Inner {
    async fn page(self: Arc<Self>, name: &PackageName) -> Result<Arc<Candidates>, String> {
        let cell = self
            .pages
            .lock()
            .unwrap()
            .entry(name.clone())
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            match self.client.project(name).await {
                Ok(Some(page)) => Ok(Arc::new(Candidates::new(
                    &page,
                    &self.tags,
                    &self.python,
                    self.exclude_newer,
                ))),
                Ok(None) => Err(format!(
                    "{name} is not on the index ({})",
                    self.client.page_url(name)
                )),
                Err(e) => Err(format!("{e:#}")),
            }
        })
        .await
        .clone()
    }

    async fn metadata(
        &self,
        name: &PackageName,
        version: &Version,
        candidates: &Candidates,
    ) -> Result<Arc<CoreMetadata>, String> {
        let cell = self
            .metas
            .lock()
            .unwrap()
            .entry((name.clone(), version.clone()))
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            let Some(c) = candidates.versions.get(version) else {
                return Err(format!("{name} {version} has no wheel for the target"));
            };
            let meta = self
                .client
                .metadata(&c.wheel)
                .await
                .map_err(|e| format!("{e:#}"))?;
            if meta.version != *version {
                return Err(format!(
                    "{}: metadata says version {}, the file name says {version}",
                    c.wheel.url, meta.version
                ));
            }
            Ok(Arc::new(meta))
        })
        .await
        .clone()
    }
}

/// Requirements (already filtered by nothing) to solver terms, keeping those whose markers
/// hold for the target with `extras` active. Several requirements on one package intersect.
fn requirements_to_deps<'a>(
    reqs: impl Iterator<Item = &'a Requirement>,
    markers: &MarkerEnvironment,
    extras: &[ExtraName],
) -> Result<Vec<(Pkg, Ranges<Version>)>, ProviderError> {
    let mut out: Vec<(Pkg, Ranges<Version>)> = Vec::new();
    let mut add = |pkg: Pkg, range: Ranges<Version>| match out.iter_mut().find(|(p, _)| *p == pkg) {
        Some((_, r)) => *r = r.intersection(&range),
        None => out.push((pkg, range)),
    };
    for req in reqs {
        if !req.evaluate_markers(markers, extras) {
            continue;
        }
        let range = match &req.version_or_url {
            None => Ranges::full(),
            Some(VersionOrUrl::VersionSpecifier(spec)) => Ranges::from(spec.clone()),
            Some(VersionOrUrl::Url(url)) => {
                return Err(ProviderError(format!(
                    "{} is required from a URL ({url}): commstack locks only index packages with hashes",
                    req.name
                )));
            }
        };
        add(Pkg::Dist(req.name.clone()), range.clone());
        for e in &req.extras {
            add(Pkg::Extra(req.name.clone(), e.clone()), range.clone());
        }
    }
    Ok(out)
}

impl DependencyProvider for Provider {
    type P = Pkg;
    type V = Version;
    type VS = Ranges<Version>;
    type M = String;
    type Err = ProviderError;
    type Priority = (u32, bool, Reverse<usize>);

    fn prioritize(
        &self,
        pkg: &Pkg,
        range: &Ranges<Version>,
        stats: &PackageResolutionStatistics,
    ) -> Self::Priority {
        // Conflicting packages first, then exact pins (cheap, and they fix the rest), then
        // breadth-first in discovery order.
        (
            stats.conflict_count(),
            range.as_singleton().is_some(),
            Reverse(self.discovery(pkg)),
        )
    }

    fn choose_version(
        &self,
        pkg: &Pkg,
        range: &Ranges<Version>,
    ) -> Result<Option<Version>, ProviderError> {
        let name = match pkg {
            Pkg::Root => return Ok(Some(Version::new([0]))),
            Pkg::Dist(n) | Pkg::Extra(n, _) => n,
        };
        let candidates = match self.page(name) {
            Ok(c) => c,
            // Not on the index: no versions (the report explains); transport errors abort.
            Err(e) if e.0.contains("is not on the index") => return Ok(None),
            Err(e) => return Err(e),
        };
        let chosen = candidates.choose(range).cloned();
        if let Some(v) = &chosen {
            // Start the metadata download now; get_dependencies will wait for it.
            let inner = self.inner.clone();
            let (name, v, c) = (name.clone(), v.clone(), candidates.clone());
            self.handle.spawn(async move {
                let _ = inner.metadata(&name, &v, &c).await;
            });
        }
        Ok(chosen)
    }

    fn get_dependencies(
        &self,
        pkg: &Pkg,
        version: &Version,
    ) -> Result<Dependencies<Pkg, Ranges<Version>, String>, ProviderError> {
        let deps = match pkg {
            Pkg::Root => self.deps_of(self.roots.iter(), &[], None)?,
            Pkg::Dist(name) => {
                let meta = self.metadata(name, version)?;
                if let Some(rp) = &meta.requires_python
                    && !rp.contains(&self.inner.python)
                {
                    return Ok(Dependencies::Unavailable(format!(
                        "Requires-Python {rp} in its metadata"
                    )));
                }
                self.deps_of(
                    meta.requires_dist.iter().filter(|r| r.name != *name),
                    &[],
                    Some((name, version)),
                )?
            }
            Pkg::Extra(name, extra) => {
                let meta = self.metadata(name, version)?;
                // Like pip and uv, an extra the package does not provide adds nothing (no error).
                let mut deps = vec![(Pkg::Dist(name.clone()), Ranges::singleton(version.clone()))];
                let own = self.deps_of(
                    meta.requires_dist.iter(),
                    std::slice::from_ref(extra),
                    Some((name, version)),
                )?;
                deps.extend(
                    own.into_iter()
                        .filter(|(p, _)| *p != Pkg::Dist(name.clone()) && *p != *pkg),
                );
                deps
            }
        };
        for (p, _) in &deps {
            self.discovery(p);
        }
        self.prefetch(&deps);
        Ok(Dependencies::Available(deps.into_iter().collect()))
    }
}

impl Provider {
    /// Notes for a failed resolution: for each package the report mentions, why versions
    /// of it were left out (platform, Requires-Python, exclude-newer).
    pub fn notes(&self, report: &str) -> Vec<String> {
        let names: Vec<PackageName> = self.inner.pages.lock().unwrap().keys().cloned().collect();
        let mut names: Vec<PackageName> = names
            .into_iter()
            .filter(|n| report.contains(n.as_ref()))
            .collect();
        names.sort();
        names
            .iter()
            .map(|n| self.explain_missing(n))
            .filter(|s| !s.is_empty())
            .collect()
    }
}
