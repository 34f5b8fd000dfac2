//! The toolchain of a machine that has CUDA installed (no network needed).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::probe::{
    cmake_version, find_in_path, host_compilers, is_executable, ninja_version, nvcc_version,
};
use crate::{ToolVersions, Toolchain, ToolchainSource};

#[derive(Clone, Debug)]
pub struct SystemOptions {
    /// The CUDA toolkit root; `/usr/local/cuda` by default.
    pub cuda_home: PathBuf,
    /// cmake and ninja; from PATH when None.
    pub cmake: Option<PathBuf>,
    pub ninja: Option<PathBuf>,
}

impl Default for SystemOptions {
    fn default() -> Self {
        SystemOptions {
            cuda_home: PathBuf::from("/usr/local/cuda"),
            cmake: None,
            ninja: None,
        }
    }
}

/// Describe the installed toolchain; fails naming the missing tool.
pub fn system(opts: &SystemOptions) -> Result<Toolchain> {
    let cuda_home = opts.cuda_home.canonicalize().with_context(|| {
        format!(
            "no CUDA toolkit at {} (pass --cuda-home DIR)",
            opts.cuda_home.display()
        )
    })?;
    let nvcc = cuda_home
        .join("bin/nvcc")
        .canonicalize()
        .with_context(|| format!("no nvcc in {}/bin", cuda_home.display()))?;
    if !is_executable(&nvcc) {
        bail!("{} is not executable", nvcc.display());
    }
    let target = cuda_home.join("targets/x86_64-linux");
    let (include, lib) = if target.is_dir() {
        (target.join("include"), target.join("lib"))
    } else {
        (cuda_home.join("include"), cuda_home.join("lib64"))
    };
    if !include.join("cuda_runtime.h").is_file() {
        bail!(
            "{} has no cuda_runtime.h: is {} a complete CUDA toolkit?",
            include.display(),
            cuda_home.display()
        );
    }
    let mut cuda_include_dirs = vec![include.clone()];
    if include.join("cccl").is_dir() {
        cuda_include_dirs.push(include.join("cccl"));
    }
    let stubs = lib.join("stubs");
    let cuda_stubs_dir = stubs.join("libcuda.so").is_file().then_some(stubs);

    let cmake = match &opts.cmake {
        Some(p) => p.clone(),
        None => find_in_path("cmake", None)
            .context("no `cmake` on PATH (pass --cmake PATH, or use the wheel toolchain)")?,
    };
    let ninja = match &opts.ninja {
        Some(p) => p.clone(),
        None => find_in_path("ninja", None)
            .context("no `ninja` on PATH (pass --ninja PATH, or use the wheel toolchain)")?,
    };
    let host = host_compilers()?;
    let (cuda, nvcc_v) = nvcc_version(&nvcc)?;
    let versions = ToolVersions {
        nvcc: nvcc_v,
        cuda,
        cmake: cmake_version(&cmake)?,
        ninja: ninja_version(&ninja)?,
        cc: host.cc_version,
        cxx: host.cxx_version,
    };
    Ok(Toolchain {
        source: ToolchainSource::System,
        cuda_home,
        nvcc,
        cuda_include_dirs,
        cudart_lib_dir: lib,
        cuda_stubs_dir,
        cmake,
        ninja,
        cc: host.cc,
        cxx: host.cxx,
        versions,
    })
}
