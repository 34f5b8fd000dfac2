//! The proof read from the installed files after every build: what the libraries say
//! about themselves, not what the recipe meant to do.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use commstack_elf::{self as elf, ElfFile};
use serde::{Deserialize, Serialize};

/// The result of [`prove`]. `failures` empty means every check passed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// The host library read (relative to the install).
    pub host_library: String,
    /// The build-variable string as compiled in.
    pub build_vars_raw: String,
    pub build_vars: BTreeMap<String, String>,
    /// The value of NVSHMEM_USE_NCCL in the string, literally.
    pub use_nccl: String,
    /// `KEY: expected X, found Y` for each option not as asked.
    pub option_mismatches: Vec<String>,
    /// Defines of the installed nvshmem_build_options.h (name -> defined).
    pub build_options_h: BTreeMap<String, bool>,
    pub build_options_h_mismatches: Vec<String>,
    /// `file@offset: context` for every `libnccl` byte string in the install's libraries.
    pub libnccl_hits: Vec<String>,
    /// From the `NVSHMEM vX.Y.Z` string of the host library.
    pub version: Option<String>,
    pub source_version: String,
    /// SASS architectures asked for, and found per file.
    pub sass_expected: Vec<u32>,
    pub sass_found: BTreeMap<String, Vec<u32>>,
    pub ptx_found: BTreeMap<String, Vec<u32>>,
    /// Newest symbol versions needed by any shared object under lib/ (what the wheel ships).
    pub newest_glibc: Option<String>,
    pub newest_glibcxx: Option<String>,
    /// `manylinux_2_17_x86_64`-style tag the glibc needs allow.
    pub manylinux: String,
    pub failures: Vec<String>,
}

impl Proof {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// What the proof checks against.
pub struct Expected<'a> {
    /// Every `-D` NVSHMEM_* switch and path passed (KEY -> ON/OFF or path).
    pub vars: &'a BTreeMap<String, String>,
    pub sass_archs: &'a [u32],
    pub source_version: &'a str,
}

/// Read the install at `prefix` and check it against `expected`.
pub fn prove(prefix: &Path, expected: &Expected<'_>) -> Result<Proof> {
    let major = expected.source_version.split('.').next().unwrap_or("3");
    let host_rel = format!("lib/libnvshmem_host.so.{major}");
    let host_path = prefix.join(&host_rel);
    let host = ElfFile::open(&host_path)
        .with_context(|| format!("no NVSHMEM host library at {}", host_path.display()))?;
    let info = host.nvshmem_host_info()?;
    let mut failures = Vec::new();
    let (use_nccl, option_mismatches) = check_build_vars(&host_rel, &info, expected, &mut failures);
    let (build_options_h, build_options_h_mismatches) =
        check_build_options_h(prefix, expected, &mut failures)?;
    let (libnccl_hits, needs) = scan_libraries(prefix, &mut failures)?;
    // 4. The version the library reports is the source's.
    let version = info.version.map(|v| v.to_string());
    if version.as_deref() != Some(expected.source_version) {
        failures.push(format!(
            "{host_rel} reports NVSHMEM {version:?}, the source is {}",
            expected.source_version
        ));
    }

    let (sass_found, ptx_found) = check_device_code(prefix, &host_rel, expected, &mut failures)?;

    // 6. glibc / libstdc++ symbol versions -> manylinux tag.
    let glibc = elf::newest_glibc(&needs);
    let glibcxx = elf::newest_glibcxx(&needs);
    let manylinux = elf::ManylinuxTag::for_glibc(glibc.as_ref(), "x86_64").pep600();

    Ok(Proof {
        host_library: host_rel,
        build_vars_raw: info.build_vars.raw.clone(),
        build_vars: info.build_vars.vars.clone(),
        use_nccl,
        option_mismatches,
        build_options_h,
        build_options_h_mismatches,
        libnccl_hits,
        version,
        source_version: expected.source_version.to_string(),
        sass_expected: expected.sass_archs.to_vec(),
        sass_found,
        ptx_found,
        newest_glibc: glibc.map(|v| v.to_string()),
        newest_glibcxx: glibcxx.map(|v| v.to_string()),
        manylinux,
        failures,
    })
}

/// Check 1, the build-variable string: NCCL off, every option as asked, nothing
/// unmapped. Returns NVSHMEM_USE_NCCL's value and the options that differ.
fn check_build_vars(
    host_rel: &str,
    info: &elf::NvshmemHostInfo,
    expected: &Expected<'_>,
    failures: &mut Vec<String>,
) -> (String, Vec<String>) {
    let use_nccl = info.build_vars.get(elf::USE_NCCL).unwrap_or("").to_string();
    if use_nccl != "OFF" {
        failures.push(format!(
            "{host_rel} says {}={use_nccl:?}, not OFF",
            elf::USE_NCCL
        ));
    }
    let in_string: BTreeMap<String, String> = expected
        .vars
        .iter()
        .filter(|(k, _)| info.build_vars.vars.contains_key(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let check = info.build_vars.check(&in_string);
    let option_mismatches: Vec<String> = check.mismatches.iter().map(|m| m.to_string()).collect();
    failures.extend(option_mismatches.iter().map(|m| format!("{host_rel}: {m}")));
    for key in info.build_vars.vars.keys() {
        if !expected.vars.contains_key(key) {
            failures.push(format!("{host_rel}: {key} is in the build-variable string but the recipe does not set it (a new NVSHMEM option? map it)"));
        }
    }
    (use_nccl, option_mismatches)
}

/// Check 2, the installed nvshmem_build_options.h agrees with the switches. Returns what
/// it defines and how it differs.
fn check_build_options_h(
    prefix: &Path,
    expected: &Expected<'_>,
    failures: &mut Vec<String>,
) -> Result<(BTreeMap<String, bool>, Vec<String>)> {
    let header = prefix.join("include/non_abi/nvshmem_build_options.h");
    let build_options_h = parse_build_options_h(
        &fs::read_to_string(&header)
            .with_context(|| format!("cannot read {}", header.display()))?,
    );
    let mut build_options_h_mismatches = Vec::new();
    for (name, defined) in &build_options_h {
        if let Some(v) = expected.vars.get(name) {
            let want = elf::cmake_bool(v).unwrap_or(false);
            if want != *defined {
                build_options_h_mismatches.push(format!(
                    "{name}: asked {v}, the header {}",
                    if *defined {
                        "defines it"
                    } else {
                        "leaves it undefined"
                    }
                ));
            }
        }
    }
    failures.extend(
        build_options_h_mismatches
            .iter()
            .map(|m| format!("include/non_abi/nvshmem_build_options.h: {m}")),
    );
    Ok((build_options_h, build_options_h_mismatches))
}

/// Check 3, no libnccl name anywhere in the libraries (NVIDIA's NCCL build dlopens it by
/// name). Returns the names found and the symbol versions lib/ needs.
fn scan_libraries(
    prefix: &Path,
    failures: &mut Vec<String>,
) -> Result<(Vec<String>, Vec<elf::NeededVersion>)> {
    let mut libnccl_hits = Vec::new();
    let mut needs = Vec::new();
    for file in library_files(prefix)? {
        let rel = file
            .strip_prefix(prefix)
            .unwrap_or(&file)
            .display()
            .to_string();
        let bytes = fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
        for at in find_all(&bytes, b"libnccl") {
            let end = bytes[at..]
                .iter()
                .position(|&b| b == 0)
                .map_or(bytes.len(), |p| at + p)
                .min(at + 80);
            libnccl_hits.push(format!(
                "{rel}@{at:#x}: {}",
                String::from_utf8_lossy(&bytes[at..end])
            ));
        }
        // The wheel ships lib/ only: its glibc needs decide the manylinux tag.
        if bytes.starts_with(b"\x7fELF") && rel.starts_with("lib/") {
            needs.extend(ElfFile::open(&file)?.needed_versions()?);
        }
    }
    failures.extend(libnccl_hits.iter().map(|h| format!("libnccl named in {h}")));
    Ok((libnccl_hits, needs))
}

/// Architectures, by library (relative to the prefix).
type ArchsByLibrary = BTreeMap<String, Vec<u32>>;

/// Check 5, SASS for exactly the architectures asked, in the device library. Returns the
/// SASS and PTX archs of each library.
fn check_device_code(
    prefix: &Path,
    host_rel: &str,
    expected: &Expected<'_>,
    failures: &mut Vec<String>,
) -> Result<(ArchsByLibrary, ArchsByLibrary)> {
    let mut sass_found = BTreeMap::new();
    let mut ptx_found = BTreeMap::new();
    for rel in ["lib/libnvshmem_device.a".to_string(), host_rel.to_string()] {
        let path = prefix.join(&rel);
        if !path.is_file() {
            continue;
        }
        let code = elf::read_device_code(&path)?;
        sass_found.insert(
            rel.clone(),
            code.sass_archs().into_iter().collect::<Vec<_>>(),
        );
        ptx_found.insert(rel, code.ptx_archs().into_iter().collect::<Vec<_>>());
    }
    match sass_found.get("lib/libnvshmem_device.a") {
        Some(found) if found.as_slice() == expected.sass_archs => {}
        Some(found) => failures.push(format!(
            "lib/libnvshmem_device.a has SASS for {found:?}, the stack asks {:?}",
            expected.sass_archs
        )),
        None => failures.push("no lib/libnvshmem_device.a in the install".into()),
    }
    Ok((sass_found, ptx_found))
}

/// `#define X` -> (X, true), `/* #undef X */` -> (X, false): the lines CMake's
/// `#cmakedefine` wrote, i.e. those before the first `#if` (NVSHMEM's header ends with a
/// block that redefines some names for the bitcode library, not for the build).
pub fn parse_build_options_h(text: &str) -> BTreeMap<String, bool> {
    let re = regex::Regex::new(
        r"^\s*(?:#define\s+(NVSHMEM_\w+)\s*$|/\*\s*#undef\s+(NVSHMEM_\w+)\s*\*/)",
    )
    .expect("valid regex");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.trim_start().starts_with("#if") {
            break;
        }
        if let Some(c) = re.captures(line) {
            match (c.get(1), c.get(2)) {
                (Some(d), _) => out.insert(d.as_str().to_string(), true),
                (_, Some(u)) => out.insert(u.as_str().to_string(), false),
                _ => None,
            };
        }
    }
    out
}

/// Regular files under lib/ and bin/ that are ELF objects or archives (links skipped:
/// their targets are listed).
pub fn library_files(prefix: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for dir in ["lib", "bin"] {
        let dir = prefix.join(dir);
        if !dir.is_dir() {
            continue;
        }
        for e in walkdir::WalkDir::new(&dir)
            .follow_links(false)
            .sort_by_file_name()
        {
            let e = e?;
            if !e.file_type().is_file() {
                continue;
            }
            let mut head = [0u8; 8];
            let n = std::io::Read::read(&mut fs::File::open(e.path())?, &mut head)?;
            if head[..n].starts_with(b"\x7fELF") || head[..n].starts_with(b"!<arch>\n") {
                out.push(e.path().to_path_buf());
            }
        }
    }
    Ok(out)
}

fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let finder = regex::bytes::Regex::new(&regex::escape(
        std::str::from_utf8(needle).expect("ASCII needle"),
    ))
    .expect("valid");
    finder.find_iter(hay).map(|m| m.start()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nvidias_build_options_header() {
        let h = "#pragma once\n\n/* #undef NVSHMEM_DEBUG */\n#define NVSHMEM_IBGDA_SUPPORT\n#define NVSHMEM_USE_NCCL\n\
                 /* #undef NVSHMEM_ENABLE_ALL_DEVICE_INLINING */\n\n#if defined __clang_llvm_bitcode_lib__\n\
                 #undef NVSHMEM_IBGDA_SUPPORT\n#define NVSHMEM_ENABLE_ALL_DEVICE_INLINING\n#endif\n";
        let m = parse_build_options_h(h);
        assert!(!m["NVSHMEM_DEBUG"]);
        assert!(m["NVSHMEM_IBGDA_SUPPORT"]);
        assert!(
            !m["NVSHMEM_ENABLE_ALL_DEVICE_INLINING"],
            "the bitcode-only block is not the build's"
        );
        assert_eq!(m.len(), 4);
    }
}
