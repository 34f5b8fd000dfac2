//! The runtime level: import the stack in the target Python exactly as a user would, then
//! prove from /proc/self/maps and the mapped files themselves that the process holds one
//! libnvshmem_host (ours, built without NCCL) and one libnccl (the pinned version).
//!
//! The Python side (probe.py) only imports, reads maps and asks the mapped NCCL its
//! version through ctypes; everything NVSHMEM says about itself is read by the Rust ELF
//! code from the mapped file.

mod maps;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub use maps::{MappedFile, Role, mapped_files, role_of};

use crate::check::{Check, Status, overall};
use crate::expect::{Expectations, NcclVersion};
use crate::process::{Exit, run_captured};
use commstack_elf::{ElfFile, NvshmemHostInfo};

/// The probe script, run as `python -c PROBE_PY <modules>`: imports.py (a clean import:
/// every warning recorded), then probe.py (what the process mapped).
pub const PROBE_PY: &str = concat!(include_str!("imports.py"), include_str!("probe.py"));
/// One import alone, run as `python -c IMPORT_CHECK_PY <module>` where no GPU is (the
/// image step's `import torch`): the same imports.py as [`PROBE_PY`], then one JSON line
/// (`import`: an [`ImportResult`]; `torch`: its version and CUDA), exit 0 when the import
/// was clean, 3 when it warned, 1 when it failed.
pub const IMPORT_CHECK_PY: &str =
    concat!(include_str!("imports.py"), include_str!("import_check.py"));
const MARK: &str = "@@commstack-probe@@ ";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeOutput {
    pub schema: u32,
    pub python: PythonFacts,
    pub imports: Vec<ImportResult>,
    pub torch: Option<serde_json::Value>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// /proc/self/maps of the probe process after the imports.
    pub maps: String,
    pub nccl: Vec<NcclProbe>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonFacts {
    pub executable: String,
    pub version: String,
    pub prefix: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImportResult {
    pub module: String,
    /// `ok`, `absent` (not installed) or `error`.
    pub status: String,
    pub file: Option<String>,
    pub version: Option<String>,
    pub error: Option<String>,
    /// What the import warned (`Category: message (file:line)`); recorded probes of
    /// older reports have none.
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Warnings Python's default filters hide outside `__main__` (a library's
    /// DeprecationWarning about its own code): reported, not judged.
    #[serde(default)]
    pub hidden_warnings: Vec<String>,
}

/// `ncclGetVersion` of one mapped libnccl, asked through ctypes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NcclProbe {
    pub path: String,
    pub code: Option<i64>,
    pub error: Option<String>,
}

/// Runs the probe in `python` with `extra_env` added to the inherited environment.
pub fn run_probe(
    python: &Path,
    modules: &[String],
    extra_env: &[(String, String)],
    timeout: Duration,
) -> Result<ProbeOutput> {
    let mut cmd = Command::new(python);
    cmd.arg("-c").arg(PROBE_PY).arg(modules.join(","));
    cmd.env("PYTHONUNBUFFERED", "1");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let captured = run_captured(cmd, timeout)
        .with_context(|| format!("running the runtime probe in {}", python.display()))?;
    let line = captured
        .lines
        .iter()
        .find_map(|l| l.text.strip_prefix(MARK));
    match (line, captured.exit) {
        (Some(json), Exit::Code { code: 0 }) => serde_json::from_str(json).with_context(|| {
            format!(
                "the runtime probe in {} printed a report that does not parse",
                python.display()
            )
        }),
        (None, Exit::Code { code: 0 }) => bail!(
            "the runtime probe in {} ended without its report (no {MARK} line)",
            python.display()
        ),
        (_, _) => bail!(captured.failed(&format!("the runtime probe in {}", python.display()))),
    }
}

/// A mapped libnvshmem_host and what its file says.
#[derive(Debug, Clone, Serialize)]
pub struct MappedNvshmem {
    pub path: PathBuf,
    pub deleted: bool,
    pub info: Option<NvshmemHostInfo>,
    pub error: Option<String>,
}

/// A mapped libnccl and its `ncclGetVersion`.
#[derive(Debug, Clone, Serialize)]
pub struct MappedNccl {
    pub path: PathBuf,
    pub code: Option<i64>,
    pub version: Option<NcclVersion>,
    pub error: Option<String>,
}

/// Everything the runtime level found, and its verdicts.
#[derive(Debug, Clone, Serialize)]
pub struct RuntimeFindings {
    pub python: PythonFacts,
    pub imports: Vec<ImportResult>,
    pub torch: Option<serde_json::Value>,
    pub env: BTreeMap<String, String>,
    pub nvshmem_host: Vec<MappedNvshmem>,
    pub nccl: Vec<MappedNccl>,
    pub nvshmem_device: Vec<PathBuf>,
    pub nvshmem_plugins: Vec<PathBuf>,
    pub cudart: Vec<PathBuf>,
    pub checks: Vec<Check>,
}

impl RuntimeFindings {
    pub fn status(&self) -> Status {
        overall(&self.checks)
    }
}

/// Reads the mapped files the probe reported and judges them against `expect`.
pub fn check_runtime(probe: &ProbeOutput, expect: &Expectations) -> RuntimeFindings {
    let mapped = mapped_files(&probe.maps);
    let with_role = |role: Role| -> Vec<&MappedFile> {
        mapped
            .iter()
            .filter(|f| role_of(&f.path) == Some(role))
            .collect()
    };
    let nvshmem_host: Vec<MappedNvshmem> = with_role(Role::NvshmemHost)
        .into_iter()
        .map(|f| {
            let read = ElfFile::open(&f.path).and_then(|e| e.nvshmem_host_info());
            let (info, error) = match read {
                Ok(info) => (Some(info), None),
                Err(e) => (None, Some(e.to_string())),
            };
            MappedNvshmem {
                path: f.path.clone(),
                deleted: f.deleted,
                info,
                error,
            }
        })
        .collect();
    let nccl: Vec<MappedNccl> = with_role(Role::Nccl)
        .into_iter()
        .map(|f| {
            let asked = probe.nccl.iter().find(|n| Path::new(&n.path) == f.path);
            let code = asked.and_then(|n| n.code);
            let error = match asked {
                Some(n) => n.error.clone(),
                None => Some("the probe did not ask this library its version".into()),
            };
            MappedNccl {
                path: f.path.clone(),
                code,
                version: code.and_then(NcclVersion::from_code),
                error,
            }
        })
        .collect();
    let paths = |role| with_role(role).iter().map(|f| f.path.clone()).collect();
    let mut findings = RuntimeFindings {
        python: probe.python.clone(),
        imports: probe.imports.clone(),
        torch: probe.torch.clone(),
        env: probe.env.clone(),
        nvshmem_host,
        nccl,
        nvshmem_device: paths(Role::NvshmemDevice),
        nvshmem_plugins: paths(Role::NvshmemPlugin),
        cudart: paths(Role::Cudart),
        checks: Vec::new(),
    };
    findings.checks = judge(&findings, expect);
    findings
}

fn judge(f: &RuntimeFindings, expect: &Expectations) -> Vec<Check> {
    let mut checks: Vec<Check> = f.imports.iter().map(import_check).collect();
    let all_imported = f.imports.iter().all(|i| i.status == "ok");
    let imported = |m: &str| f.imports.iter().any(|i| i.module == m && i.status == "ok");
    let imported_list: Vec<String> = f
        .imports
        .iter()
        .filter(|i| i.status == "ok")
        .map(|i| format!("import {}", i.module))
        .collect();
    let what_ran = if imported_list.is_empty() {
        "no successful import".to_string()
    } else {
        imported_list.join(", ")
    };
    let nvshmem_expected = expect.nvshmem_version.is_some() || expect.nvshmem_prefix.is_some();

    // One libnvshmem_host.
    match f.nvshmem_host.len() {
        1 => checks.push(Check::pass("nvshmem-host.mapped-once", format!("{}", f.nvshmem_host[0].path.display()))),
        0 if imported("deep_ep") || (all_imported && nvshmem_expected) => checks.push(Check::fail(
            "nvshmem-host.mapped-once",
            format!("no libnvshmem_host is mapped after {what_ran}"),
            "DeepEP V1 links libnvshmem_host: rebuild DeepEP against the stack's NVSHMEM (`cargo xtask build deepep`)",
        )),
        0 => checks.push(Check::not_run(
            "nvshmem-host.mapped-once",
            format!("no libnvshmem_host is mapped after {what_ran}; deep_ep, which loads it, was not imported"),
        )),
        n => checks.push(Check::fail(
            "nvshmem-host.mapped-once",
            format!(
                "{n} libnvshmem_host files are mapped: {}. Device code built against one NVSHMEM then runs with another's host library",
                list(f.nvshmem_host.iter().map(|m| &m.path))
            ),
            "keep one NVSHMEM in the environment: install the commstack drop-in nvidia-nvshmem wheel in place of NVIDIA's, and build DeepEP against that same NVSHMEM",
        )),
    }
    for m in &f.nvshmem_host {
        checks.push(nvshmem_nccl_off(m));
        checks.push(match &expect.nvshmem_prefix {
            Some(prefix) => nvshmem_location(m, prefix),
            None => Check::not_run_fix(
                "nvshmem-host.location",
                format!(
                    "mapped from {}; no expected NVSHMEM location given",
                    m.path.display()
                ),
                "pass --nvshmem-prefix (or verify against a stack lock)",
            ),
        });
        let found = m.info.as_ref().and_then(|i| i.version);
        match expect.nvshmem_version {
            None => checks.push(Check::not_run_fix(
                "nvshmem-host.version",
                format!("NVSHMEM {}; no expected version given", found.map(|v| v.to_string()).unwrap_or_else(|| "?".into())),
                "pass --expect-nvshmem (or verify against a stack lock)",
            )),
            Some(want) => checks.push(match found {
                Some(v) if v == want => Check::pass("nvshmem-host.version", format!("{v}")),
                Some(v) => Check::fail(
                    "nvshmem-host.version",
                    format!("{} is NVSHMEM {v}; the stack expects {want}", m.path.display()),
                    "install the NVSHMEM the lock pins (rebuild with `cargo xtask build nvshmem` and reinstall the drop-in wheel)",
                ),
                None => Check::fail(
                    "nvshmem-host.version",
                    format!("{} carries no `NVSHMEM vX.Y.Z` string; the stack expects {want}", m.path.display()),
                    "this is not an NVSHMEM release build: reinstall the stack's NVSHMEM",
                ),
            }),
        }
    }

    // One libnccl, the pinned one.
    let torch_cuda = f
        .torch
        .as_ref()
        .and_then(|t| t.get("cuda"))
        .is_some_and(|c| !c.is_null());
    match f.nccl.len() {
        1 => checks.push(Check::pass("nccl.mapped-once", format!("{}", f.nccl[0].path.display()))),
        0 if expect.nccl_version.is_some() && imported("torch") && torch_cuda => checks.push(Check::fail(
            "nccl.mapped-once",
            format!("no libnccl.so is mapped after {what_ran}: this torch links NCCL statically or loads it later, so the NCCL in use cannot be proven"),
            "use the torch wheel the lock pins (it links libnccl.so.2 from the nvidia-nccl wheel)",
        )),
        0 => checks.push(Check::not_run(
            "nccl.mapped-once",
            if imported("torch") && !torch_cuda {
                "torch is a CPU build: it maps no NCCL".to_string()
            } else {
                format!("no libnccl.so is mapped after {what_ran}")
            },
        )),
        n => checks.push(Check::fail(
            "nccl.mapped-once",
            format!(
                "{n} libnccl files are mapped: {}. Each was loaded by a different library; collectives and DeepEP may use different NCCLs",
                list(f.nccl.iter().map(|m| &m.path))
            ),
            "keep the NCCL torch pins only: remove the second nvidia-nccl wheel or NCCL override (DeepEP V2 needs NCCL >= 2.30.4: pick a torch that pins it instead), and check LD_LIBRARY_PATH / LD_PRELOAD",
        )),
    }
    for n in &f.nccl {
        checks.push(nccl_version(n, expect.nccl_version));
    }
    checks
}

/// What torch warns at import when numpy is not installed.
pub const NUMPY_MISSING: &str = "Failed to initialize NumPy";
/// The fix for it, said by verify's runtime level and by the image's import step.
pub const NUMPY_MISSING_FIX: &str = "add \"numpy\" to [resolve] extra-requirements in stack.toml (torch's wheel does not require it, nearly every torch user imports it), then `cargo xtask lock` and build again";

/// What to do about warnings at import: the one seen in every torch image without numpy
/// by name, any other by its text.
fn import_warning_fix(warnings: &[String]) -> &'static str {
    if warnings.iter().any(|w| w.contains(NUMPY_MISSING)) {
        NUMPY_MISSING_FIX
    } else {
        "fix what the warning names (a module the import looks for: add it to [resolve] extra-requirements and `cargo xtask lock`; a deprecated setting: change it)"
    }
}

/// The warnings Python hides by default, each distinct one once with its count.
fn hidden_note(hidden: &[String]) -> String {
    if hidden.is_empty() {
        return String::new();
    }
    let mut distinct: Vec<(&String, usize)> = Vec::new();
    for w in hidden {
        match distinct.iter_mut().find(|(d, _)| *d == w) {
            Some((_, n)) => *n += 1,
            None => distinct.push((w, 1)),
        }
    }
    let lines: Vec<String> = distinct
        .iter()
        .map(|(w, n)| format!("\n  ({n}x) {w}"))
        .collect();
    format!(
        "; {} warning(s) Python's default filters hide (not a user's to fix):{}",
        hidden.len(),
        lines.concat()
    )
}

fn import_check(i: &ImportResult) -> Check {
    let name = format!("import.{}", i.module);
    match i.status.as_str() {
        "ok" if !i.warnings.is_empty() => Check::fail(
            &name,
            format!(
                "`import {}` warned {} time(s): a clean import warns of nothing:\n{}",
                i.module,
                i.warnings.len(),
                i.warnings.join("\n")
            ),
            import_warning_fix(&i.warnings),
        ),
        "ok" => Check::pass(
            &name,
            format!(
                "{} {} from {}{}",
                i.module,
                i.version.as_deref().unwrap_or("(no __version__)"),
                i.file.as_deref().unwrap_or("?"),
                hidden_note(&i.hidden_warnings)
            ),
        ),
        "absent" => Check::not_run_fix(
            &name,
            format!(
                "{} is not installed in this environment: the checks below ran without it",
                i.module
            ),
            format!(
                "install the stack's {} wheel (the wheelhouse of `cargo xtask build deepep`) to verify it",
                i.module
            ),
        ),
        _ => Check::fail(
            &name,
            format!(
                "`import {}` failed:\n{}",
                i.module,
                last_lines(i.error.as_deref().unwrap_or(""), 8)
            ),
            "read the traceback above: a missing module or an undefined symbol names what is broken or was built against another version",
        ),
    }
}

fn nvshmem_nccl_off(m: &MappedNvshmem) -> Check {
    const NAME: &str = "nvshmem-host.nccl-off";
    let Some(info) = &m.info else {
        let why = m.error.as_deref().unwrap_or("unreadable");
        let fix = if m.deleted {
            "the file was replaced after it was loaded: run verify again in a fresh environment"
        } else {
            "reinstall the stack's NVSHMEM: this file is not a readable NVSHMEM host library"
        };
        return Check::fail(
            NAME,
            format!("cannot read the mapped {}: {why}", m.path.display()),
            fix,
        );
    };
    let version = info
        .version
        .map(|v| v.to_string())
        .unwrap_or_else(|| "?".into());
    if info.build_vars.use_nccl() == Some(false) {
        return Check::pass(
            NAME,
            format!(
                "NVSHMEM {version}, NVSHMEM_USE_NCCL=OFF ({})",
                m.path.display()
            ),
        );
    }
    let found = info
        .build_vars
        .get(commstack_elf::USE_NCCL)
        .unwrap_or("absent");
    if is_nvidia_wheel(&m.path) {
        let dir = m.path.parent().and_then(Path::parent).unwrap_or(&m.path);
        Check::fail(
            NAME,
            format!(
                "NVIDIA's nvidia-nvshmem wheel is still installed at {}: its libnvshmem_host (NVSHMEM {version}) is built with NVSHMEM_USE_NCCL={found}. torch's libtorch_nvshmem.so loads libnvshmem_host.so.3 by SONAME first, so DeepEP's RUNPATH to our build is never consulted",
                dir.display()
            ),
            "install the commstack drop-in wheel (nvidia-nvshmem-cuXX==<torch's pin>+commstack.*) from the stack's wheelhouse over NVIDIA's: `pip install --no-deps --force-reinstall <wheelhouse>/nvidia_nvshmem_*.whl`",
        )
    } else {
        Check::fail(
            NAME,
            format!(
                "{} (NVSHMEM {version}) is built with NVSHMEM_USE_NCCL={found}",
                m.path.display()
            ),
            "rebuild NVSHMEM with `cargo xtask build nvshmem` (always NVSHMEM_USE_NCCL=OFF) and install it in place of this one",
        )
    }
}

/// NVIDIA's wheel installs into `<site-packages>/nvidia/nvshmem/lib`.
fn is_nvidia_wheel(path: &Path) -> bool {
    let parts: Vec<_> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts
        .windows(3)
        .any(|w| w[0] == "nvidia" && w[1] == "nvshmem" && w[2] == "lib")
}

fn nvshmem_location(m: &MappedNvshmem, prefix: &Path) -> Check {
    const NAME: &str = "nvshmem-host.location";
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    if canon(&m.path).starts_with(canon(prefix)) {
        Check::pass(NAME, format!("inside {}", prefix.display()))
    } else {
        Check::fail(
            NAME,
            format!(
                "the mapped {} is outside the expected NVSHMEM at {}",
                m.path.display(),
                prefix.display()
            ),
            "something loads another libnvshmem_host.so.3 first (torch's libtorch_nvshmem.so by SONAME): install the drop-in wheel so the file at that path is ours",
        )
    }
}

fn nccl_version(n: &MappedNccl, want: Option<NcclVersion>) -> Check {
    const NAME: &str = "nccl.version";
    let (Some(code), Some(found)) = (n.code, n.version) else {
        return Check::fail(
            NAME,
            format!(
                "cannot ask {} its version: {}",
                n.path.display(),
                n.error.as_deref().unwrap_or("no answer")
            ),
            "this is not a usable NCCL: reinstall the nvidia-nccl wheel the lock pins",
        );
    };
    match want {
        Some(w) if w.code() == code => Check::pass(
            NAME,
            format!(
                "ncclGetVersion = {code} ({found}) from {}",
                n.path.display()
            ),
        ),
        Some(w) => Check::fail(
            NAME,
            format!(
                "the loaded NCCL is {found} (ncclGetVersion = {code}) from {}; the stack pins {w} ({})",
                n.path.display(),
                w.code()
            ),
            format!(
                "install nvidia-nccl-cuXX=={w} (torch's pin); if it is installed, something loads another copy first: check LD_LIBRARY_PATH and LD_PRELOAD"
            ),
        ),
        None => Check::not_run_fix(
            NAME,
            format!(
                "ncclGetVersion = {code} ({found}) from {}; no expected version given",
                n.path.display()
            ),
            "pass --expect-nccl (or verify against a stack lock)",
        ),
    }
}

fn list<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> String {
    paths
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
