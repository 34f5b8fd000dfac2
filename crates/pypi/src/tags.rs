//! Which wheels a target can install, best first: the order of `packaging.tags.sys_tags()`
//! (what pip and uv use) for a CPython on manylinux.

use std::collections::HashMap;

use commstack_wheel::WheelFilename;

/// The target interpreter and platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPlatform {
    /// CPython (major, minor).
    pub python: (u64, u64),
    /// "x86_64" or "aarch64".
    pub arch: String,
    /// Newest glibc of the target: manylinux_2_X wheels with X above it are refused.
    pub glibc: (u32, u32),
}

impl TargetPlatform {
    pub fn python_tag(&self) -> String {
        format!("cp{}{}", self.python.0, self.python.1)
    }

    /// The most specific platform tag, e.g. `manylinux_2_39_x86_64`.
    pub fn platform_tag(&self) -> String {
        format!("manylinux_{}_{}_{}", self.glibc.0, self.glibc.1, self.arch)
    }
}

/// Tag triples the target accepts, each with its priority (0 is best).
#[derive(Clone, Debug)]
pub struct TargetTags {
    priority: HashMap<(String, String, String), usize>,
}

impl TargetTags {
    pub fn new(target: &TargetPlatform) -> TargetTags {
        let platforms = platforms(target);
        let (major, minor) = target.python;
        let cp = format!("cp{major}{minor}");
        let mut order: Vec<(String, String, String)> = Vec::new();
        let mut push =
            |py: &str, abi: &str, plat: &str| order.push((py.into(), abi.into(), plat.into()));

        // cpython_tags(): the interpreter's own ABI, then abi3, then none.
        for abi in [cp.as_str(), "abi3", "none"] {
            for p in &platforms {
                push(&cp, abi, p);
            }
        }
        // abi3 wheels built for older CPython 3.x.
        for m in (2..minor).rev() {
            for p in &platforms {
                push(&format!("cp{major}{m}"), "abi3", p);
            }
        }
        // compatible_tags(): pyXY / py3 / older pyXY with no ABI on the platform...
        let mut py_versions = vec![format!("py{major}{minor}"), format!("py{major}")];
        py_versions.extend((0..minor).rev().map(|m| format!("py{major}{m}")));
        for py in &py_versions {
            for p in &platforms {
                push(py, "none", p);
            }
        }
        // ...then pure Python wheels.
        push(&cp, "none", "any");
        for py in &py_versions {
            push(py, "none", "any");
        }

        let mut priority = HashMap::new();
        for (i, t) in order.into_iter().enumerate() {
            priority.entry(t).or_insert(i);
        }
        TargetTags { priority }
    }

    /// Priority of one tag triple (lower is better), None if the target cannot install it.
    pub fn priority(&self, py: &str, abi: &str, platform: &str) -> Option<usize> {
        self.priority
            .get(&(py.to_string(), abi.to_string(), platform.to_string()))
            .copied()
    }
}

impl TargetTags {
    /// The best priority of any tag the wheel claims (its compressed tag sets expanded),
    /// None if the target can use none of them.
    pub fn wheel_priority(&self, wheel: &WheelFilename) -> Option<usize> {
        wheel
            .tags()
            .iter()
            .filter_map(|t| self.priority(&t.python, &t.abi, &t.platform))
            .min()
    }
}

/// manylinux_2_X down to manylinux_2_5 with the legacy aliases where pip puts them.
fn platforms(target: &TargetPlatform) -> Vec<String> {
    let arch = &target.arch;
    let mut out = Vec::new();
    let (_, newest) = target.glibc;
    // x86_64 manylinux starts at glibc 2.5, aarch64 at 2.17.
    let oldest = if arch == "x86_64" { 5 } else { 17 };
    for minor in (oldest..=newest).rev() {
        out.push(format!("manylinux_2_{minor}_{arch}"));
        match minor {
            17 => out.push(format!("manylinux2014_{arch}")),
            12 => out.push(format!("manylinux2010_{arch}")),
            5 => out.push(format!("manylinux1_{arch}")),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(glibc: u32) -> TargetTags {
        TargetTags::new(&TargetPlatform {
            python: (3, 12),
            arch: "x86_64".into(),
            glibc: (2, glibc),
        })
    }

    #[test]
    fn newer_glibc_is_refused_and_order_follows_pip() {
        let tags = t(28);
        assert!(
            tags.priority("cp312", "cp312", "manylinux_2_39_x86_64")
                .is_none()
        );
        let p228 = tags
            .priority("cp312", "cp312", "manylinux_2_28_x86_64")
            .unwrap();
        let p2014 = tags
            .priority("cp312", "cp312", "manylinux2014_x86_64")
            .unwrap();
        let p217 = tags
            .priority("cp312", "cp312", "manylinux_2_17_x86_64")
            .unwrap();
        assert!(p228 < p217 && p217 < p2014, "{p228} {p217} {p2014}");
        let abi3 = tags
            .priority("cp39", "abi3", "manylinux_2_28_x86_64")
            .unwrap();
        let py3 = tags
            .priority("py3", "none", "manylinux_2_28_x86_64")
            .unwrap();
        let any = tags.priority("py3", "none", "any").unwrap();
        assert!(p2014 < abi3 && abi3 < py3 && py3 < any);
        assert!(
            tags.priority("cp311", "cp311", "manylinux_2_28_x86_64")
                .is_none()
        );
        assert!(
            tags.priority("cp312", "cp312", "manylinux_2_28_aarch64")
                .is_none()
        );
        assert!(
            tags.priority("cp312", "cp312", "macosx_11_0_arm64")
                .is_none()
        );
        assert!(
            tags.priority("py2.py3", "none", "any").is_none(),
            "compound tags are split by the caller"
        );
        assert!(tags.priority("py2", "none", "any").is_none());
    }

    #[test]
    fn wheels_take_the_best_priority_of_their_tags() {
        let tags = t(17);
        let w = WheelFilename::parse(
            "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.manylinux2014_x86_64.whl",
        )
        .unwrap();
        assert_eq!(
            tags.wheel_priority(&w),
            tags.priority("py3", "none", "manylinux2014_x86_64"),
            "manylinux2014 alias is accepted at glibc 2.17, manylinux_2_18 is not"
        );
        let universal = WheelFilename::parse("six-1.16.0-py2.py3-none-any.whl").unwrap();
        assert_eq!(
            tags.wheel_priority(&universal),
            tags.priority("py3", "none", "any")
        );
        let mac = WheelFilename::parse("pkg-1.0-cp312-cp312-macosx_11_0_arm64.whl").unwrap();
        assert!(tags.wheel_priority(&mac).is_none());
    }

    #[test]
    fn manylinux_2_25_needs_glibc_2_25() {
        assert!(
            t(24)
                .priority("py3", "none", "manylinux_2_25_x86_64")
                .is_none()
        );
        assert!(
            t(25)
                .priority("py3", "none", "manylinux_2_25_x86_64")
                .is_some()
        );
    }
}
