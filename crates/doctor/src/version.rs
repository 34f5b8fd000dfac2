//! NVIDIA driver and CUDA versions, and which driver a CUDA major needs.

use std::fmt;
use std::str::FromStr;

use anyhow::{Context, Result, bail};

/// A driver version such as `580.159.03`, compared numerically part by part, shown as written.
#[derive(Debug, Clone)]
pub struct DriverVersion {
    parts: Vec<u32>,
    text: String,
}

impl DriverVersion {
    pub fn major(&self) -> u32 {
        self.parts[0]
    }
}

impl PartialEq for DriverVersion {
    fn eq(&self, other: &Self) -> bool {
        self.parts == other.parts
    }
}

impl Eq for DriverVersion {}

impl PartialOrd for DriverVersion {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DriverVersion {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts.cmp(&other.parts)
    }
}

impl FromStr for DriverVersion {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<DriverVersion> {
        let parts: Vec<u32> = s
            .trim()
            .split('.')
            .map(|p| p.parse::<u32>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("not a driver version: {s:?} (expected e.g. 580.159.03)"))?;
        if parts.len() < 2 {
            bail!("not a driver version: {s:?} (expected e.g. 580.159.03)");
        }
        Ok(DriverVersion {
            parts,
            text: s.trim().to_string(),
        })
    }
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A CUDA version such as `13.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub const DEFAULT_STACK: CudaVersion = CudaVersion {
        major: 13,
        minor: 0,
    };
}

impl FromStr for CudaVersion {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<CudaVersion> {
        let mut parts = s.trim().split('.');
        let major = parts.next().and_then(|p| p.parse().ok());
        let minor = parts.next().map_or(Some(0), |p| p.parse().ok());
        match (major, minor, parts.next()) {
            (Some(major), Some(minor), None) => Ok(CudaVersion { major, minor }),
            _ => bail!("not a CUDA version: {s:?} (expected e.g. 13.0)"),
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The oldest driver branch that runs any CUDA `major`.x toolkit (minor version compatibility,
/// https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
/// 11.x >= 450, 12.x >= 525, 13.x >= 580. `None` for a major this table does not know yet.
pub fn minimum_driver_major(cuda: CudaVersion) -> Option<u32> {
    match cuda.major {
        11 => Some(450),
        12 => Some(525),
        13 => Some(580),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_versions_compare_numerically() {
        let a: DriverVersion = "580.159.03".parse().unwrap();
        let b: DriverVersion = "580.65.06".parse().unwrap();
        assert!(a > b);
        assert_eq!(a.to_string(), "580.159.03");
        assert_eq!(a, "580.159.3".parse().unwrap());
        assert_eq!(a.major(), 580);
        assert!("580".parse::<DriverVersion>().is_err());
        assert!("N/A".parse::<DriverVersion>().is_err());
    }

    #[test]
    fn cuda_versions() {
        assert_eq!(
            "13.0".parse::<CudaVersion>().unwrap(),
            CudaVersion {
                major: 13,
                minor: 0
            }
        );
        assert_eq!(
            "12".parse::<CudaVersion>().unwrap(),
            CudaVersion {
                major: 12,
                minor: 0
            }
        );
        assert!("13.0.2".parse::<CudaVersion>().is_err());
        assert_eq!(minimum_driver_major(CudaVersion::DEFAULT_STACK), Some(580));
        assert_eq!(minimum_driver_major("14.0".parse().unwrap()), None);
    }
}
