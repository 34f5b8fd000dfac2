//! Symbol versions a library needs (.gnu.version_r): the newest GLIBC_x.y and
//! GLIBCXX_x.y.z decide which systems it loads on, and the glibc one its manylinux tag.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{ElfError, ElfFile};

/// A dotted numeric version, `2.17` or `3.4.21`, compared numerically part by part.
#[derive(Debug, Clone)]
pub struct DottedVersion(pub Vec<u32>);

impl PartialEq for DottedVersion {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for DottedVersion {}

impl Ord for DottedVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        // 2.17 == 2.17.0: pad with zeros before comparing.
        let n = self.0.len().max(other.0.len());
        let at = |v: &DottedVersion, i: usize| v.0.get(i).copied().unwrap_or(0);
        (0..n)
            .map(|i| at(self, i).cmp(&at(other, i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for DottedVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for DottedVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Result<Vec<u32>, _> = s.split('.').map(str::parse).collect();
        match parts {
            Ok(p) if !p.is_empty() => Ok(DottedVersion(p)),
            _ => Err(format!("`{s}` is not a dotted version like 2.17")),
        }
    }
}

impl fmt::Display for DottedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u32::to_string).collect();
        f.write_str(&parts.join("."))
    }
}

impl Serialize for DottedVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for DottedVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// One version needed from one library: `libc.so.6` needs `GLIBC_2.17`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NeededVersion {
    pub file: String,
    pub name: String,
}

impl ElfFile {
    /// Every (library, version) pair of .gnu.version_r; empty for a file without one.
    pub fn needed_versions(&self) -> Result<Vec<NeededVersion>, ElfError> {
        let elf = self.parse()?;
        let Some(verneed) = &elf.verneed else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for need in verneed.iter() {
            let file = elf
                .dynstrtab
                .get_at(need.vn_file)
                .unwrap_or("?")
                .to_string();
            for aux in need.iter() {
                let name = elf
                    .dynstrtab
                    .get_at(aux.vna_name)
                    .unwrap_or("?")
                    .to_string();
                out.push(NeededVersion {
                    file: file.clone(),
                    name,
                });
            }
        }
        Ok(out)
    }
}

/// The newest version named `<prefix><dotted>` among `needs` (`GLIBC_PRIVATE` and other
/// non-numeric names are ignored).
pub fn newest_version(needs: &[NeededVersion], prefix: &str) -> Option<DottedVersion> {
    needs
        .iter()
        .filter_map(|n| n.name.strip_prefix(prefix)?.parse::<DottedVersion>().ok())
        .max()
}

/// The newest `GLIBC_x.y` needed: the oldest glibc the library loads on.
pub fn newest_glibc(needs: &[NeededVersion]) -> Option<DottedVersion> {
    newest_version(needs, "GLIBC_")
}

/// The newest `GLIBCXX_x.y.z` needed: the oldest libstdc++ the library loads with.
pub fn newest_glibcxx(needs: &[NeededVersion]) -> Option<DottedVersion> {
    newest_version(needs, "GLIBCXX_")
}

/// A PEP 600 manylinux platform tag, `manylinux_2_17_x86_64`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManylinuxTag {
    pub glibc_major: u32,
    pub glibc_minor: u32,
    pub arch: String,
}

impl ManylinuxTag {
    /// The tag for a library needing at most `glibc` (e.g. from [`newest_glibc`]).
    /// A library needing no versioned glibc symbol at all gets the oldest tag, 2.5.
    pub fn for_glibc(glibc: Option<&DottedVersion>, arch: &str) -> ManylinuxTag {
        // manylinux1 (glibc 2.5) is the floor of every manylinux tag.
        let floor = DottedVersion(vec![2, 5]);
        let v = glibc.filter(|v| **v > floor).unwrap_or(&floor);
        ManylinuxTag {
            glibc_major: v.0.first().copied().unwrap_or(2),
            glibc_minor: v.0.get(1).copied().unwrap_or(0),
            arch: arch.to_string(),
        }
    }

    /// `manylinux_2_17_x86_64`
    pub fn pep600(&self) -> String {
        format!(
            "manylinux_{}_{}_{}",
            self.glibc_major, self.glibc_minor, self.arch
        )
    }

    /// The legacy alias PEP 600 keeps: `manylinux2014` = 2.17, `manylinux2010` = 2.12,
    /// `manylinux1` = 2.5 (x86_64 and i686; manylinux2014 also on the other arches).
    pub fn legacy_alias(&self) -> Option<String> {
        let name = match (self.glibc_major, self.glibc_minor) {
            (2, 17) => "manylinux2014",
            (2, 12) if matches!(self.arch.as_str(), "x86_64" | "i686") => "manylinux2010",
            (2, 5) if matches!(self.arch.as_str(), "x86_64" | "i686") => "manylinux1",
            _ => return None,
        };
        Some(format!("{name}_{}", self.arch))
    }

    /// The platform part of a wheel file name: the legacy alias first where one exists,
    /// as NVIDIA's and auditwheel's wheels spell it
    /// (`manylinux2014_x86_64.manylinux_2_17_x86_64`).
    pub fn wheel_platform_tag(&self) -> String {
        match self.legacy_alias() {
            Some(alias) => format!("{alias}.{}", self.pep600()),
            None => self.pep600(),
        }
    }

    /// [`Self::wheel_platform_tag`] as the separate tags a wheel builder takes.
    pub fn wheel_platform_tags(&self) -> Vec<String> {
        self.wheel_platform_tag()
            .split('.')
            .map(str::to_string)
            .collect()
    }

    /// Parses `manylinux_2_17_x86_64` or a legacy alias (`manylinux2014_x86_64`).
    pub fn parse(tag: &str) -> Option<ManylinuxTag> {
        let legacy = [
            ("manylinux2014_", (2, 17)),
            ("manylinux2010_", (2, 12)),
            ("manylinux1_", (2, 5)),
        ];
        for (prefix, (major, minor)) in legacy {
            if let Some(arch) = tag.strip_prefix(prefix) {
                return Some(ManylinuxTag {
                    glibc_major: major,
                    glibc_minor: minor,
                    arch: arch.into(),
                });
            }
        }
        let rest = tag.strip_prefix("manylinux_")?;
        let mut parts = rest.splitn(3, '_');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let arch = parts.next()?.to_string();
        Some(ManylinuxTag {
            glibc_major: major,
            glibc_minor: minor,
            arch,
        })
    }

    pub fn glibc(&self) -> DottedVersion {
        DottedVersion(vec![self.glibc_major, self.glibc_minor])
    }
}

/// The manylinux tag for the newest glibc version in `needs`: a function of the library's
/// own symbol versions, never of the machine that built it.
pub fn manylinux_tag(needs: &[NeededVersion], arch: &str) -> ManylinuxTag {
    ManylinuxTag::for_glibc(newest_glibc(needs).as_ref(), arch)
}
