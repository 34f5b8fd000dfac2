//! Our drop-in wheel against NVIDIA's wheel of the same version, file by file. Every
//! difference must have an explanation tied to a known cause or a stack option;
//! unexplained differences fail the comparison.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use commstack_wheel::Wheel;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::options::NvshmemOptions;
use crate::proof::parse_build_options_h;

const BUILD_OPTIONS_H: &str = "nvidia/nvshmem/include/non_abi/nvshmem_build_options.h";
const VERSION_H: &str = "nvidia/nvshmem/include/non_abi/nvshmem_version.h";
const DIST_INFO: &str = "<dist-info>";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DifferenceKind {
    OnlyOurs,
    OnlyTheirs,
    ContentDiffers,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Difference {
    /// Path inside the wheel; `<dist-info>/...` for the metadata directory.
    pub path: String,
    pub kind: DifferenceKind,
    /// Why; None means nobody can say, and the comparison fails.
    pub explanation: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Comparison {
    pub ours: PathBuf,
    pub theirs: PathBuf,
    /// Files byte-identical in both.
    pub identical: Vec<String>,
    pub differences: Vec<Difference>,
    /// Defines tested by NVSHMEM's installed headers (the device ABI): (ours, theirs).
    pub abi_defines: BTreeMap<String, (bool, bool)>,
}

impl Comparison {
    pub fn unexplained(&self) -> Vec<&Difference> {
        self.differences
            .iter()
            .filter(|d| d.explanation.is_none())
            .collect()
    }

    pub fn passed(&self) -> bool {
        self.unexplained().is_empty()
    }

    /// A plain-text table: one line per difference.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ours:   {}\ntheirs: {}",
            self.ours.display(),
            self.theirs.display()
        );
        let _ = writeln!(
            s,
            "{} file(s) identical, {} difference(s), {} unexplained",
            self.identical.len(),
            self.differences.len(),
            self.unexplained().len()
        );
        for d in &self.differences {
            let kind = match d.kind {
                DifferenceKind::OnlyOurs => "only ours  ",
                DifferenceKind::OnlyTheirs => "only theirs",
                DifferenceKind::ContentDiffers => "differs    ",
            };
            let why = d.explanation.as_deref().unwrap_or("UNEXPLAINED");
            // Paths are the wheels' entry names (one of them NVIDIA's download).
            let path =
                commstack_digest::terminal_safe_capped(&d.path, commstack_digest::SHOWN_NAME_MAX);
            let _ = writeln!(s, "  {kind}  {path}\n               {why}");
        }
        s
    }
}

struct WheelFiles {
    files: BTreeMap<String, Vec<u8>>,
}

fn read_all(path: &Path) -> Result<WheelFiles> {
    let w = Wheel::open(path)?;
    w.verify()?;
    let mut files = BTreeMap::new();
    for e in &w.entries {
        if e.is_dir {
            continue;
        }
        let key = match e.path.strip_prefix(&format!("{}/", w.dist_info)) {
            Some(rest) => format!("{DIST_INFO}/{rest}"),
            None => e.path.clone(),
        };
        files.insert(key, w.read(&e.path)?);
    }
    Ok(WheelFiles { files })
}

/// Compare `ours` (built with `options`) with NVIDIA's `theirs`.
pub fn compare_wheels(ours: &Path, theirs: &Path, options: &NvshmemOptions) -> Result<Comparison> {
    let a = read_all(ours)?;
    let b = read_all(theirs)?;
    let abi = abi_define_names(&a)
        .union(&abi_define_names(&b))
        .cloned()
        .collect::<BTreeSet<_>>();
    let defs_a = a
        .files
        .get(BUILD_OPTIONS_H)
        .map(|x| parse_build_options_h(&String::from_utf8_lossy(x)))
        .unwrap_or_default();
    let defs_b = b
        .files
        .get(BUILD_OPTIONS_H)
        .map(|x| parse_build_options_h(&String::from_utf8_lossy(x)))
        .unwrap_or_default();
    let abi_defines: BTreeMap<String, (bool, bool)> = abi
        .iter()
        .map(|n| {
            (
                n.clone(),
                (
                    defs_a.get(n).copied().unwrap_or(false),
                    defs_b.get(n).copied().unwrap_or(false),
                ),
            )
        })
        .collect();

    let mut identical = Vec::new();
    let mut differences = Vec::new();
    let paths: BTreeSet<&String> = a.files.keys().chain(b.files.keys()).collect();
    for path in paths {
        let (x, y) = (a.files.get(path), b.files.get(path));
        let kind = match (x, y) {
            (Some(x), Some(y)) if Sha256::digest(x) == Sha256::digest(y) => {
                identical.push(path.clone());
                continue;
            }
            (Some(_), Some(_)) => DifferenceKind::ContentDiffers,
            (Some(_), None) => DifferenceKind::OnlyOurs,
            (None, _) => DifferenceKind::OnlyTheirs,
        };
        let explanation = explain(path, kind, options, x, y, &defs_a, &defs_b, &abi);
        differences.push(Difference {
            path: path.clone(),
            kind,
            explanation,
        });
    }
    Ok(Comparison {
        ours: ours.to_path_buf(),
        theirs: theirs.to_path_buf(),
        identical,
        differences,
        abi_defines,
    })
}

/// Names of NVSHMEM_* macros that installed headers test in `#if`/`#ifdef`: settings that
/// change code compiled by NVSHMEM's users (torch, DeepEP), i.e. the device ABI.
fn abi_define_names(w: &WheelFiles) -> BTreeSet<String> {
    let directive =
        regex::Regex::new(r"(?m)^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$").expect("valid regex");
    let name = regex::Regex::new(r"\bNVSHMEM_[A-Z0-9_]+\b").expect("valid regex");
    let mut out = BTreeSet::new();
    for (path, bytes) in &w.files {
        if !path.starts_with("nvidia/nvshmem/include/") || path == BUILD_OPTIONS_H {
            continue;
        }
        let text = String::from_utf8_lossy(bytes);
        for c in directive.captures_iter(&text) {
            for n in name.find_iter(&c[1]) {
                // Include guards (NVSHMEM_TYPES_H) are not settings.
                if !n.as_str().ends_with("_H") {
                    out.insert(n.as_str().to_string());
                }
            }
        }
    }
    out
}

/// Plugin libraries NVIDIA ships and the option that builds each.
fn plugin_option(file: &str, o: &NvshmemOptions) -> Option<(&'static str, bool)> {
    let table: [(&str, &str, bool); 8] = [
        (
            "nvshmem_transport_ibgda",
            "ibgda",
            o.switches.is_on("ibgda"),
        ),
        ("nvshmem_transport_ibrc", "ibrc", o.switches.is_on("ibrc")),
        (
            "nvshmem_transport_ibdevx",
            "ibdevx",
            o.switches.is_on("ibdevx"),
        ),
        ("nvshmem_transport_ucx", "ucx", o.switches.is_on("ucx")),
        (
            "nvshmem_transport_libfabric",
            "libfabric",
            o.switches.is_on("libfabric"),
        ),
        ("nvshmem_bootstrap_mpi", "mpi", o.switches.is_on("mpi")),
        (
            "nvshmem_bootstrap_shmem",
            "shmem",
            o.switches.is_on("shmem"),
        ),
        ("nvshmem_bootstrap_pmix", "pmix", o.switches.is_on("pmix")),
    ];
    let base = file.rsplit('/').next()?.split(".so").next()?;
    table
        .iter()
        .find(|(lib, _, _)| *lib == base)
        .map(|(_, opt, on)| (*opt, *on))
}

/// The stack option (or recipe rule) behind an nvshmem_build_options.h define.
fn define_reason(name: &str, o: &NvshmemOptions) -> Option<String> {
    let opt = |field: &str, on: bool| Some(format!("stack option nvshmem.{field} = {on}"));
    match name {
        "NVSHMEM_USE_NCCL" => Some("NCCL off by design (one NCCL per process: torch's)".into()),
        "NVSHMEM_BUILD_TESTS" | "NVSHMEM_BUILD_EXAMPLES" => {
            Some("NVSHMEM's tests and examples are not built by the recipe".into())
        }
        "NVSHMEM_IBRC_SUPPORT" => opt("ibrc", o.switches.is_on("ibrc")),
        "NVSHMEM_IBDEVX_SUPPORT" => opt("ibdevx", o.switches.is_on("ibdevx")),
        "NVSHMEM_UCX_SUPPORT" => opt("ucx", o.switches.is_on("ucx")),
        "NVSHMEM_LIBFABRIC_SUPPORT" => opt("libfabric", o.switches.is_on("libfabric")),
        "NVSHMEM_MPI_SUPPORT" => opt("mpi", o.switches.is_on("mpi")),
        "NVSHMEM_SHMEM_SUPPORT" => opt("shmem", o.switches.is_on("shmem")),
        "NVSHMEM_PMIX_SUPPORT" => opt("pmix", o.switches.is_on("pmix")),
        "NVSHMEM_USE_GDRCOPY" => opt("gdrcopy", o.switches.is_on("gdrcopy")),
        "NVSHMEM_USE_MLX5DV" => opt("mlx5dv", o.switches.is_on("mlx5dv")),
        "NVSHMEM_NVTX" => opt("nvtx", o.switches.is_on("nvtx")),
        "NVSHMEM_USE_DLMALLOC" => opt("dlmalloc", o.switches.is_on("dlmalloc")),
        "NVSHMEM_IBGDA_SUPPORT" => opt("ibgda", o.switches.is_on("ibgda")),
        "NVSHMEM_DEBUG" | "NVSHMEM_DEVEL" | "NVSHMEM_TRACE" | "NVSHMEM_VERBOSE" => {
            let f = name.trim_start_matches("NVSHMEM_").to_ascii_lowercase();
            Some(format!("stack option nvshmem.{f}"))
        }
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn explain(
    path: &str,
    kind: DifferenceKind,
    o: &NvshmemOptions,
    ours: Option<&Vec<u8>>,
    theirs: Option<&Vec<u8>>,
    defs_a: &BTreeMap<String, bool>,
    defs_b: &BTreeMap<String, bool>,
    abi: &BTreeSet<String>,
) -> Option<String> {
    use DifferenceKind::*;
    if let Some(rest) = path.strip_prefix(&format!("{DIST_INFO}/")) {
        return match rest {
            "METADATA" => Some("metadata of our build: version with the commstack local label, summary, description".into()),
            "WHEEL" => Some("our generator and the manylinux tag computed from our libraries' glibc symbol versions".into()),
            "RECORD" => Some("lists this wheel's own files and hashes".into()),
            "licenses/License.txt" => Some("NVIDIA's wheel carries the license of NVIDIA's binary distribution; ours the source release's License.txt".into()),
            _ => None,
        };
    }
    if path == "nvidia/nvshmem/lib/libnvshmem_device.bc" && kind == OnlyTheirs {
        return o.bitcode_llvm.is_none().then(|| {
            "bitcode library not built (stack option nvshmem.bitcode_llvm unset; it needs clang/LLVM): torch's Triton \
             NVSHMEM kernels load libnvshmem_device.bc and fail without it; DeepEP and torch's host-side NVSHMEM use do not \
             need it"
                .to_string()
        });
    }
    if let Some((option, on)) = plugin_option(path, o) {
        return match (kind, on) {
            (OnlyTheirs, false) => Some(format!(
                "plugin left out: stack option nvshmem.{option} is off"
            )),
            (OnlyOurs, true) => Some(format!(
                "plugin added: stack option nvshmem.{option} is on, NVIDIA's wheel has none"
            )),
            (ContentDiffers, _) => {
                Some("rebuilt from source (our options, architectures and toolchain)".into())
            }
            _ => None,
        };
    }
    if kind == ContentDiffers && path.starts_with("nvidia/nvshmem/lib/") {
        return Some("rebuilt from source (our options, architectures and toolchain)".into());
    }
    if kind == ContentDiffers && path == BUILD_OPTIONS_H {
        let names: BTreeSet<&String> = defs_a.keys().chain(defs_b.keys()).collect();
        let mut reasons = Vec::new();
        for n in names {
            let (x, y) = (
                defs_a.get(n).copied().unwrap_or(false),
                defs_b.get(n).copied().unwrap_or(false),
            );
            if x == y {
                continue;
            }
            if abi.contains(n) {
                return None; // a device-ABI define differs: torch's / DeepEP's device code would disagree
            }
            reasons.push(format!(
                "{n} {} ({})",
                if x { "on" } else { "off" },
                define_reason(n, o)?
            ));
        }
        return Some(format!(
            "device-ABI defines equal; differs in: {}",
            reasons.join("; ")
        ));
    }
    if kind == ContentDiffers && path == VERSION_H {
        let strip = |b: &Vec<u8>| {
            String::from_utf8_lossy(b)
                .lines()
                .filter(|l| !l.contains("NVSHMEM_BUILD_VARS"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        return (strip(ours?) == strip(theirs?))
            .then(|| "only NVSHMEM_BUILD_VARS differs (our options and paths)".into());
    }
    None
}
