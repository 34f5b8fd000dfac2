//! What the environment must hold. Filled from arguments today; the lead's stack lock
//! fills the same struct later (one place that says what "right" means).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

use commstack_elf::{DottedVersion, NvshmemVersion};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Expectations {
    /// The one NCCL the stack holds: the lock's (torch's pin, 2.28.9 for torch 2.11, or
    /// stack.toml's `[nccl] version` override). Checked statically against the version
    /// string of the one libnccl.so* in the environment (`static.nccl.one`) and at run time
    /// against `ncclGetVersion` of the mapped library. `None`: reported, not checked.
    pub nccl_version: Option<NcclVersion>,
    /// The NVSHMEM the stack builds; checked against the library's vendor string.
    pub nvshmem_version: Option<NvshmemVersion>,
    /// The directory our libnvshmem_host must be inside (the install prefix, or the
    /// drop-in wheel's `nvidia/nvshmem` in site-packages). `None`: not checked.
    pub nvshmem_prefix: Option<PathBuf>,
    /// NVSHMEM build options besides `NVSHMEM_USE_NCCL=OFF` (always required), e.g.
    /// `NVSHMEM_IBGDA_SUPPORT=ON`.
    pub nvshmem_build_vars: BTreeMap<String, String>,
    /// The SASS architectures libnvshmem_device must hold (`90`); `None`: reported only.
    pub cuda_archs: Option<BTreeSet<u32>>,
    /// Sonames the stack ships; each must exist exactly once in the environment.
    pub shipped_sonames: Vec<String>,
    /// Sonames the host provides (the driver's libcuda.so.1): never "unresolved".
    pub host_provided_sonames: Vec<String>,
    /// The target system's library directories, searched after a library's own RUNPATH.
    pub system_lib_dirs: Vec<PathBuf>,
    /// The target's glibc (Debian bookworm: 2.36): no library may need a newer one.
    pub target_glibc: Option<DottedVersion>,
    /// The target's libstdc++ symbol version (GLIBCXX_3.4.30 for gcc 12).
    pub target_glibcxx: Option<DottedVersion>,
    /// The modules the runtime level imports, in order.
    pub import_modules: Vec<String>,
}

impl Expectations {
    /// Defaults that hold for every stack: torch then deep_ep imported, the driver's
    /// libraries host-provided, the usual x86_64 library directories, the stack's
    /// NVSHMEM and NCCL sonames shipped once.
    pub fn new() -> Expectations {
        Expectations {
            shipped_sonames: vec!["libnvshmem_host.so.3".into(), "libnccl.so.2".into()],
            host_provided_sonames: [
                "libcuda.so.1",
                "libnvidia-ml.so.1",
                "libnvidia-ptxjitcompiler.so.1",
            ]
            .map(String::from)
            .to_vec(),
            system_lib_dirs: [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib",
            ]
            .map(PathBuf::from)
            .to_vec(),
            import_modules: vec!["torch".into(), "deep_ep".into()],
            ..Expectations::default()
        }
    }
}

/// An NCCL release, `2.28.9`, and its `ncclGetVersion` code (22809).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct NcclVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl NcclVersion {
    /// NCCL_VERSION_CODE as nccl.h computes it: `major*10000 + minor*100 + patch` since
    /// 2.9, `major*1000 + minor*100 + patch` before.
    pub fn code(&self) -> i64 {
        let (ma, mi, pa) = (self.major as i64, self.minor as i64, self.patch as i64);
        if ma > 2 || (ma == 2 && mi >= 9) {
            ma * 10000 + mi * 100 + pa
        } else {
            ma * 1000 + mi * 100 + pa
        }
    }

    /// The inverse of [`NcclVersion::code`].
    pub fn from_code(code: i64) -> Option<NcclVersion> {
        if code <= 0 {
            return None;
        }
        let code = code as u32;
        let v = if code >= 20900 {
            NcclVersion {
                major: code / 10000,
                minor: code % 10000 / 100,
                patch: code % 100,
            }
        } else {
            NcclVersion {
                major: code / 1000,
                minor: code % 1000 / 100,
                patch: code % 100,
            }
        };
        Some(v)
    }
}

impl fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for NcclVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not an NCCL version like 2.28.9");
        let parts: Vec<u32> = s
            .split('.')
            .map(|p| p.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match parts[..] {
            [major, minor, patch] => Ok(NcclVersion {
                major,
                minor,
                patch,
            }),
            _ => Err(bad()),
        }
    }
}
