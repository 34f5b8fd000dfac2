//! The versions of one project that the target can install, each with its best wheel.

use std::collections::BTreeMap;

use commstack_pypi::tags::TargetTags;
use commstack_pypi::{IndexFile, ProjectPage};
use pep440_rs::Version;

#[derive(Debug)]
pub struct Candidate {
    pub wheel: IndexFile,
    pub yanked: bool,
}

#[derive(Debug)]
pub struct Candidates {
    pub versions: BTreeMap<Version, Candidate>,
    /// Why versions were left out, for error messages: (version, reason), newest first.
    pub excluded: Vec<(Version, String)>,
}

impl Candidates {
    pub fn new(
        page: &ProjectPage,
        tags: &TargetTags,
        python: &Version,
        exclude_newer: Option<jiff::Timestamp>,
    ) -> Candidates {
        let mut best: BTreeMap<Version, (usize, Candidate)> = BTreeMap::new();
        let mut excluded: BTreeMap<Version, String> = BTreeMap::new();
        for file in &page.files {
            let Some(wheel) = &file.wheel else { continue };
            let version = wheel.version.clone();
            if let (Some(limit), Some(uploaded)) = (exclude_newer, file.upload_time)
                && uploaded > limit
            {
                excluded
                    .entry(version)
                    .or_insert_with(|| format!("uploaded {uploaded}, after exclude-newer {limit}"));
                continue;
            }
            if let Some(rp) = &file.requires_python
                && !rp.contains(python)
            {
                excluded
                    .entry(version)
                    .or_insert_with(|| format!("Requires-Python {rp} excludes {python}"));
                continue;
            }
            let Some(priority) = tags.wheel_priority(wheel) else {
                excluded
                    .entry(version)
                    .or_insert_with(|| "no wheel for the target platform".to_string());
                continue;
            };
            let candidate = Candidate {
                wheel: file.clone(),
                yanked: file.yanked.is_some(),
            };
            match best.get(&version) {
                Some((p, c)) if *p < priority || (*p == priority && !c.yanked) => {}
                _ => {
                    best.insert(version, (priority, candidate));
                }
            }
        }
        let versions: BTreeMap<Version, Candidate> =
            best.into_iter().map(|(v, (_, c))| (v, c)).collect();
        let excluded = excluded
            .into_iter()
            .rev()
            .filter(|(v, _)| !versions.contains_key(v))
            .collect();
        Candidates { versions, excluded }
    }

    /// The version to pick in `range`: the newest final release; pre-releases only when
    /// nothing else fits; yanked files only when pinned exactly (PEP 592).
    pub fn choose(&self, range: &pubgrub::Ranges<Version>) -> Option<&Version> {
        let pinned = range.as_singleton();
        let usable = |(v, c): &(&Version, &Candidate)| {
            range.contains(*v) && (!c.yanked || pinned == Some(*v))
        };
        let mut in_range = self.versions.iter().rev().filter(usable);
        let newest = in_range.clone().next()?;
        in_range
            .find(|(v, _)| !v.any_prerelease())
            .or(Some(newest))
            .map(|(v, _)| v)
    }
}
