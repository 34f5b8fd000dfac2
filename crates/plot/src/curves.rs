//! The curves of one self-test report: its lowest rank's put to itself, get from itself
//! and device-to-device copy, each as (bytes, GB/s) by size; put and get over copy.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_kernels::report::{Report, SCHEMA};

/// One report, named for its legend.
#[derive(Clone, Debug)]
pub struct Run {
    /// The file's name without `.json` (its directory too when two runs share a name).
    pub label: String,
    /// The GPU and the NVSHMEM that ran (`NVIDIA H200, NVSHMEM 3.4.5`).
    pub what: String,
    pub curves: Curves,
}

/// (bytes, value) points, ascending in bytes.
pub type Points = Vec<(u64, f64)>;

/// (bytes, GB/s), ascending in bytes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Curves {
    pub put: Points,
    pub get: Points,
    pub copy: Points,
}

impl Curves {
    /// put / copy and get / copy in percent, at the sizes both were measured at.
    pub fn ratios(&self) -> (Points, Points) {
        let copy: BTreeMap<u64, f64> = self.copy.iter().copied().collect();
        let over = |xs: &[(u64, f64)]| {
            xs.iter()
                .filter_map(|(b, g)| {
                    copy.get(b)
                        .filter(|c| **c > 0.0)
                        .map(|c| (*b, 100.0 * g / c))
                })
                .collect()
        };
        (over(&self.put), over(&self.get))
    }

    /// Every size measured, and every bandwidth.
    pub fn sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.put
            .iter()
            .chain(&self.get)
            .chain(&self.copy)
            .map(|(b, _)| *b)
    }

    pub fn max_gbps(&self) -> f64 {
        self.put
            .iter()
            .chain(&self.get)
            .chain(&self.copy)
            .map(|(_, g)| *g)
            .fold(0.0, f64::max)
    }
}

/// The self-test report at `path` as a run.
pub fn read_run(path: &Path) -> Result<Run> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let report: Report = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a self-test report (`commstack-selftest --json FILE` writes one, schema {SCHEMA})",
            path.display()
        )
    })?;
    if report.schema != SCHEMA {
        bail!(
            "{}: schema {:?}, this plot reads {SCHEMA:?}",
            path.display(),
            report.schema
        );
    }
    let Some(rank) = report.ranks.iter().min_by_key(|r| r.rank) else {
        bail!(
            "{}: no rank reported (errors: {})",
            path.display(),
            report.errors.join("; ")
        );
    };
    let own = |xs: &[commstack_kernels::report::PutResult]| -> Vec<(u64, f64)> {
        let mut v: Vec<(u64, f64)> = xs
            .iter()
            .filter(|p| p.src_pe == rank.rank && p.dst_pe == rank.rank)
            .map(|p| (p.bytes, p.gbps))
            .collect();
        v.sort_by_key(|(b, _)| *b);
        v
    };
    let mut copy: Vec<(u64, f64)> = rank.copy.iter().map(|c| (c.bytes, c.gbps)).collect();
    copy.sort_by_key(|(b, _)| *b);
    let curves = Curves {
        put: own(&rank.put),
        get: own(&rank.get),
        copy,
    };
    if curves.put.is_empty() && curves.copy.is_empty() {
        bail!(
            "{}: rank {} has no put or copy results (the self-test's put-get test did not run)",
            path.display(),
            rank.rank
        );
    }
    let label = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    Ok(Run {
        label,
        what: format!(
            "{}, NVSHMEM {}",
            rank.device.name, rank.nvshmem.loaded_version
        ),
        curves,
    })
}
