//! The managed mode's build environment: a venv made from the lock, in a store step.
//!
//! `python -m venv`, then `pip install --no-index --no-deps --require-hashes -r
//! requirements.txt` from the fetched wheels (the lock's target closure, NVIDIA's NVSHMEM
//! replaced by the stack's drop-in): torch imports as it will at run time, and nothing
//! else is in it. Keyed by every wheel's sha256 and the base interpreter.
//!
//! Step layout (`<store>/steps/deepep-venv-<hash>/`):
//! ```text
//! venv/                  the environment (scripts point at this final path)
//! requirements.txt       what was installed, hash-pinned
//! venv.json              base interpreter, pip version, the installed set
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_fetch::Cache;
use commstack_stack::Lock;
use commstack_store::{Outcome, StepKey, Store};
use serde::{Deserialize, Serialize};

use crate::python::{PythonEnv, normalize};
use crate::run::{output, run_logged, tool_env};

const STEP: &str = "deepep-venv";
pub const RECIPE: &str = "deepep-venv-1";
pub const VENV_FILE: &str = "venv.json";

/// One wheel file, pinned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockedWheel {
    pub name: String,
    pub version: String,
    pub filename: String,
    pub sha256: String,
    /// Where the verified file is (the fetch cache, a store step).
    pub path: PathBuf,
}

impl LockedWheel {
    /// A wheel file on disk, hashed here (the stack's own builds).
    pub fn from_file(path: &Path) -> Result<LockedWheel> {
        let wheel = commstack_wheel::Wheel::open(path)?;
        let sha256 = commstack_digest::sha256_file(path)
            .with_context(|| format!("cannot hash {}", path.display()))?;
        Ok(LockedWheel {
            name: normalize(wheel.name()),
            version: wheel.version()?.to_string(),
            filename: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            sha256,
            path: path.to_path_buf(),
        })
    }

    /// `name==version --hash=sha256:...`, what `--require-hashes` accepts.
    pub fn requirement_line(&self) -> String {
        format!(
            "{}=={} \\\n    --hash=sha256:{}\n",
            self.name, self.version, self.sha256
        )
    }
}

/// The target environment's wheels: the lock's packages from the fetch cache (the
/// replaced ones left out) plus the stack's own `extra` wheels (the NVSHMEM drop-in).
/// Fails listing every wheel not fetched yet.
pub fn runtime_wheels(
    lock: &Lock,
    cache: &Cache,
    extra: &[LockedWheel],
) -> Result<Vec<LockedWheel>> {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    for w in &lock.packages {
        if w.replaced_by.is_some() {
            continue;
        }
        match cache
            .get(&w.sha256, &w.filename)
            .with_context(|| format!("cannot read the cache {}", cache.root().display()))?
        {
            Some(path) => out.push(LockedWheel {
                name: normalize(&w.name),
                version: w.version.clone(),
                filename: w.filename.clone(),
                sha256: w.sha256.clone(),
                path,
            }),
            None => missing.push(w.filename.clone()),
        }
    }
    if !missing.is_empty() {
        bail!(
            "{} locked wheel(s) are not in the download cache {}: {}. Run `cargo xtask fetch` first",
            missing.len(),
            cache.root().display(),
            missing.join(", ")
        );
    }
    for e in extra {
        if let Some(clash) = out.iter().find(|w| w.name == e.name) {
            bail!(
                "{} is both in the lock ({}) and one of the stack's own wheels ({}): mark it replaced in the lock",
                e.name,
                clash.filename,
                e.filename
            );
        }
        out.push(e.clone());
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The requirements file of a set of wheels (sorted, hash-pinned).
pub fn requirements_txt(header: &str, wheels: &[LockedWheel]) -> String {
    let mut sorted: Vec<&LockedWheel> = wheels.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::from(header);
    for w in sorted {
        out.push_str(&w.requirement_line());
    }
    out
}

/// `venv.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VenvReport {
    pub schema: u32,
    pub base_python: PathBuf,
    pub base_version: String,
    pub pip: String,
    pub wheels: Vec<LockedWheel>,
    pub install_seconds: f64,
}

/// A managed venv and whether this call made it.
#[derive(Debug)]
pub struct ManagedVenv {
    pub python: PathBuf,
    pub step: PathBuf,
    pub key: StepKey,
    pub outcome: Outcome,
    pub report: VenvReport,
}

/// The version the base interpreter reports (`3.12.3`).
pub fn interpreter_version(python: &Path) -> Result<String> {
    let out = output(
        python,
        &[
            "-I",
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3])",
        ],
        &tool_env(&std::env::temp_dir()),
    )?;
    Ok(out.trim().to_string())
}

/// Make (or find) the venv of `wheels` from `base_python`, whose minor version must be
/// `python_minor` (the lock's target).
pub fn managed_venv(
    store: &Store,
    base_python: &Path,
    python_minor: &str,
    wheels: &[LockedWheel],
    force: bool,
) -> Result<ManagedVenv> {
    let base = base_python
        .canonicalize()
        .with_context(|| format!("no Python interpreter at {}", base_python.display()))?;
    let base_version = interpreter_version(&base)?;
    if !base_version.starts_with(&format!("{python_minor}.")) {
        bail!(
            "{} is Python {base_version}, the lock's target is Python {python_minor}: pass --base-python with a {python_minor} interpreter",
            base.display()
        );
    }
    let mut pins: Vec<serde_json::Value> = wheels
        .iter()
        .map(|w| serde_json::json!({ "name": w.name, "version": w.version, "sha256": w.sha256 }))
        .collect();
    pins.sort_by_key(|p| p["name"].as_str().unwrap_or_default().to_string());
    let inputs = serde_json::json!({
        "recipe": RECIPE,
        "base_python": { "path": base, "version": base_version },
        "wheels": pins,
    });
    let key = StepKey::new(STEP, &inputs);
    let outcome = store.run(&key, &inputs, force, |dir| {
        let report = make_venv(
            &dir.out,
            &dir.final_path,
            &dir.logs,
            &base,
            &base_version,
            wheels,
        )?;
        let path = dir.out.join(VENV_FILE);
        fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    })?;
    let step = outcome.path().to_path_buf();
    let report_path = step.join(VENV_FILE);
    let report: VenvReport = serde_json::from_str(
        &fs::read_to_string(&report_path)
            .with_context(|| format!("cannot read {}", report_path.display()))?,
    )
    .with_context(|| format!("{} is not a venv report", report_path.display()))?;
    Ok(ManagedVenv {
        python: step.join("venv/bin/python"),
        step,
        key,
        outcome,
        report,
    })
}

fn make_venv(
    out: &Path,
    final_path: &Path,
    logs: &Path,
    base: &Path,
    base_version: &str,
    wheels: &[LockedWheel],
) -> Result<VenvReport> {
    // Commands run elsewhere than this process: every path absolute (the store may be relative).
    let (out, final_path, logs) = (
        std::path::absolute(out)?,
        std::path::absolute(final_path)?,
        std::path::absolute(logs)?,
    );
    let (out, final_path, logs) = (out.as_path(), final_path.as_path(), logs.as_path());
    let work = out.join("work");
    let links = work.join("wheels");
    let home = work.join("home");
    fs::create_dir_all(&links)?;
    fs::create_dir_all(&home)?;
    for w in wheels {
        // A damaged cache file is quarantined so that the next fetch downloads it again.
        commstack_fetch::check_cached_file(&w.path, &w.sha256).map_err(anyhow::Error::msg)?;
        std::os::unix::fs::symlink(std::path::absolute(&w.path)?, links.join(&w.filename))
            .with_context(|| format!("cannot link {} into {}", w.filename, links.display()))?;
    }
    let req = out.join("requirements.txt");
    fs::write(
        &req,
        requirements_txt(
            "# The managed DeepEP build environment: the lock's closure with the stack's own wheels.\n",
            wheels,
        ),
    )?;
    let env = tool_env(&home);
    let venv = out.join("venv");
    let log = logs.join("venv.log");
    run_logged(
        base,
        &["-m".into(), "venv".into(), venv.display().to_string()],
        out,
        &env,
        &log,
        "python -m venv",
        None,
    )?;
    let python = venv.join("bin/python");
    let pip_version = output(&python, &["-m", "pip", "--version"], &env)
        .context("the new venv has no working pip (python -m ensurepip is part of CPython; Debian splits it into python3-venv)")?;
    let args: Vec<String> = [
        "-m",
        "pip",
        "install",
        "--no-index",
        "--no-deps",
        "--require-hashes",
        "--no-compile",
        "--no-cache-dir",
        "--find-links",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        links.display().to_string(),
        "-r".into(),
        req.display().to_string(),
    ])
    .collect();
    let seconds = run_logged(
        &python,
        &args,
        out,
        &env,
        &log,
        "pip install -r requirements.txt",
        None,
    )?;
    check_installed(&python, wheels)?;
    relocate_scripts(&venv.join("bin"), out, final_path)?;
    fs::remove_dir_all(&work).with_context(|| format!("cannot remove {}", work.display()))?;
    Ok(VenvReport {
        schema: 1,
        base_python: base.to_path_buf(),
        base_version: base_version.to_string(),
        pip: pip_version
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string(),
        wheels: wheels.to_vec(),
        install_seconds: seconds,
    })
}

/// The venv holds exactly the wheels asked for (plus what `venv` itself installs: pip).
fn check_installed(python: &Path, wheels: &[LockedWheel]) -> Result<()> {
    let env = PythonEnv::probe(python)?;
    let installed: BTreeMap<String, String> = env
        .dists
        .iter()
        .map(|d| (normalize(&d.name), d.version.clone()))
        .collect();
    let mut problems = Vec::new();
    for w in wheels {
        match installed.get(&w.name) {
            Some(v) if pep440_eq(v, &w.version) => {}
            Some(v) => problems.push(format!("{} is {v}, not {}", w.name, w.version)),
            None => problems.push(format!("{} {} is not installed", w.name, w.version)),
        }
    }
    for name in installed.keys() {
        if !wheels.iter().any(|w| &w.name == name) && !matches!(name.as_str(), "pip" | "setuptools")
        {
            problems.push(format!("{name} was installed but not asked for"));
        }
    }
    if !problems.is_empty() {
        bail!(
            "the managed venv is not what the lock says: {}",
            problems.join("; ")
        );
    }
    Ok(())
}

fn pep440_eq(a: &str, b: &str) -> bool {
    match (
        a.parse::<pep440_rs::Version>(),
        b.parse::<pep440_rs::Version>(),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Scripts pip wrote carry the temporary path in their `#!` line (and `activate` in
/// VIRTUAL_ENV): point them at the step's final path, so the venv works once sealed.
fn relocate_scripts(bin: &Path, tmp: &Path, final_path: &Path) -> Result<()> {
    let (from, to) = (tmp.display().to_string(), final_path.display().to_string());
    for entry in fs::read_dir(bin).with_context(|| format!("cannot read {}", bin.display()))? {
        let path = entry?.path();
        if path.is_symlink() || !path.is_file() {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        }; // binaries
        if text.contains(&from) {
            fs::write(&path, text.replace(&from, &to))
                .with_context(|| format!("cannot rewrite {}", path.display()))?;
        }
    }
    Ok(())
}
