//! What installing the stack's wheels into an existing environment would do, file by
//! file: which installed files move to the backup (the distribution being replaced, and
//! anything else a new wheel would overwrite) and which files are added. Nothing is
//! changed here; `--dry-run` prints this.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_wheel::{Wheel, parse_record};
use serde::Serialize;

use commstack_deepep::python::{PythonEnv, normalize};
use commstack_deepep::venv::LockedWheel;

/// One wheel to install.
#[derive(Clone, Debug, Serialize)]
pub struct PlanStep {
    pub wheel: LockedWheel,
    /// The installed distribution it replaces: (name, version).
    pub replaces: Option<(String, String)>,
    /// Set when nothing needs doing (the same build is installed).
    pub skip: Option<String>,
    /// Where each file of the wheel goes.
    #[serde(skip)]
    pub targets: Vec<PathBuf>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub python: PathBuf,
    pub prefix: PathBuf,
    pub site_packages: PathBuf,
    pub steps: Vec<PlanStep>,
    /// Files that exist now and move to the backup (restored by undo).
    pub backup: Vec<PathBuf>,
    /// Files the install writes (removed by undo).
    pub added: Vec<PathBuf>,
}

impl Plan {
    pub fn is_noop(&self) -> bool {
        self.steps.iter().all(|s| s.skip.is_some())
    }

    /// For people: one line per wheel, then the file counts.
    /// The plan, with every path it would touch (`--dry-run` shows exactly what moves).
    pub fn render(&self) -> String {
        let mut out = self.render_summary();
        for (what, paths) in [("backup", &self.backup), ("write ", &self.added)] {
            for p in paths {
                out.push_str(&format!("    {what} {}\n", p.display()));
            }
        }
        out
    }

    /// The plan's steps and counts, without the file lists.
    pub fn render_summary(&self) -> String {
        let mut out = String::new();
        for s in &self.steps {
            match (&s.skip, &s.replaces) {
                (Some(why), _) => out.push_str(&format!(
                    "  keep    {} {}: {why}\n",
                    s.wheel.name, s.wheel.version
                )),
                (None, Some((n, v))) => out.push_str(&format!(
                    "  replace {n} {v} -> {} ({})\n",
                    s.wheel.version, s.wheel.filename
                )),
                (None, None) => out.push_str(&format!(
                    "  install {} {} ({})\n",
                    s.wheel.name, s.wheel.version, s.wheel.filename
                )),
            }
        }
        out.push_str(&format!(
            "  {} file(s) move to the backup, {} file(s) are written; `adopt --undo` puts every one back\n",
            self.backup.len(),
            self.added.len()
        ));
        out
    }
}

/// The INSTALLER file written into each dist-info we install.
pub const INSTALLER: &str = "commstack";

/// Plan installing `wheels` into `env`.
pub fn plan(env: &PythonEnv, wheels: &[LockedWheel]) -> Result<Plan> {
    let site = env.site_packages().to_path_buf();
    let owners = other_owners(env, wheels);
    let mut steps = Vec::new();
    let mut backup: BTreeSet<PathBuf> = BTreeSet::new();
    let mut added: BTreeSet<PathBuf> = BTreeSet::new();
    for w in wheels {
        let wheel = Wheel::open(&w.path)?;
        check_tags(&wheel, env)?;
        let targets = targets_of(&wheel, env)?;
        let installed = env.dist(&w.name);
        let replaces = installed.map(|d| (d.name.clone(), d.version.clone()));
        let Some(old_files) = files_replaced(env, &wheel, installed)? else {
            steps.push(PlanStep {
                wheel: w.clone(),
                replaces,
                skip: Some("this exact build is installed".into()),
                targets,
            });
            continue;
        };
        for f in old_files {
            if owners.contains_key(&f) {
                continue; // shared with another distribution: stays
            }
            if fs::symlink_metadata(&f).is_ok() {
                backup.insert(f);
            }
        }
        for t in &targets {
            if let Some(owner) = owners.get(t) {
                bail!(
                    "{} would overwrite {}, which {owner} owns: refusing to adopt",
                    w.filename,
                    t.display()
                );
            }
            if fs::symlink_metadata(t).is_ok() {
                backup.insert(t.clone()); // an unowned leftover: kept for undo
            }
            if !added.insert(t.clone()) {
                bail!("two of the wheels to install write {}", t.display());
            }
        }
        steps.push(PlanStep {
            wheel: w.clone(),
            replaces,
            skip: None,
            targets,
        });
    }
    add_bytecode(&mut backup, &owners);
    check_contained(env, backup.iter().chain(&added))?;
    Ok(Plan {
        python: env.python.clone(),
        prefix: env.prefix.clone(),
        site_packages: site,
        steps,
        backup: backup.into_iter().collect(),
        added: added.into_iter().collect(),
    })
}

/// Which files other distributions own (those `wheels` do not replace): a new wheel must
/// not overwrite them, and the replaced distribution's files that they also own stay.
fn other_owners(env: &PythonEnv, wheels: &[LockedWheel]) -> BTreeMap<PathBuf, String> {
    let replaced_names: BTreeSet<String> = wheels.iter().map(|w| normalize(&w.name)).collect();
    let mut owners: BTreeMap<PathBuf, String> = BTreeMap::new();
    for d in &env.dists {
        if replaced_names.contains(&normalize(&d.name)) {
            continue;
        }
        if let Some(info) = &d.dist_info {
            // Entries outside the environment are never touched, so they own nothing here.
            let inside = record_entries(info, &env.prefix).map(|(inside, _)| inside);
            for f in inside.unwrap_or_default() {
                owners.insert(f, d.name.clone());
            }
        }
    }
    owners
}

/// The files of the installed distribution `installed` that `wheel` replaces (none when
/// nothing is installed); None when this exact build is installed already.
fn files_replaced(
    env: &PythonEnv,
    wheel: &Wheel,
    installed: Option<&commstack_deepep::python::Dist>,
) -> Result<Option<Vec<PathBuf>>> {
    let mut old_files: Vec<PathBuf> = Vec::new();
    if let Some(d) = installed {
        let info = d.dist_info.as_ref().with_context(|| {
            format!(
                "{} {} is installed without a .dist-info directory: remove it by hand first",
                d.name, d.version
            )
        })?;
        if same_build(info, wheel)? {
            return Ok(None);
        }
        old_files = record_files(info, &env.prefix)
            .with_context(|| format!("{} {} cannot be replaced safely", d.name, d.version))?;
        // Files in the dist-info that RECORD does not list (INSTALLER, REQUESTED, ...).
        for e in walkdir::WalkDir::new(info)
            .into_iter()
            .filter_map(|e| e.ok())
        {
            if !e.file_type().is_dir() {
                old_files.push(e.path().to_path_buf());
            }
        }
    }
    Ok(Some(old_files))
}

/// Bytecode Python cached for the modules being replaced goes with them (undo removes
/// the new modules' caches, so the old ones must be in the backup to come back).
fn add_bytecode(backup: &mut BTreeSet<PathBuf>, owners: &BTreeMap<PathBuf, String>) {
    let sources: Vec<PathBuf> = backup
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "py"))
        .cloned()
        .collect();
    for py in sources {
        for pyc in bytecode_of(&py) {
            if !owners.contains_key(&pyc) {
                backup.insert(pyc);
            }
        }
    }
}

/// Every path adopt touches is inside the environment: what the wheels write comes from
/// their own entry names, so the same containment as an install's.
fn check_contained<'a>(env: &PythonEnv, paths: impl Iterator<Item = &'a PathBuf>) -> Result<()> {
    for p in paths {
        let rel = p.strip_prefix(&env.prefix).map_err(|_| {
            anyhow::anyhow!(
                "adopt would touch {}, outside the environment {}: refusing",
                p.display(),
                env.prefix.display()
            )
        })?;
        contained(&env.prefix, &rel.to_string_lossy(), &env.prefix).map_err(|why| {
            anyhow::anyhow!("adopt would touch {}, which {why}: refusing", p.display())
        })?;
    }
    Ok(())
}

/// The wheel must run here: a `cpXY` wheel on Python X.Y (or a py3 one).
fn check_tags(wheel: &Wheel, env: &PythonEnv) -> Result<()> {
    let tag = env.python_tag();
    let ok = wheel
        .filename
        .python
        .iter()
        .any(|p| *p == tag || p == "py3" || p == "py2.py3");
    if !ok {
        bail!(
            "{} is built for {}, this environment is Python {} ({tag})",
            wheel.path.display(),
            wheel.filename.python.join("."),
            env.version
        );
    }
    Ok(())
}

/// Every file the wheel installs, where it lands in `env`, plus the INSTALLER we write.
pub fn targets_of(wheel: &Wheel, env: &PythonEnv) -> Result<Vec<PathBuf>> {
    let root = if wheel.root_is_purelib() {
        &env.paths.purelib
    } else {
        &env.paths.platlib
    };
    let data_dir = format!("{}.data/", wheel.dist_info.trim_end_matches(".dist-info"));
    let mut out = Vec::new();
    for e in wheel.entries.iter().filter(|e| !e.is_dir) {
        let target = match e.path.strip_prefix(&data_dir) {
            None => root.join(&e.path),
            Some(rest) => {
                let (scheme, path) = rest.split_once('/').with_context(|| {
                    format!("{}: bad .data entry {}", wheel.path.display(), e.path)
                })?;
                let base = match scheme {
                    "purelib" => &env.paths.purelib,
                    "platlib" => &env.paths.platlib,
                    "scripts" => &env.paths.scripts,
                    "data" => &env.paths.data,
                    "headers" => &env.paths.include,
                    other => bail!("{}: unknown install scheme {other:?}", wheel.path.display()),
                };
                base.join(path)
            }
        };
        out.push(clean(&target));
    }
    out.push(clean(&root.join(&wheel.dist_info).join("INSTALLER")));
    Ok(out)
}

/// The files a distribution's RECORD lists, as absolute paths, all inside `prefix` (the
/// environment's sys.prefix: scripts may sit beside site-packages, in `bin/`). An entry
/// that is absolute or leads outside (`../../../../x`), lexically or through a symlinked
/// directory, is an error naming it: adopt moves what RECORD lists, and pip itself leaves
/// such entries alone.
pub fn record_files(dist_info: &Path, prefix: &Path) -> Result<Vec<PathBuf>> {
    let (inside, outside) = record_entries(dist_info, prefix)?;
    if let Some((entry, why)) = outside.first() {
        bail!(
            "{}: entry {entry:?} {why}, outside the environment {}: refusing to move or remove it ({} such entr{}); fix or remove the entry, or reinstall that distribution with pip",
            dist_info.join("RECORD").display(),
            prefix.display(),
            outside.len(),
            if outside.len() == 1 { "y" } else { "ies" }
        );
    }
    Ok(inside)
}

/// A RECORD entry that leads outside the environment, and why.
type Outside = (String, String);

/// RECORD's entries split into the paths inside `prefix` and the (entry, why) outside.
fn record_entries(dist_info: &Path, prefix: &Path) -> Result<(Vec<PathBuf>, Vec<Outside>)> {
    let record = dist_info.join("RECORD");
    let bytes = fs::read(&record).with_context(|| format!("cannot read {}", record.display()))?;
    let site = dist_info
        .parent()
        .context("a dist-info directory has a parent")?;
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for e in parse_record(&bytes)? {
        match contained(site, &e.path, prefix) {
            Ok(path) => inside.push(path),
            Err(why) => outside.push((e.path, why)),
        }
    }
    Ok((inside, outside))
}

/// `base/entry` if it stays inside `prefix`, lexically and once existing symlinks in its
/// directory are resolved; else why not.
fn contained(base: &Path, entry: &str, prefix: &Path) -> Result<PathBuf, String> {
    if Path::new(entry).is_absolute() {
        return Err("is an absolute path".into());
    }
    let prefix = clean(prefix);
    let path = clean(&base.join(entry));
    if path == prefix || !path.starts_with(&prefix) {
        return Err(format!("resolves to {}", path.display()));
    }
    // Resolve the deepest ancestor that exists (directories may be created later, under
    // it): a symlinked directory anywhere above the file must stay inside too.
    let real_prefix = prefix.canonicalize().unwrap_or_else(|_| prefix.clone());
    let existing = path
        .ancestors()
        .skip(1)
        .find(|a| a.symlink_metadata().is_ok())
        .unwrap_or(&prefix);
    if let Ok(real) = existing.canonicalize()
        && !real.starts_with(&real_prefix)
    {
        return Err(format!(
            "lies under {}, which leads to {}",
            existing.display(),
            real.display()
        ));
    }
    Ok(path)
}

/// Whether the installed distribution's RECORD holds the wheel's files with its hashes.
fn same_build(dist_info: &Path, wheel: &Wheel) -> Result<bool> {
    let Ok(bytes) = fs::read(dist_info.join("RECORD")) else {
        return Ok(false);
    };
    let Ok(installed) = parse_record(&bytes) else {
        return Ok(false);
    };
    let keep = |p: &str| {
        !(p.ends_with("/RECORD")
            || p.ends_with("/INSTALLER")
            || p.ends_with("/REQUESTED")
            || p.ends_with(".pyc"))
    };
    let mut a: Vec<(String, Option<String>)> = installed
        .into_iter()
        .filter(|e| keep(&e.path) && e.hash.is_some())
        .map(|e| (e.path, e.hash))
        .collect();
    let mut b: Vec<(String, Option<String>)> = wheel
        .record
        .iter()
        .filter(|e| keep(&e.path) && e.hash.is_some())
        .map(|e| (e.path.clone(), e.hash.clone()))
        .collect();
    a.sort();
    b.sort();
    Ok(a == b)
}

/// The cached bytecode of a `.py` file: `<dir>/__pycache__/<stem>.<tag>.pyc` (and
/// `.opt-N.pyc`).
pub fn bytecode_of(py: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(stem)) = (py.parent(), py.file_stem()) else {
        return Vec::new();
    };
    if py.extension().is_none_or(|e| e != "py") {
        return Vec::new();
    }
    let prefix = format!("{}.", stem.to_string_lossy());
    let Ok(entries) = fs::read_dir(dir.join("__pycache__")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(&prefix) && n.ends_with(".pyc") && n[prefix.len()..].contains('.')
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// Lexically normalise `a/b/../c` (RECORD paths climb out of site-packages to `bin/`).
pub fn clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
