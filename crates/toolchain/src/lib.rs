//! The build toolchain: nvcc (with the CUDA runtime, crt, nvvm and cccl), cmake, ninja and
//! the host C/C++ compilers.
//!
//! Two sources, recorded as such in every report:
//! - [`provision_wheels`]: the locked PyPI wheels (nvidia-cuda-nvcc, -runtime, -crt,
//!   nvidia-nvvm, nvidia-cuda-cccl, nvidia-nvtx, nvidia-nvml-dev, cmake, ninja)
//!   unpacked into one store step keyed by
//!   their sha256s, laid out as a CUDA toolkit (`targets/x86_64-linux/{include,lib}`),
//!   with a `libcuda.so` link stub made here (no wheel ships one). A fresh machine
//!   builds without a system CUDA.
//! - [`system`]: an installed CUDA (e.g. `/usr/local/cuda`) and cmake/ninja from PATH, for
//!   machines with no network (the GPU machine). Versions are read from the tools.

mod probe;
mod stub;
mod system;
mod wheels;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use probe::{HostCompilers, find_in_path, host_compilers, ninja_version, parse_nvcc_version};
pub use system::{SystemOptions, system};
pub use wheels::{
    Provisioned, REQUIRED_WHEELS, TOOLCHAIN_FILE, WheelInput, load_provisioned, provision_wheels,
    toolchain_key,
};

/// Where the toolchain came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolchainSource {
    /// Unpacked from these wheels (file name, sha256), in a store step.
    Wheels {
        wheels: Vec<WheelPin>,
        step: PathBuf,
    },
    /// Taken from this machine; nothing is pinned but the versions read from the tools.
    System,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WheelPin {
    pub filename: String,
    pub sha256: String,
}

/// Versions as the tools print them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolVersions {
    /// `13.0.88` (from `nvcc --version`: `V13.0.88`).
    pub nvcc: String,
    /// `13.0` (the `release` nvcc reports).
    pub cuda: String,
    pub cmake: String,
    pub ninja: String,
    /// First line of `cc --version`, e.g. `gcc (Debian 12.2.0-14+deb12u1) 12.2.0`.
    pub cc: String,
    pub cxx: String,
}

/// Everything a build needs to call the tools, with absolute paths.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Toolchain {
    pub source: ToolchainSource,
    /// The CUDA toolkit root (`CUDA_HOME`): `bin/nvcc`, `targets/x86_64-linux/...`.
    pub cuda_home: PathBuf,
    /// The real nvcc binary (never a symlink: nvcc finds `nvcc.profile` beside itself).
    pub nvcc: PathBuf,
    /// `targets/x86_64-linux/include` and its `cccl` subdirectory.
    pub cuda_include_dirs: Vec<PathBuf>,
    /// `targets/x86_64-linux/lib` (libcudart, libcudart_static, libcudadevrt).
    pub cudart_lib_dir: PathBuf,
    /// A directory holding `libcuda.so` for linking without a driver (the toolkit's
    /// `lib/stubs`, or the stub made at provisioning).
    pub cuda_stubs_dir: Option<PathBuf>,
    pub cmake: PathBuf,
    pub ninja: PathBuf,
    pub cc: PathBuf,
    pub cxx: PathBuf,
    pub versions: ToolVersions,
}

impl Toolchain {
    /// The CUDA major version (13 for 13.0.88): names the `cuXX` wheel families.
    pub fn cuda_major(&self) -> u32 {
        self.versions
            .cuda
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// What a build's step key records about the toolchain: where it came from (wheel
    /// hashes or "system"), the versions read from the tools, and the paths of a system
    /// toolchain. A wheel toolchain's paths are left out: they name the store, which
    /// differs between machines, and builds that embed them (NVSHMEM's CUDA_HOME) see the
    /// toolchain through [`Toolchain::relocated`] at a path of their own fixed directory.
    pub fn identity(&self) -> serde_json::Value {
        match &self.source {
            ToolchainSource::Wheels { wheels, .. } => serde_json::json!({
                "source": { "kind": "wheels", "wheels": wheels },
                "versions": self.versions,
                "cc": self.cc,
                "cxx": self.cxx,
            }),
            ToolchainSource::System => serde_json::json!({
                "source": { "kind": "system" },
                "versions": self.versions,
                "cuda_home": self.cuda_home,
                "cc": self.cc,
                "cxx": self.cxx,
            }),
        }
    }

    /// The same toolchain seen through a symlink `link` to its store step, for builds that
    /// record the tools' paths: with `link` at a fixed path, so are the recorded paths.
    /// A system toolchain is returned as it is (its paths are the same on every machine
    /// that has it, and in its identity).
    pub fn relocated(&self, link: &Path) -> std::io::Result<Toolchain> {
        let ToolchainSource::Wheels { step, .. } = &self.source else {
            return Ok(self.clone());
        };
        if std::fs::symlink_metadata(link).is_ok() {
            std::fs::remove_file(link)?;
        }
        std::os::unix::fs::symlink(step, link)?;
        let map = |p: &PathBuf| match p.strip_prefix(step) {
            Ok(rel) => link.join(rel),
            Err(_) => p.clone(),
        };
        Ok(Toolchain {
            source: self.source.clone(),
            cuda_home: map(&self.cuda_home),
            nvcc: map(&self.nvcc),
            cuda_include_dirs: self.cuda_include_dirs.iter().map(map).collect(),
            cudart_lib_dir: map(&self.cudart_lib_dir),
            cuda_stubs_dir: self.cuda_stubs_dir.as_ref().map(map),
            cmake: map(&self.cmake),
            ninja: map(&self.ninja),
            cc: map(&self.cc),
            cxx: map(&self.cxx),
            versions: self.versions.clone(),
        })
    }

    /// One line for reports: `wheels: nvcc 13.0.88, cmake 4.4.3, ninja 1.13.0, gcc ...`.
    pub fn describe(&self) -> String {
        let kind = match &self.source {
            ToolchainSource::Wheels { .. } => "PyPI wheels",
            ToolchainSource::System => "system",
        };
        format!(
            "{kind}: nvcc {} (CUDA {}) at {}, cmake {}, ninja {}, cc {}",
            self.versions.nvcc,
            self.versions.cuda,
            self.nvcc.display(),
            self.versions.cmake,
            self.versions.ninja,
            self.versions.cc
        )
    }

    /// The directories a hermetic PATH needs for these tools, in priority order.
    pub fn bin_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for tool in [&self.nvcc, &self.cmake, &self.ninja, &self.cc, &self.cxx] {
            if let Some(dir) = tool.parent().map(Path::to_path_buf)
                && !dirs.contains(&dir)
            {
                dirs.push(dir);
            }
        }
        dirs
    }
}
