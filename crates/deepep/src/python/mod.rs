//! What a Python environment holds: the interpreter, its install paths, every installed
//! distribution, torch's version, CUDA and pins (read from `torch/version.py` and its
//! metadata, without importing torch). One small probe (probe.py), run with a clean
//! environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use commstack_stack::Pin;
use pep440_rs::Operator;
use pep508_rs::{Requirement, VersionOrUrl};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::run::{output, tool_env};

pub const PROBE_PY: &str = include_str!("probe.py");
const MARK: &str = "@@commstack-env@@ ";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Paths {
    pub purelib: PathBuf,
    pub platlib: PathBuf,
    pub scripts: PathBuf,
    pub data: PathBuf,
    pub include: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// As its METADATA writes it.
    pub name: String,
    pub version: String,
    /// The `.dist-info` directory (None for distributions found another way).
    pub dist_info: Option<PathBuf>,
    #[serde(default)]
    pub requires: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TorchVersionPy {
    pub path: PathBuf,
    #[serde(default)]
    pub version: Option<String>,
    /// `torch.version.cuda`, e.g. "13.0"; None for a CPU build.
    #[serde(default)]
    pub cuda: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// The probe's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PythonEnv {
    pub schema: u32,
    /// The interpreter as given (not resolved: a venv's python is a symlink to the base one).
    #[serde(default)]
    pub python: PathBuf,
    pub executable: PathBuf,
    /// `3.12.3`
    pub version: String,
    pub implementation: String,
    pub prefix: PathBuf,
    pub base_prefix: PathBuf,
    pub sys_path: Vec<PathBuf>,
    pub paths: Paths,
    pub dists: Vec<Dist>,
    pub torch: Option<TorchVersionPy>,
    pub pip: bool,
}

/// PEP 503 normalisation (`Deep_EP` -> `deep-ep`).
pub fn normalize(name: &str) -> String {
    commstack_wheel::normalize_name(name)
}

impl PythonEnv {
    /// Run the probe in `python`.
    pub fn probe(python: &Path) -> Result<PythonEnv> {
        let home = std::env::temp_dir();
        let out = output(python, &["-I", "-c", PROBE_PY], &tool_env(&home)).with_context(|| {
            format!(
                "cannot probe the Python environment of {}",
                python.display()
            )
        })?;
        let json = out
            .lines()
            .find_map(|l| l.strip_prefix(MARK))
            .with_context(|| {
                format!(
                    "{} printed no probe report: is it a CPython >= 3.9?",
                    python.display()
                )
            })?;
        let mut env: PythonEnv = serde_json::from_str(json)
            .with_context(|| format!("the probe report of {} does not parse", python.display()))?;
        // Absolute but not resolved: a venv's python is a symlink to the base interpreter.
        env.python = std::path::absolute(python).unwrap_or_else(|_| python.to_path_buf());
        if env.implementation != "cpython" {
            bail!(
                "{} is {}, not CPython: the stack's wheels are built for CPython",
                python.display(),
                env.implementation
            );
        }
        Ok(env)
    }

    /// The first distribution of this name on sys.path (the one Python would use).
    pub fn dist(&self, name: &str) -> Option<&Dist> {
        let want = normalize(name);
        self.dists.iter().find(|d| normalize(&d.name) == want)
    }

    /// Names installed more than once along sys.path (the later copies are shadowed).
    pub fn duplicates(&self) -> Vec<String> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for d in &self.dists {
            *seen.entry(normalize(&d.name)).or_default() += 1;
        }
        seen.into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(k, _)| k)
            .collect()
    }

    /// `cp312`
    pub fn python_tag(&self) -> String {
        let mut it = self.version.split('.');
        format!("cp{}{}", it.next().unwrap_or("3"), it.next().unwrap_or("0"))
    }

    /// `3.12`
    pub fn minor(&self) -> String {
        self.version
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    }

    pub fn site_packages(&self) -> &Path {
        &self.paths.purelib
    }

    /// The `bin` directory holding this interpreter (the venv's, not the base one's).
    pub fn bin_dir(&self) -> PathBuf {
        self.python
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| self.paths.scripts.clone())
    }

    /// torch's installed version (`2.11.0+cu130`).
    pub fn torch_version(&self) -> Option<&str> {
        self.dist("torch").map(|d| d.version.as_str())
    }

    /// `torch.version.cuda`.
    pub fn torch_cuda(&self) -> Option<&str> {
        self.torch.as_ref().and_then(|t| t.cuda.as_deref())
    }

    /// torch's exact pin (`==X`) of a distribution whose name starts with `prefix`
    /// (`nvidia-nccl-cu`), from its Requires-Dist.
    pub fn torch_pin(&self, prefix: &str) -> Option<Pin> {
        let torch = self.dist("torch")?;
        torch.requires.iter().find_map(|r| exact_pin(r, prefix))
    }

    /// The sha256 of torch's RECORD: which exact files this torch is (two builds of one
    /// version differ here).
    pub fn torch_record_sha256(&self) -> Option<String> {
        let info = self.dist("torch")?.dist_info.as_ref()?;
        let bytes = std::fs::read(info.join("RECORD")).ok()?;
        Some(hex::encode(Sha256::digest(bytes)))
    }

    /// What keys a build made in this environment: the interpreter and torch, exactly.
    pub fn identity(&self) -> serde_json::Value {
        serde_json::json!({
            "python": self.version,
            "torch": self.torch_version(),
            "torch_cuda": self.torch_cuda(),
            "torch_record_sha256": self.torch_record_sha256(),
        })
    }
}

/// `nvidia-nccl-cu13==2.28.9; platform_system == "Linux"` -> `nvidia-nccl-cu13==2.28.9`
/// when the name starts with `prefix` and the requirement is one `==` pin.
pub fn exact_pin(requirement: &str, prefix: &str) -> Option<Pin> {
    let req: Requirement = Requirement::from_str(requirement).ok()?;
    let name = req.name.to_string();
    if !name.starts_with(prefix) {
        return None;
    }
    let Some(VersionOrUrl::VersionSpecifier(specs)) = &req.version_or_url else {
        return None;
    };
    let mut it = specs.iter();
    let spec = it.next()?;
    if it.next().is_some() || *spec.operator() != Operator::Equal {
        return None;
    }
    Some(Pin::new(name, spec.version().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_pins_are_read_from_requires_dist() {
        let pin = exact_pin(
            r#"nvidia-nccl-cu13==2.28.9; platform_system == "Linux""#,
            "nvidia-nccl-cu",
        )
        .unwrap();
        assert_eq!(
            (pin.name.as_str(), pin.version.to_string().as_str()),
            ("nvidia-nccl-cu13", "2.28.9")
        );
        assert!(exact_pin("nvidia-nccl-cu13>=2.28", "nvidia-nccl-cu").is_none());
        assert!(exact_pin("filelock", "nvidia-nccl-cu").is_none());
    }

    #[test]
    fn probes_this_machines_python() {
        let env = PythonEnv::probe(Path::new("python3")).unwrap();
        assert!(env.version.starts_with("3."));
        assert!(env.python_tag().starts_with("cp3"));
        assert!(env.paths.purelib.is_absolute());
        assert!(env.dists.iter().all(|d| !d.name.is_empty()));
    }
}
