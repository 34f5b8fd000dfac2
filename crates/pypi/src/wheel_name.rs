//! Wheel filenames (`{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`, where each
//! tag may be a `.`-separated set).

use std::str::FromStr;

use pep440_rs::Version;
use pep508_rs::PackageName;

use crate::tags::TargetTags;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WheelName {
    pub name: PackageName,
    pub version: Version,
    pub build: Option<String>,
    pub python: Vec<String>,
    pub abi: Vec<String>,
    pub platform: Vec<String>,
}

impl WheelName {
    pub fn parse(filename: &str) -> Result<WheelName, String> {
        let stem = filename
            .strip_suffix(".whl")
            .ok_or_else(|| format!("{filename:?} is not a wheel filename (no .whl)"))?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (name, version, build, py, abi, plat) = match parts.as_slice() {
            [n, v, py, abi, plat] => (n, v, None, py, abi, plat),
            [n, v, b, py, abi, plat] => (n, v, Some(b.to_string()), py, abi, plat),
            _ => {
                return Err(format!(
                    "{filename:?} is not a wheel filename: expected 5 or 6 '-'-separated parts"
                ));
            }
        };
        let name =
            PackageName::from_str(name).map_err(|e| format!("{filename:?}: bad name: {e}"))?;
        let version =
            Version::from_str(version).map_err(|e| format!("{filename:?}: bad version: {e}"))?;
        let split = |s: &str| s.split('.').map(str::to_string).collect::<Vec<_>>();
        Ok(WheelName {
            name,
            version,
            build,
            python: split(py),
            abi: split(abi),
            platform: split(plat),
        })
    }

    /// The best priority of any tag triple this wheel carries, None if the target can't use it.
    pub fn priority(&self, tags: &TargetTags) -> Option<usize> {
        let mut best = None;
        for py in &self.python {
            for abi in &self.abi {
                for plat in &self.platform {
                    if let Some(p) = tags.priority(py, abi, plat) {
                        best = Some(best.map_or(p, |b: usize| b.min(p)));
                    }
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tags::TargetPlatform;

    #[test]
    fn parses_compound_tags_and_builds() {
        let w = WheelName::parse(
            "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.manylinux2014_x86_64.whl",
        )
        .unwrap();
        assert_eq!(w.name.as_ref(), "nvidia-nccl-cu13");
        assert_eq!(w.version.to_string(), "2.28.9");
        assert_eq!(
            w.platform,
            ["manylinux_2_18_x86_64", "manylinux2014_x86_64"]
        );
        let b = WheelName::parse("pkg-1.0-1b-cp312-cp312-manylinux_2_28_x86_64.whl").unwrap();
        assert_eq!(b.build.as_deref(), Some("1b"));
        assert!(WheelName::parse("pkg-1.0.tar.gz").is_err());
        assert!(WheelName::parse("pkg-1.0-py3.whl").is_err());
        let tags = TargetTags::new(&TargetPlatform {
            python: (3, 12),
            arch: "x86_64".into(),
            glibc: (2, 17),
        });
        assert!(
            w.priority(&tags).is_some(),
            "manylinux2014 alias is accepted at glibc 2.17"
        );
        let universal = WheelName::parse("six-1.16.0-py2.py3-none-any.whl").unwrap();
        assert!(universal.priority(&tags).is_some());
    }
}
