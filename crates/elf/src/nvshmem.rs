//! NVSHMEM's build-variable string and version, read from libnvshmem_host.
//!
//! NVSHMEM's CMake writes `#define NVSHMEM_BUILD_VARS "..."` into
//! include/non_abi/nvshmem_version.h and compiles it into libnvshmem_host (`nvshmem-info
//! -a` and `NVSHMEM_DEBUG=INFO` print it). It is one line of space-separated `KEY=VALUE`
//! pairs: every NVSHMEM_* option (`NVSHMEM_USE_NCCL=OFF`), then the `*_HOME` paths and
//! `NVSHMEM_PREFIX`. The version lives beside it as NVSHMEM_VENDOR_STRING,
//! `"NVSHMEM v3.4.5"`, a literal NUL-terminated string in .rodata.

use std::collections::BTreeMap;
use std::fmt;

use memchr::memmem;
use serde::{Deserialize, Serialize};

use super::scan::c_string_around;
use super::{ElfError, ElfFile};

/// The key whose value proves NVSHMEM cannot load NCCL.
pub const USE_NCCL: &str = "NVSHMEM_USE_NCCL";

/// The parsed build-variable string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvshmemBuildVars {
    /// The string as compiled in.
    pub raw: String,
    /// Every `KEY=VALUE` pair; a value may be empty (`MPI_HOME=`).
    pub vars: BTreeMap<String, String>,
}

impl NvshmemBuildVars {
    /// Parses `KEY=VALUE KEY=VALUE ...`. A word without `=` continues the previous value
    /// (a path holding a space), so no byte of the string is dropped.
    pub fn parse(raw: &str) -> Result<NvshmemBuildVars, String> {
        let mut vars: BTreeMap<String, String> = BTreeMap::new();
        let mut last: Option<String> = None;
        for word in raw.split(' ').filter(|w| !w.is_empty()) {
            match word.split_once('=') {
                Some((key, value)) if is_var_name(key) => {
                    vars.insert(key.to_string(), value.to_string());
                    last = Some(key.to_string());
                }
                _ => match &last {
                    Some(key) => {
                        let v = vars.get_mut(key).expect("inserted above");
                        v.push(' ');
                        v.push_str(word);
                    }
                    None => {
                        return Err(format!(
                            "build-variable string starts with `{word}`, not KEY=VALUE"
                        ));
                    }
                },
            }
        }
        if !vars.contains_key(USE_NCCL) {
            return Err(format!(
                "no {USE_NCCL}= in the build-variable string `{raw}`"
            ));
        }
        Ok(NvshmemBuildVars {
            raw: raw.to_string(),
            vars,
        })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }

    /// `Some(false)` for `NVSHMEM_USE_NCCL=OFF` (or 0, FALSE, ...), as CMake reads it.
    pub fn use_nccl(&self) -> Option<bool> {
        self.get(USE_NCCL).and_then(cmake_bool)
    }

    /// `NVSHMEM_USE_NCCL=OFF`, then each `expected` key with its value. Booleans compare
    /// as CMake reads them (`ON` = `1` = `TRUE`), anything else byte for byte. Every
    /// mismatch is reported, not only the first.
    pub fn check(&self, expected: &BTreeMap<String, String>) -> BuildVarsCheck {
        let mut required = vec![(USE_NCCL.to_string(), "OFF".to_string())];
        // An expected `NVSHMEM_USE_NCCL=OFF` would only repeat the first requirement.
        required.extend(
            expected
                .iter()
                .filter(|(k, v)| !(k.as_str() == USE_NCCL && cmake_bool(v) == Some(false)))
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        let mut mismatches = Vec::new();
        for (key, want) in &required {
            let found = self.get(key);
            let same = match (found, cmake_bool(want)) {
                (Some(f), Some(w)) => cmake_bool(f) == Some(w),
                (Some(f), None) => f == want,
                (None, _) => false,
            };
            if !same {
                mismatches.push(BuildVarMismatch {
                    key: key.clone(),
                    expected: want.clone(),
                    found: found.map(str::to_string),
                });
            }
        }
        BuildVarsCheck { mismatches }
    }
}

fn is_var_name(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// CMake's reading of a boolean: ON/YES/TRUE/Y/non-zero number, OFF/NO/FALSE/N/0/empty.
pub fn cmake_bool(value: &str) -> Option<bool> {
    match value.to_ascii_uppercase().as_str() {
        "ON" | "YES" | "TRUE" | "Y" => Some(true),
        "OFF" | "NO" | "FALSE" | "N" | "" | "IGNORE" | "NOTFOUND" => Some(false),
        v if v.ends_with("-NOTFOUND") => Some(false),
        v => v.parse::<f64>().ok().map(|n| n != 0.0),
    }
}

/// One expected option the library does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildVarMismatch {
    pub key: String,
    pub expected: String,
    /// `None`: the key is not in the string at all.
    pub found: Option<String>,
}

impl fmt::Display for BuildVarMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.found {
            Some(found) => write!(
                f,
                "{}: expected {}, found {}",
                self.key, self.expected, found
            ),
            None => write!(
                f,
                "{}: expected {}, absent from the build string",
                self.key, self.expected
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildVarsCheck {
    pub mismatches: Vec<BuildVarMismatch>,
}

impl BuildVarsCheck {
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// NVSHMEM's release version, `3.4.5`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NvshmemVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for NvshmemVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for NvshmemVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not an NVSHMEM version like 3.4.5");
        let mut it = s.split('.').map(|p| p.parse::<u32>().map_err(|_| bad()));
        let v = NvshmemVersion {
            major: it.next().ok_or_else(bad)??,
            minor: it.next().ok_or_else(bad)??,
            patch: it.next().ok_or_else(bad)??,
        };
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }
}

/// What libnvshmem_host says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvshmemHostInfo {
    pub build_vars: NvshmemBuildVars,
    /// File offset of the build-variable string.
    pub build_vars_offset: u64,
    /// From the `NVSHMEM vX.Y.Z` vendor string; `None` if the library has none.
    pub version: Option<NvshmemVersion>,
}

impl ElfFile {
    /// Finds and parses the build-variable string and the version. Fails when there is
    /// no build string (not an NVSHMEM host library) or two different ones.
    pub fn nvshmem_host_info(&self) -> Result<NvshmemHostInfo, ElfError> {
        let (offset, build_vars) =
            find_build_vars(self.bytes()).map_err(|why| ElfError::Content {
                path: self.path().to_path_buf(),
                why,
            })?;
        let version = find_vendor_version(self.bytes()).map_err(|why| ElfError::Content {
            path: self.path().to_path_buf(),
            why,
        })?;
        Ok(NvshmemHostInfo {
            build_vars,
            build_vars_offset: offset,
            version,
        })
    }
}

/// The build-variable string in any bytes (a library, an object, a header): the
/// NUL-delimited string around each `NVSHMEM_USE_NCCL=` that parses as KEY=VALUE pairs.
/// Copies of the same string are fine (one per object in an archive); two different
/// strings are an error, since which one is the truth cannot be told.
pub fn find_build_vars(bytes: &[u8]) -> Result<(u64, NvshmemBuildVars), String> {
    let needle = format!("{USE_NCCL}=");
    let mut found: Vec<(u64, NvshmemBuildVars)> = Vec::new();
    for at in memmem::find_iter(bytes, needle.as_bytes()) {
        let start = bytes[..at]
            .iter()
            .rposition(|&b| b == 0 || b == b'"' || b == b'\n')
            .map_or(0, |p| p + 1);
        let end = bytes[at..]
            .iter()
            .position(|&b| b == 0 || b == b'"' || b == b'\n')
            .map_or(bytes.len(), |p| at + p);
        let Ok(text) = std::str::from_utf8(&bytes[start..end]) else {
            continue;
        };
        let Ok(vars) = NvshmemBuildVars::parse(text) else {
            continue;
        };
        if !found.iter().any(|(_, v)| v.raw == vars.raw) {
            found.push((start as u64, vars));
        }
    }
    match found.len() {
        0 => Err(format!(
            "no NVSHMEM build-variable string (`... {USE_NCCL}=OFF ...`): not an NVSHMEM host library, or one too old to carry it"
        )),
        1 => Ok(found.remove(0)),
        _ => Err(format!(
            "{} different NVSHMEM build-variable strings, at offsets {}: two NVSHMEM builds were linked into one file",
            found.len(),
            found
                .iter()
                .map(|(o, _)| format!("{o:#x}"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// The version of the `NVSHMEM vX.Y.Z` vendor string(s) in `bytes`.
pub fn find_vendor_version(bytes: &[u8]) -> Result<Option<NvshmemVersion>, String> {
    let mut versions: Vec<NvshmemVersion> = Vec::new();
    for at in memmem::find_iter(bytes, b"NVSHMEM v") {
        let rest = &bytes[at + b"NVSHMEM v".len()..];
        let end = rest
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(rest.len())
            .min(32);
        let Ok(text) = std::str::from_utf8(&rest[..end]) else {
            continue;
        };
        let Ok(v) = text.parse::<NvshmemVersion>() else {
            continue;
        };
        if !versions.contains(&v) {
            versions.push(v);
        }
    }
    match versions.len() {
        0 => Ok(None),
        1 => Ok(Some(versions[0])),
        _ => Err(format!(
            "several NVSHMEM versions in one file: {} (near `{}`)",
            versions
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            c_string_around(bytes, memmem::find(bytes, b"NVSHMEM v").unwrap_or(0), 60)
        )),
    }
}
