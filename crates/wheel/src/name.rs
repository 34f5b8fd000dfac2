//! Wheel file names, distribution names and versions: the one wheel-filename parser
//! (the index client reads project pages with it, the toolchain and the writer too).

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use pep440_rs::Version;

/// PEP 503 normalised name: lowercase, runs of `-`, `_`, `.` become one `-`.
/// This is how indexes and installers compare names (`nvidia-nvshmem-cu13`).
pub fn normalize_name(name: &str) -> String {
    collapse_separators(name, '-')
}

/// The escaped form used in wheel file names and `.dist-info` directories:
/// runs of `-`, `_`, `.` become one `_`, lowercase (`nvidia_nvshmem_cu13`).
pub fn escape_name(name: &str) -> String {
    collapse_separators(name, '_')
}

fn collapse_separators(name: &str, sep: char) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push(sep);
            }
            in_run = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_run = false;
        }
    }
    out
}

/// A valid distribution name (PEP 508): ASCII letters and digits, with `-`, `_`, `.`
/// inside but not at either end.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !ok {
        bail!("{name:?} is not a valid Python distribution name (letters, digits, and -_. inside)");
    }
    Ok(())
}

/// Parse a PEP 440 version; its `Display` is the normalised form.
pub fn parse_version(version: &str) -> Result<Version> {
    Version::from_str(version)
        .with_context(|| format!("{version:?} is not a valid PEP 440 version"))
}

/// The version as written in a wheel file name: normalised, `-` escaped to `_`.
pub fn escape_version(version: &Version) -> String {
    version.to_string().replace('-', "_")
}

/// One compatibility tag: `py3-none-manylinux_2_28_x86_64`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag {
    pub python: String,
    pub abi: String,
    pub platform: String,
}

impl Tag {
    pub fn new(python: &str, abi: &str, platform: &str) -> Tag {
        Tag {
            python: python.into(),
            abi: abi.into(),
            platform: platform.into(),
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.python, self.abi, self.platform)
    }
}

/// `{name}-{version}(-{build})?-{python}-{abi}-{platform}.whl`, each tag part possibly
/// a `.`-separated compressed set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WheelFilename {
    /// As written in the file name (escaped).
    pub name: String,
    pub version: Version,
    pub build: Option<String>,
    pub python: Vec<String>,
    pub abi: Vec<String>,
    pub platform: Vec<String>,
}

impl WheelFilename {
    pub fn parse(filename: &str) -> Result<WheelFilename> {
        let stem = filename
            .strip_suffix(".whl")
            .with_context(|| format!("{filename:?} is not a wheel file name (no .whl suffix)"))?;
        let parts: Vec<&str> = stem.split('-').collect();
        let (name, version, build, tags) = match parts.as_slice() {
            [n, v, p, a, pl] => (*n, *v, None, [*p, *a, *pl]),
            [n, v, b, p, a, pl] => (*n, *v, Some(*b), [*p, *a, *pl]),
            _ => bail!(
                "{filename:?} is not a wheel file name: expected name-version[-build]-python-abi-platform.whl"
            ),
        };
        validate_name(name).with_context(|| format!("in wheel file name {filename:?}"))?;
        let version =
            parse_version(version).with_context(|| format!("in wheel file name {filename:?}"))?;
        if let Some(b) = build
            && !b.starts_with(|c: char| c.is_ascii_digit())
        {
            bail!("{filename:?}: the build tag {b:?} must start with a digit");
        }
        let split = |s: &str| s.split('.').map(str::to_string).collect::<Vec<_>>();
        Ok(WheelFilename {
            name: name.to_string(),
            version,
            build: build.map(str::to_string),
            python: split(tags[0]),
            abi: split(tags[1]),
            platform: split(tags[2]),
        })
    }

    /// The PEP 503 normalised distribution name (`nvidia-nccl-cu13`), as indexes compare it.
    pub fn normalized_name(&self) -> String {
        normalize_name(&self.name)
    }

    /// Every tag this file claims (the product of its compressed tag sets).
    pub fn tags(&self) -> Vec<Tag> {
        let mut out = Vec::new();
        for p in &self.python {
            for a in &self.abi {
                for pl in &self.platform {
                    out.push(Tag::new(p, a, pl));
                }
            }
        }
        out
    }

    /// `{escaped name}-{escaped version}.dist-info`
    pub fn dist_info_dir(&self) -> String {
        format!(
            "{}-{}.dist-info",
            escape_name(&self.name),
            escape_version(&self.version)
        )
    }

    /// `{escaped name}-{escaped version}.data`
    pub fn data_dir(&self) -> String {
        format!(
            "{}-{}.data",
            escape_name(&self.name),
            escape_version(&self.version)
        )
    }
}

impl fmt::Display for WheelFilename {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}",
            escape_name(&self.name),
            escape_version(&self.version)
        )?;
        if let Some(b) = &self.build {
            write!(f, "-{b}")?;
        }
        write!(
            f,
            "-{}-{}-{}.whl",
            self.python.join("."),
            self.abi.join("."),
            self.platform.join(".")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise_and_escape() {
        assert_eq!(
            normalize_name("Nvidia_NVSHMEM.-cu13"),
            "nvidia-nvshmem-cu13"
        );
        assert_eq!(escape_name("nvidia-nvshmem-cu13"), "nvidia_nvshmem_cu13");
        assert!(validate_name("-bad").is_err());
        assert!(validate_name("good.name_1").is_ok());
    }

    #[test]
    fn local_versions_normalise() {
        let v = parse_version("3.4.5+Commstack-G1A2B3C").unwrap();
        assert_eq!(v.to_string(), "3.4.5+commstack.g1a2b3c");
        // The reason local labels start with a letter: numeric segments lose zeros.
        assert_eq!(
            parse_version("1.0+x.0123").unwrap().to_string(),
            "1.0+x.123"
        );
    }

    #[test]
    fn filenames_round_trip() {
        let f = "nvidia_nvshmem_cu13-3.4.5-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
        let w = WheelFilename::parse(f).unwrap();
        assert_eq!(w.to_string(), f);
        assert_eq!(w.tags().len(), 2);
        assert_eq!(w.dist_info_dir(), "nvidia_nvshmem_cu13-3.4.5.dist-info");
        let b = WheelFilename::parse("pkg-1.0-1abc-py3-none-any.whl").unwrap();
        assert_eq!(b.build.as_deref(), Some("1abc"));
        assert!(WheelFilename::parse("pkg-1.0-py3-none.whl").is_err());
        assert!(WheelFilename::parse("pkg-1.0-x-py3-none-any.whl").is_err());
    }

    #[test]
    fn compressed_tag_sets_and_builds_parse() {
        let w = WheelFilename::parse(
            "nvidia_nccl_cu13-2.28.9-py3-none-manylinux_2_18_x86_64.manylinux2014_x86_64.whl",
        )
        .unwrap();
        assert_eq!(w.normalized_name(), "nvidia-nccl-cu13");
        assert_eq!(w.version.to_string(), "2.28.9");
        assert_eq!(
            w.platform,
            ["manylinux_2_18_x86_64", "manylinux2014_x86_64"]
        );
        let b = WheelFilename::parse("pkg-1.0-1b-cp312-cp312-manylinux_2_28_x86_64.whl").unwrap();
        assert_eq!(b.build.as_deref(), Some("1b"));
        assert!(WheelFilename::parse("pkg-1.0.tar.gz").is_err());
        assert!(WheelFilename::parse("pkg-1.0-py3.whl").is_err());
        let universal = WheelFilename::parse("six-1.16.0-py2.py3-none-any.whl").unwrap();
        assert_eq!(
            universal.tags(),
            [
                Tag::new("py2", "none", "any"),
                Tag::new("py3", "none", "any")
            ]
        );
    }
}
