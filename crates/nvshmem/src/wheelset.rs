//! The default build: only what NVIDIA's wheel ships.
//!
//! NVSHMEM's `all` also builds the static `libnvshmem.a`, which compiles every host and
//! device source a second time, and `nvshmem-info`, which links it; its install rule
//! requires both. NVIDIA's wheel ships neither (nor `bin/`, `share/` or the CMake
//! package, whose targets file names them). So unless the stack asks for the static
//! library, the recipe builds every output of `all` except those two, and installs the
//! wheel's set itself: the build tree's `lib/` and `include/` (as NVSHMEM's own
//! `install(DIRECTORY ...)` rules copy them; the libraries are built with their install
//! RUNPATH already, `$ORIGIN`) plus the license, changelog and version files.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::source::copy_tree;

/// The CMake file given as `CMAKE_PROJECT_INCLUDE` in the default build: lets nvshmem_host's
/// objects compile while the device library builds (see the file for why that is safe).
pub const SCHEDULE_HOOK: &str = include_str!("../cmake/schedule.cmake");
const DROPPED_MARK: &str = "commstack-schedule: dropped ";

/// The target dependencies the hook dropped, as logged by CMake's configure step.
pub fn dropped_dependencies(configure_log: &str) -> Vec<String> {
    configure_log
        .lines()
        .filter_map(|l| {
            l.split_once(DROPPED_MARK)
                .map(|(_, d)| d.trim().to_string())
        })
        .collect()
}

/// Outputs of `all` left out, by file name: what only the static library needs.
pub const LEFT_OUT: [&str; 2] = ["libnvshmem.a", "nvshmem-info"];
/// Files of the source root that NVSHMEM installs at the top of the prefix.
const TOP_FILES: [&str; 4] = ["License.txt", "changelog", "version.txt", "git_commit.txt"];

/// What ninja is asked to build, found in the configured build tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// Ninja targets (paths relative to the build directory).
    pub targets: Vec<String>,
    /// Outputs of `all` that were left out.
    pub left_out: Vec<String>,
    /// Where the built libraries land (the directory of `libnvshmem_host.so`).
    pub lib_dir: String,
    /// Target dependencies the schedule hook dropped ("nvshmem_host -> ...").
    #[serde(default)]
    pub dropped_dependencies: Vec<String>,
    /// sha256 of the schedule hook given to CMake (its path in the defines is gone with
    /// the build tree).
    #[serde(default)]
    pub schedule_hook_sha256: Option<String>,
}

/// Parse `ninja -t query TARGET`: the explicit, implicit and order-only inputs.
pub fn query_inputs(text: &str) -> Vec<String> {
    let mut inputs = Vec::new();
    let mut in_inputs = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("input:") {
            in_inputs = true;
        } else if t.starts_with("outputs:") || t.starts_with("validations:") {
            in_inputs = false;
        } else if in_inputs && !t.is_empty() {
            let t = t.trim_start_matches("||").trim_start_matches('|').trim();
            inputs.push(t.to_string());
        }
    }
    inputs
}

/// Expand `all` through the per-directory `<dir>/all` phonies CMake writes, with `query`
/// answering `ninja -t query`, and split the result into what to build and what to leave
/// out.
pub fn select(mut query: impl FnMut(&str) -> Result<String>) -> Result<Selection> {
    let mut pending = vec!["all".to_string()];
    let (mut targets, mut left_out) = (Vec::new(), Vec::new());
    while let Some(t) = pending.pop() {
        for input in query_inputs(&query(&t)?) {
            if input == "all" || input.ends_with("/all") {
                pending.push(input);
            } else if LEFT_OUT.iter().any(|name| file_name(&input) == *name) {
                left_out.push(input);
            } else {
                targets.push(input);
            }
        }
    }
    // A target reached through two phonies is listed once.
    targets.sort();
    targets.dedup();
    left_out.sort();
    left_out.dedup();
    let Some(host) = targets
        .iter()
        .find(|t| file_name(t) == "libnvshmem_host.so")
    else {
        bail!(
            "the NVSHMEM build tree has no libnvshmem_host.so among the outputs of `all` \
             (targets: {}); this source does not build like NVSHMEM 3.x: set nvshmem.static-lib = true \
             in stack.toml to build and install it with its own rules",
            targets.join(", ")
        );
    };
    if left_out.is_empty() {
        bail!(
            "none of {} is an output of `all` in this NVSHMEM build tree, so the recipe cannot tell what \
             only the static library needs; set nvshmem.static-lib = true in stack.toml",
            LEFT_OUT.join(", ")
        );
    }
    let lib_dir = Path::new(host)
        .parent()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    if lib_dir.is_empty() {
        bail!(
            "libnvshmem_host.so is built at the top of the build tree, not in a lib/ directory next to              include/ as in NVSHMEM 3.x; set nvshmem.static-lib = true in stack.toml to install with              NVSHMEM's own rules"
        );
    }
    Ok(Selection {
        targets,
        left_out,
        lib_dir,
        dropped_dependencies: Vec::new(),
        schedule_hook_sha256: None,
    })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Install the wheel's set from `build` (configured and built) into `prefix`: `lib/`,
/// `include/` (without entries named `modules`, as NVSHMEM's `PATTERN "modules" EXCLUDE`),
/// and the top files of `src`, with the modes NVSHMEM's install gives them: 0755 in
/// `lib/` (its FILE_PERMISSIONS), 0644 elsewhere (not the build tree's umask).
pub fn install(build: &Path, src: &Path, sel: &Selection, prefix: &Path) -> Result<()> {
    let lib = build.join(&sel.lib_dir);
    let include = lib
        .parent()
        .map(|p| p.join("include"))
        .context("the library directory has no parent")?;
    if !include.is_dir() {
        bail!(
            "no include directory next to the built libraries ({}): NVSHMEM's CMake generates it at \
             configure time; see logs/configure.log",
            include.display()
        );
    }
    fs::create_dir_all(prefix).with_context(|| format!("cannot create {}", prefix.display()))?;
    copy_tree(&lib, &prefix.join("lib"))?;
    copy_tree(&include, &prefix.join("include"))?;
    let modules: Vec<PathBuf> = walkdir::WalkDir::new(prefix.join("include"))
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() == "modules")
        .map(|e| e.into_path())
        .collect();
    for m in modules {
        let removed = if m.is_dir() && !m.is_symlink() {
            fs::remove_dir_all(&m)
        } else {
            fs::remove_file(&m)
        };
        removed.with_context(|| format!("cannot remove {}", m.display()))?;
    }
    for name in TOP_FILES {
        let (from, to) = (src.join(name), prefix.join(name));
        if !from.is_file() {
            bail!(
                "{} is missing: NVSHMEM's install requires it (version.txt is written by its git_commit \
                 target); see logs/build.log",
                from.display()
            );
        }
        fs::copy(&from, &to)
            .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    }
    set_modes(prefix)
}

/// Fixed modes for everything installed: 0755 for directories, libraries and programs,
/// 0644 for the rest, so that the build's umask does not reach the output.
pub(crate) fn set_modes(prefix: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let lib = prefix.join("lib");
    for entry in walkdir::WalkDir::new(prefix) {
        let entry = entry.with_context(|| format!("cannot walk {}", prefix.display()))?;
        let mode = if entry.file_type().is_dir() {
            0o755
        } else if !entry.file_type().is_file() {
            continue; // links have no mode of their own
        } else if entry.path().starts_with(&lib) {
            0o755
        } else {
            let old = entry.metadata()?.permissions().mode();
            if old & 0o111 != 0 { 0o755 } else { 0o644 }
        };
        fs::set_permissions(entry.path(), fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", entry.path().display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &str =
        "all:\n  input: phony\n    src/all\n  outputs:\n    CMakeFiles/install.util\n";
    const SRC_ALL: &str = "src/all:\n  input: phony\n    src/other/all\n    src/lib/libnvshmem_host.so\n    src/lib/libnvshmem.a\n    \
                           src/lib/nvshmem_transport_ibgda.so\n    src/bin/nvshmem-info\n    | src/device/all\n    \
                           || src/git_commit\n  outputs:\n    all\n";
    const DEV_ALL: &str = "src/device/all:\n  input: phony\n    src/nvshmem_device_project\n  outputs:\n    src/all\n";

    #[test]
    fn all_is_expanded_and_the_static_library_left_out() {
        let sel = select(|t| {
            Ok(match t {
                "all" => ALL,
                "src/all" => SRC_ALL,
                "src/device/all" => DEV_ALL,
                "src/other/all" => {
                    "src/other/all:\n  input: phony\n    src/lib/libnvshmem_host.so\n"
                }
                other => panic!("queried {other}"),
            }
            .to_string())
        })
        .unwrap();
        assert_eq!(
            sel.targets,
            [
                "src/git_commit",
                "src/lib/libnvshmem_host.so",
                "src/lib/nvshmem_transport_ibgda.so",
                "src/nvshmem_device_project"
            ]
        );
        assert_eq!(
            sel.left_out,
            ["src/bin/nvshmem-info", "src/lib/libnvshmem.a"]
        );
        assert_eq!(sel.lib_dir, "src/lib");
    }

    #[test]
    fn dropped_dependencies_are_read_from_the_configure_log() {
        let log = "-- NVSHMEM_PREFIX: x\n-- commstack-schedule: dropped nvshmem_host -> nvshmem_device_project-build\n";
        assert_eq!(
            dropped_dependencies(log),
            ["nvshmem_host -> nvshmem_device_project-build"]
        );
        assert!(dropped_dependencies("-- nothing\n").is_empty());
    }

    #[test]
    fn a_tree_without_the_host_library_or_the_static_one_is_refused() {
        let err = select(|t| {
            Ok(if t == "all" {
                "all:\n  input: phony\n    foo.so\n    libnvshmem.a\n"
            } else {
                ""
            }
            .to_string())
        })
        .unwrap_err();
        assert!(err.to_string().contains("no libnvshmem_host.so"), "{err}");
        let err =
            select(|_| Ok("all:\n  input: phony\n    src/lib/libnvshmem_host.so\n".to_string()))
                .unwrap_err();
        assert!(err.to_string().contains("static-lib = true"), "{err}");
        let err = select(|_| {
            Ok("all:\n  input: phony\n    libnvshmem_host.so\n    libnvshmem.a\n".to_string())
        })
        .unwrap_err();
        assert!(err.to_string().contains("top of the build tree"), "{err}");
    }
}
