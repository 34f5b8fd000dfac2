//! Reading versions from the tools themselves, and finding tools on PATH.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

/// Parse `nvcc --version`: `Cuda compilation tools, release 13.0, V13.0.88` ->
/// (`13.0`, `13.0.88`).
pub fn parse_nvcc_version(output: &str) -> Option<(String, String)> {
    let re = regex::Regex::new(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)").expect("valid regex");
    let caps = re.captures(output)?;
    Some((caps[1].to_string(), caps[2].to_string()))
}

pub(crate) fn nvcc_version(nvcc: &Path) -> Result<(String, String)> {
    let out = run_version(nvcc, "--version")?;
    parse_nvcc_version(&out).with_context(|| {
        format!(
            "`{} --version` printed no CUDA release:\n{out}",
            nvcc.display()
        )
    })
}

/// `cmake version 4.4.3` -> `4.4.3`.
pub(crate) fn cmake_version(cmake: &Path) -> Result<String> {
    let out = run_version(cmake, "--version")?;
    out.lines()
        .next()
        .and_then(|l| l.strip_prefix("cmake version "))
        .map(|v| v.trim().to_string())
        .with_context(|| {
            format!(
                "`{} --version` printed no cmake version:\n{out}",
                cmake.display()
            )
        })
}

/// What `ninja --version` prints (`1.13.2.git.kitware.jobserver-pipe-1`).
pub fn ninja_version(ninja: &Path) -> Result<String> {
    let out = run_version(ninja, "--version")?;
    let v = out.trim();
    if v.is_empty() {
        bail!("`{} --version` printed nothing", ninja.display());
    }
    Ok(v.to_string())
}

pub(crate) fn first_line_version(tool: &Path) -> Result<String> {
    let out = run_version(tool, "--version")?;
    Ok(out.lines().next().unwrap_or("").trim().to_string())
}

fn run_version(tool: &Path, flag: &str) -> Result<String> {
    let sh = Shell::new()?;
    let what = format!(
        "{} {flag}",
        tool.file_name().unwrap_or_default().to_string_lossy()
    );
    let out = commstack_exec::output(&what, &mut cmd!(sh, "{tool} {flag}").into())?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The first executable `name` in the `PATH` given (the caller's own PATH when None).
pub fn find_in_path(name: &str, path: Option<&OsStr>) -> Option<PathBuf> {
    let path = match path {
        Some(p) => p.to_os_string(),
        None => std::env::var_os("PATH")?,
    };
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

pub(crate) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The host C and C++ compilers nvcc and cmake will use, with their versions.
#[derive(Clone, Debug)]
pub struct HostCompilers {
    pub cc: PathBuf,
    pub cxx: PathBuf,
    pub cc_version: String,
    pub cxx_version: String,
}

/// `gcc` and `g++` from PATH (GNU is what NVSHMEM and nvcc support best).
pub fn host_compilers() -> Result<HostCompilers> {
    let cc = find_in_path("gcc", None)
        .context("no `gcc` on PATH: install gcc (Debian: build-essential)")?;
    let cxx = find_in_path("g++", None)
        .context("no `g++` on PATH: install g++ (Debian: build-essential)")?;
    Ok(HostCompilers {
        cc_version: first_line_version(&cc)?,
        cxx_version: first_line_version(&cxx)?,
        cc,
        cxx,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_nvcc_banner() {
        let banner = "nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\nBuilt on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0\n";
        assert_eq!(
            parse_nvcc_version(banner),
            Some(("13.0".into(), "13.0.88".into()))
        );
        assert_eq!(parse_nvcc_version("garbage"), None);
    }

    #[test]
    fn finds_sh_in_a_given_path() {
        assert_eq!(
            find_in_path("sh", Some(OsStr::new("/nonexistent:/bin"))),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(find_in_path("sh", Some(OsStr::new("/nonexistent"))), None);
    }
}
