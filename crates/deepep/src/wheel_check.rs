//! Proof that a built DeepEP wheel is what the stack needs, read from the wheel itself:
//! RECORD verifies; the libcuda link stub is not in it; the extension module needs the
//! stack's NVSHMEM (V1) or NCCL (V2) by SONAME, searches only relative to itself
//! (`$ORIGIN/nvidia/nvshmem/lib`, where the drop-in wheel installs), never the build
//! machine's stub directory; and no file in it names a build path (the store,
//! COMMSTACK_HOME, the build directory, an input's real path). The extension uses the
//! process's libstdc++ (NEEDs libstdc++.so.6, defines none of its internals), and V2's
//! `deep_ep/envs.py` bakes no variable of the build environment.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_elf::{DynamicInfo, ElfFile};
use commstack_stack::manifest::DeepEpApi;
use commstack_wheel::Wheel;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What the wheel holds, as the build report records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WheelFacts {
    pub filename: String,
    pub sha256: String,
    pub name: String,
    pub version: String,
    pub files: Vec<String>,
    /// The compiled extension (`deep_ep_cpp.cpython-312-x86_64-linux-gnu.so`, `deep_ep/_C...so`).
    pub extension: String,
    pub extension_sha256: String,
    pub needed: Vec<String>,
    pub runpath: Vec<String>,
    pub rpath: Vec<String>,
    /// sha256 (hex) of every file in the wheel: two sites compare builds with these.
    pub file_sha256: BTreeMap<String, String>,
    /// The paths no file of the wheel contains (checked: the build fails otherwise).
    pub scanned_for: Vec<String>,
    /// Fixed-directory paths left in files of the wheel, the same for the same key (so
    /// the bytes are reproducible), each with why it is there.
    pub build_paths_kept: Vec<crate::reproducible::KeptPath>,
}

/// What a wheel must (not) hold.
pub struct Expect<'a> {
    pub api: DeepEpApi,
    /// SONAMEs the extension must need (`libnvshmem_host.so.3`).
    pub needed: &'a [String],
    /// Directories that must not appear in its RPATH/RUNPATH (the libcuda stub's).
    pub forbidden_search_dirs: &'a [&'a Path],
    /// Entries its RUNPATH must have (`$ORIGIN/nvidia/nvshmem/lib`); every entry must be
    /// relative to `$ORIGIN` whatever this says.
    pub required_runpath: &'a [String],
    /// Strings (build paths that differ between machines) no file of the wheel may contain.
    pub forbidden_paths: &'a [String],
    /// This build's fixed directory: paths under [`commstack_store::FIXED_BUILD_ROOT`]
    /// are told apart by [`crate::reproducible::scan_fixed_paths`]; only those that are
    /// the same for the same key stay (recorded), any other fails the build.
    pub fixed_dir: Option<&'a Path>,
}

/// What the content checks read from the extension, and the build paths they kept.
#[derive(Clone, Debug)]
pub struct ContentFacts {
    pub extension: String,
    pub extension_sha256: String,
    pub needed: Vec<String>,
    pub runpath: Vec<String>,
    pub rpath: Vec<String>,
    pub build_paths_kept: Vec<crate::reproducible::KeptPath>,
}

/// The checks of what a wheel holds (`files`: each path inside it with its bytes; named
/// as `wheel_path` in messages): the one extension and what it links and searches, its
/// libstdc++, V2's envs.py, and no build path in any file.
pub fn check_contents(
    wheel_path: &Path,
    files: &[(&str, &[u8])],
    expect: &Expect<'_>,
    scratch: &Path,
) -> Result<ContentFacts> {
    let names: Vec<String> = files.iter().map(|(n, _)| n.to_string()).collect();
    let extension = the_extension(wheel_path, &names, expect.api)?;
    let file = |name: &str| files.iter().find(|(n, _)| *n == name).map(|(_, b)| *b);
    let so_bytes =
        file(&extension).with_context(|| format!("{}: no {extension}", wheel_path.display()))?;
    fs::create_dir_all(scratch)?;
    let so = scratch.join(extension.rsplit('/').next().unwrap_or(&extension));
    fs::write(&so, so_bytes).with_context(|| format!("cannot write {}", so.display()))?;
    let elf = ElfFile::open(&so)?;
    let info = elf.dynamic_info()?;
    let internals = elf.libstdcxx_internals()?;
    drop(elf);
    fs::remove_file(&so).ok();
    check_linking(wheel_path, &extension, &info, expect)?;
    check_libstdcxx(wheel_path, &extension, &info, &internals)?;
    if expect.api == DeepEpApi::V2 {
        let envs = file("deep_ep/envs.py").with_context(|| {
            format!(
                "{} has no deep_ep/envs.py: DeepEP V2's setup.py writes it",
                wheel_path.display()
            )
        })?;
        check_persistent_envs(wheel_path, &String::from_utf8_lossy(envs))?;
    }
    let build_paths_kept = check_paths(wheel_path, files, expect)?;
    Ok(ContentFacts {
        extension_sha256: hex::encode(Sha256::digest(so_bytes)),
        extension,
        needed: info.needed,
        runpath: info.runpath,
        rpath: info.rpath,
        build_paths_kept,
    })
}

/// The build report's record of the wheel at `wheel_path`: `wheel`'s metadata, the files
/// and hashes its rewrite wrote, and what its checks found.
pub fn wheel_facts(
    wheel_path: &Path,
    wheel: &Wheel,
    written: crate::reproducible::CanonicalWheel,
    content: ContentFacts,
    expect: &Expect<'_>,
) -> Result<WheelFacts> {
    Ok(WheelFacts {
        filename: wheel_path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned(),
        sha256: commstack_digest::sha256_file(wheel_path)?,
        name: wheel.name().to_string(),
        version: wheel.version()?.to_string(),
        files: written.files,
        extension: content.extension,
        extension_sha256: content.extension_sha256,
        needed: content.needed,
        runpath: content.runpath,
        rpath: content.rpath,
        file_sha256: written.file_sha256,
        scanned_for: expect.forbidden_paths.to_vec(),
        build_paths_kept: content.build_paths_kept,
    })
}

/// The wheel's one extension module; no libcuda stub beside it.
fn the_extension(wheel_path: &Path, files: &[String], api: DeepEpApi) -> Result<String> {
    if let Some(stub) = files.iter().find(|f| {
        f.rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("libcuda.so"))
    }) {
        bail!(
            "{} contains {stub}: the libcuda link stub must never ship (the driver's libcuda.so.1 is used at run time)",
            wheel_path.display()
        );
    }
    let prefix = match api {
        DeepEpApi::V1 => "deep_ep_cpp",
        DeepEpApi::V2 => "deep_ep/_C",
    };
    let extensions: Vec<&String> = files
        .iter()
        .filter(|f| f.starts_with(prefix) && f.ends_with(".so"))
        .collect();
    let [extension] = extensions[..] else {
        bail!(
            "{} should hold one extension module {prefix}*.so, it holds {}: {:?}",
            wheel_path.display(),
            extensions.len(),
            extensions
        );
    };
    Ok(extension.clone())
}

/// The variables V2's setup.py copies from its environment into `deep_ep/envs.py`
/// (setup.py:13), defaults at import (deep_ep/__init__.py:10-18).
pub const PERSISTENT_ENV_NAMES: [&str; 4] = [
    "EP_JIT_CACHE_DIR",
    "EP_JIT_PRINT_COMPILER_COMMAND",
    "EP_NUM_TOPK_IDX_BITS",
    "EP_NCCL_ROOT_DIR",
];

/// V2's `deep_ep/envs.py` must set nothing: a baked EP_JIT_CACHE_DIR or EP_NCCL_ROOT_DIR
/// would be a path of the build machine in every install (the image sets
/// EP_JIT_CACHE_DIR in its environment; find_nccl_root() finds the installed nvidia-nccl).
pub fn check_persistent_envs(wheel_path: &Path, envs_py: &str) -> Result<()> {
    let baked: Vec<&str> = envs_py
        .lines()
        .filter(|l| l.trim_start().starts_with("persistent_envs["))
        .collect();
    if !baked.is_empty() {
        bail!(
            "deep_ep/envs.py in {} bakes variables of the build environment into every install: {}. \
             DeepEP V2's setup.py copies {} from its environment; `cargo xtask build deepep` runs it in an empty one, so something set them (a changed recipe?): rebuild with `cargo xtask build deepep --force`",
            wheel_path.display(),
            baked.join("; "),
            PERSISTENT_ENV_NAMES.join(", ")
        );
    }
    Ok(())
}

/// The extension uses the process's libstdc++ (torch loads libstdc++.so.6 first): a copy
/// linked in breaks std::locale and crashed V2's JIT in std::regex (docs/deepep-v2.md).
fn check_libstdcxx(
    wheel_path: &Path,
    extension: &str,
    info: &DynamicInfo,
    internals: &[String],
) -> Result<()> {
    let needs = info.needed.iter().any(|n| n == "libstdc++.so.6");
    if !needs || !internals.is_empty() {
        bail!(
            "{extension} in {} {} and defines {} of libstdc++'s internals{}: the host g++ linked a copy of libstdc++ (it found only libstdc++.a, or -static-libstdc++). \
             Beside torch's libstdc++.so.6 that copy's std::locale breaks. The build takes the first g++ on PATH: put one whose libstdc++.so.6 is installed first (`g++ -print-file-name=libstdc++.so` must print a path), then `cargo xtask build deepep --force`",
            wheel_path.display(),
            if needs {
                "NEEDs libstdc++.so.6"
            } else {
                "does not NEED libstdc++.so.6"
            },
            internals.len(),
            internals
                .first()
                .map(|s| format!(" ({s}, ...)"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// What the extension needs and where it searches: the stack's libraries, the driver's
/// SONAME, no stub directory, every search path relative to it.
fn check_linking(
    wheel_path: &Path,
    extension: &str,
    info: &DynamicInfo,
    expect: &Expect<'_>,
) -> Result<()> {
    for soname in expect.needed {
        if !info.needed.contains(soname) {
            bail!(
                "{extension} in {} does not need {soname} (it needs {}): it was not linked against the stack's library",
                wheel_path.display(),
                info.needed.join(", ")
            );
        }
    }
    // -lcuda against the stub: the SONAME libcuda.so.1 is recorded, never the file name.
    if let Some(bad) = info
        .needed
        .iter()
        .find(|n| n.starts_with("libcuda.so") && *n != "libcuda.so.1")
    {
        bail!(
            "{extension} needs {bad}, not libcuda.so.1: it was linked against a libcuda without the driver's SONAME"
        );
    }
    for dir in expect.forbidden_search_dirs {
        let d = dir.display().to_string();
        if let Some(entry) = info
            .runpath
            .iter()
            .chain(&info.rpath)
            .find(|e| e.starts_with(&d))
        {
            bail!(
                "{extension} searches {entry} at run time: the build machine's libcuda stub directory must not be on its path"
            );
        }
    }
    // The wheel installs anywhere: a search path must be relative to the extension.
    if let Some(abs) = info
        .runpath
        .iter()
        .chain(&info.rpath)
        .flat_map(|e| e.split(':'))
        .find(|e| !e.starts_with("$ORIGIN"))
    {
        bail!(
            "{extension} in {} searches {abs} at run time (RUNPATH {:?}, RPATH {:?}): a path of the build machine; it must be relative to the extension ($ORIGIN/...)",
            wheel_path.display(),
            info.runpath,
            info.rpath
        );
    }
    for want in expect.required_runpath {
        if !info
            .runpath
            .iter()
            .flat_map(|e| e.split(':'))
            .any(|e| e == want)
        {
            bail!(
                "{extension} in {} has RUNPATH {:?}, not {want}: it would not find the drop-in NVSHMEM wheel's library beside it in site-packages",
                wheel_path.display(),
                info.runpath
            );
        }
    }
    Ok(())
}

/// No build path of this machine in any file; the fixed directory's paths only where
/// they are the same for the same key (returned, to be recorded).
fn check_paths(
    wheel_path: &Path,
    files: &[(&str, &[u8])],
    expect: &Expect<'_>,
) -> Result<Vec<crate::reproducible::KeptPath>> {
    let found = crate::reproducible::scan_files(files, expect.forbidden_paths);
    if !found.is_empty() {
        bail!(
            "{} names build paths in {} place(s), so another machine would build other bytes:\n  {}",
            wheel_path.display(),
            found.len(),
            found
                .iter()
                .map(|f| format!(
                    "{}: {} at byte {} ({})",
                    f.file, f.path, f.offset, f.context
                ))
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    let mut kept = Vec::new();
    if let Some(own) = expect.fixed_dir {
        let mut bad = Vec::new();
        for (k, use_) in
            crate::reproducible::scan_fixed_paths(files, commstack_store::FIXED_BUILD_ROOT, own)
        {
            match use_ {
                crate::reproducible::FixedPathUse::Own => bad.push(k),
                _ => kept.push(k),
            }
        }
        if !bad.is_empty() {
            bail!(
                "{} names its build directory {} outside nvlink's record (a compiler without the prefix map?):\n  {}",
                wheel_path.display(),
                own.display(),
                bad.iter()
                    .map(|k| format!("{}: {} ({}x)", k.file, k.path, k.count))
                    .collect::<Vec<_>>()
                    .join("\n  ")
            );
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envs_py_may_bake_nothing() {
        let wheel = Path::new("deep_ep-2.1.0.whl");
        let empty = "# Pre-installed environment variables\npersistent_envs = dict()\n";
        check_persistent_envs(wheel, empty).unwrap();
        let baked =
            format!("{empty}persistent_envs['EP_JIT_CACHE_DIR'] = '/tmp/v2probe/jit-cache'\n");
        let err = check_persistent_envs(wheel, &baked)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("EP_JIT_CACHE_DIR") && err.contains("/tmp/v2probe/jit-cache"),
            "{err}"
        );
    }
}
