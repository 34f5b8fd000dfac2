//! The environment NVSHMEM's build runs in: empty, then an explicit allowlist.
//!
//! NVSHMEM's CMake takes the default of every option from the environment variable of the
//! same name (cmake_config/NVSHMEMEnv.cmake) and reads a few more (`CUDA_HOME`,
//! `NVSHMEM_DEVICELIB_CUDA_HOME`, `CMAKE_CCACHE_FLAGS`, `*_HOME`, ...); compilers read
//! `CC`, `CFLAGS`, `CPATH`, `LIBRARY_PATH`; CMake reads `CMAKE_*` and `~/.cmake/packages`.
//! Starting from nothing removes them all; the names below document what must never be
//! let through.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

pub use commstack_stack::pass_env::{READ_BY_NVSHMEM_CMAKE, refusal as passthrough_refusal};

/// Resolve passthrough names against the caller's environment. Each name must be set,
/// and allowed.
pub fn resolve_passthrough(names: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for name in names {
        if let Some(why) = passthrough_refusal(name) {
            bail!("cannot pass {name} through to the NVSHMEM build: {why}");
        }
        match std::env::var(name) {
            Ok(value) => {
                out.insert(name.clone(), value);
            }
            Err(_) => bail!(
                "{name} is asked to pass through to the NVSHMEM build, but it is not set here"
            ),
        }
    }
    Ok(out)
}

/// The whole environment of a build command: the allowlist, then what the recipe sets
/// (`recipe`), then the user's passthrough.
pub fn hermetic_env(
    tool_dirs: &[PathBuf],
    home: &Path,
    tmp: &Path,
    ceiling: &Path,
    recipe: &BTreeMap<String, String>,
    passthrough: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut path: Vec<String> = tool_dirs.iter().map(|d| d.display().to_string()).collect();
    // sh, coreutils, as/ld and git for NVSHMEM's custom commands.
    for d in ["/usr/bin", "/bin"] {
        if !path.iter().any(|p| p == d) {
            path.push(d.to_string());
        }
    }
    let mut env = BTreeMap::new();
    env.insert("PATH".into(), path.join(":"));
    env.insert("HOME".into(), home.display().to_string());
    env.insert("TMPDIR".into(), tmp.display().to_string());
    env.insert("LANG".into(), "C.UTF-8".into());
    env.insert("LC_ALL".into(), "C.UTF-8".into());
    env.insert("TZ".into(), "UTC".into());
    env.insert("SOURCE_DATE_EPOCH".into(), "0".into());
    // NVSHMEM's git_commit target runs `git rev-parse HEAD` in the source directory; never
    // let it find a repository around the build directory.
    env.insert(
        "GIT_CEILING_DIRECTORIES".into(),
        ceiling.display().to_string(),
    );
    for (k, v) in recipe.iter().chain(passthrough) {
        env.insert(k.clone(), v.clone());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_tool_variables_cannot_pass_through() {
        for name in [
            "NVSHMEM_USE_NCCL",
            "NVSHMEM_IBGDA_SUPPORT",
            "NCCL_HOME",
            "NCCL_DEBUG",
            "CUDA_HOME",
            "CMAKE_PREFIX_PATH",
            "CFLAGS",
            "PATH",
        ] {
            assert!(passthrough_refusal(name).is_some(), "{name}");
        }
        for name in ["NVSHMEM_DISABLE_NVLS", "NVSHMEM_BOOTSTRAP", "SSL_CERT_FILE"] {
            assert!(passthrough_refusal(name).is_none(), "{name}");
        }
    }

    #[test]
    fn env_is_only_the_allowlist() {
        let mut pass = BTreeMap::new();
        pass.insert("NVSHMEM_DISABLE_NVLS".to_string(), "1".to_string());
        let env = hermetic_env(
            &[PathBuf::from("/t/bin")],
            Path::new("/w/home"),
            Path::new("/w/tmp"),
            Path::new("/w"),
            &BTreeMap::new(),
            &pass,
        );
        assert_eq!(env["PATH"], "/t/bin:/usr/bin:/bin");
        assert_eq!(env["NVSHMEM_DISABLE_NVLS"], "1");
        assert!(
            env.keys()
                .all(|k| !k.starts_with("NCCL_") && k != "NVSHMEM_USE_NCCL")
        );
        assert_eq!(env.len(), 9);
    }
}
