//! Applying a [`Plan`] with a backup, and undoing it exactly.
//!
//! Backups live outside the environment, one generation per apply:
//! ```text
//! <home>/adopt/<env-id>/
//!   gen-0001/manifest.json   what moved where, what was added, the state
//!   gen-0001/files/N         the moved files, byte for byte (mode kept; symlinks as links)
//!   undone/gen-0001-<time>/  generations already undone (kept as a record)
//! ```
//! The manifest is written before anything changes (state `applying`); a failed apply is
//! rolled back at once, and a crash mid-way is rolled back by `adopt --undo`.

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_wheel::{InstallLayout, install, record_hash};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plan::{INSTALLER, Plan, PlanStep};
use commstack_deepep::python::PythonEnv;

pub const MANIFEST: &str = "manifest.json";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Applying,
    Applied,
}

/// One file moved to the backup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moved {
    pub path: PathBuf,
    /// File name under `files/`.
    pub backup: String,
    /// Regular files: sha256 and mode. Symlinks: the target.
    pub sha256: Option<String>,
    pub mode: Option<u32>,
    pub symlink: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub python: PathBuf,
    pub prefix: PathBuf,
    pub created: String,
    pub state: State,
    pub moved: Vec<Moved>,
    pub added: Vec<PathBuf>,
    /// Directories the install created (removed by undo when empty).
    pub created_dirs: Vec<PathBuf>,
    /// What was installed: (name, version, file).
    pub installed: Vec<(String, String, String)>,
    pub replaced: Vec<(String, String)>,
}

/// `<home>/adopt/<env-id>`: one directory per environment (by its resolved prefix).
pub fn env_dir(home: &Path, env: &PythonEnv) -> PathBuf {
    let prefix = env
        .prefix
        .canonicalize()
        .unwrap_or_else(|_| env.prefix.clone());
    let hash = hex::encode(Sha256::digest(prefix.as_os_str().as_encoded_bytes()));
    home.join("adopt").join(format!("env-{}", &hash[..16]))
}

/// The generations not undone yet, oldest first.
pub fn generations(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = match fs::read_dir(root) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("gen-"))
                    && p.join(MANIFEST).is_file()
            })
            .collect(),
        Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", root.display())),
    };
    out.sort();
    Ok(out)
}

fn read_manifest(gen_dir: &Path) -> Result<Manifest> {
    let path = gen_dir.join(MANIFEST);
    serde_json::from_str(
        &fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?,
    )
    .with_context(|| format!("{} is not an adopt backup manifest", path.display()))
}

fn write_manifest(gen_dir: &Path, m: &Manifest) -> Result<()> {
    let path = gen_dir.join(MANIFEST);
    let tmp = gen_dir.join(".manifest.json.tmp");
    fs::write(&tmp, serde_json::to_string_pretty(m)?)?;
    fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
}

/// Apply `plan` to `env`, keeping the backup under `root`. Returns the generation dir.
pub fn apply(plan: &Plan, env: &PythonEnv, root: &Path) -> Result<PathBuf> {
    for g in generations(root)? {
        if read_manifest(&g)?.state == State::Applying {
            bail!(
                "a previous adopt of this environment did not finish ({}): run `cargo xtask adopt --python {} --undo` first",
                g.display(),
                env.python.display()
            );
        }
    }
    let n = generations(root)?.len() + 1;
    let gen_dir = root.join(format!("gen-{n:04}"));
    let files = gen_dir.join("files");
    fs::create_dir_all(&files).with_context(|| format!("cannot create {}", files.display()))?;

    let steps: Vec<&PlanStep> = plan.steps.iter().filter(|s| s.skip.is_none()).collect();
    let mut manifest = new_manifest(plan, env, &steps);
    record_moved(&mut manifest)?;
    write_manifest(&gen_dir, &manifest)?;

    let result = change_env(plan, env, &manifest, &steps, &files);
    if let Err(err) = result {
        return match undo_generation(&gen_dir) {
            Ok(()) => {
                let kept = retire(root, &gen_dir, "failed");
                Err(err.context(format!(
                    "adopt failed; the environment was restored from the backup (record kept in {})",
                    kept.as_deref().unwrap_or(&gen_dir).display()
                )))
            }
            Err(undo_err) => Err(err.context(format!(
                "adopt failed, and restoring the backup in {} failed too: {undo_err:#}. Run `adopt --undo` again once the cause is fixed",
                gen_dir.display()
            ))),
        };
    }
    manifest.state = State::Applied;
    write_manifest(&gen_dir, &manifest)?;
    Ok(gen_dir)
}

/// The directories the added files need that do not exist yet (undo removes them).
fn dirs_to_create(plan: &Plan) -> Vec<PathBuf> {
    let mut created_dirs = Vec::new();
    for t in &plan.added {
        let mut missing = Vec::new();
        let mut d = t.parent();
        while let Some(dir) = d {
            if dir.exists() {
                break;
            }
            missing.push(dir.to_path_buf());
            d = dir.parent();
        }
        for m in missing {
            if !created_dirs.contains(&m) {
                created_dirs.push(m);
            }
        }
    }
    created_dirs
}

/// The generation's manifest before anything moves: state Applying.
fn new_manifest(plan: &Plan, env: &PythonEnv, steps: &[&PlanStep]) -> Manifest {
    Manifest {
        schema: 1,
        python: env.python.clone(),
        prefix: env.prefix.clone(),
        created: jiff::Timestamp::now().to_string(),
        state: State::Applying,
        moved: plan
            .backup
            .iter()
            .enumerate()
            .map(|(i, p)| Moved {
                path: p.clone(),
                backup: format!("{i:05}"),
                sha256: None,
                mode: None,
                symlink: None,
            })
            .collect(),
        added: plan.added.clone(),
        created_dirs: dirs_to_create(plan),
        installed: steps
            .iter()
            .map(|s| {
                (
                    s.wheel.name.clone(),
                    s.wheel.version.clone(),
                    s.wheel.filename.clone(),
                )
            })
            .collect(),
        replaced: steps.iter().filter_map(|s| s.replaces.clone()).collect(),
    }
}

/// Record what each file is before moving it, so undo can prove it restored it.
fn record_moved(manifest: &mut Manifest) -> Result<()> {
    for m in &mut manifest.moved {
        let meta = fs::symlink_metadata(&m.path)
            .with_context(|| format!("cannot read {}", m.path.display()))?;
        if meta.file_type().is_symlink() {
            m.symlink = Some(fs::read_link(&m.path)?);
        } else {
            m.sha256 = Some(commstack_digest::sha256_file(&m.path)?);
            m.mode = Some(meta.permissions().mode() & 0o7777);
        }
    }
    Ok(())
}

/// Move the backed-up files away and install the plan's wheels.
fn change_env(
    plan: &Plan,
    env: &PythonEnv,
    manifest: &Manifest,
    steps: &[&PlanStep],
    files: &Path,
) -> Result<()> {
    for m in &manifest.moved {
        move_file(&m.path, &files.join(&m.backup))?;
    }
    remove_emptied_dirs(
        &manifest
            .moved
            .iter()
            .map(|m| m.path.clone())
            .collect::<Vec<_>>(),
        &plan.site_packages,
    );
    let layout = InstallLayout {
        purelib: env.paths.purelib.clone(),
        platlib: env.paths.platlib.clone(),
        scripts: env.paths.scripts.clone(),
        data: env.paths.data.clone(),
        headers: env.paths.include.clone(),
    };
    for s in steps {
        let installed = install(&s.wheel.path, &layout)
            .with_context(|| format!("cannot install {}", s.wheel.filename))?;
        mark_installer(&installed.wheel, &layout)?;
    }
    Ok(())
}

/// Write `INSTALLER` into the new dist-info and list it in RECORD (as pip does), so
/// `pip uninstall` and `pip list` treat the distribution like any other.
fn mark_installer(wheel: &commstack_wheel::Wheel, layout: &InstallLayout) -> Result<()> {
    let root = if wheel.root_is_purelib() {
        &layout.purelib
    } else {
        &layout.platlib
    };
    let info = root.join(&wheel.dist_info);
    let body = format!("{INSTALLER}\n");
    fs::write(info.join("INSTALLER"), &body)?;
    let record = info.join("RECORD");
    let mut text =
        fs::read_to_string(&record).with_context(|| format!("cannot read {}", record.display()))?;
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "{}/INSTALLER,{},{}\n",
        wheel.dist_info,
        record_hash(body.as_bytes()),
        body.len()
    ));
    fs::write(&record, text).with_context(|| format!("cannot write {}", record.display()))
}

/// Undo every generation of `root`, newest first. Returns the undone generation dirs
/// (now under `undone/`).
pub fn undo(root: &Path) -> Result<Vec<PathBuf>> {
    let mut done = Vec::new();
    for g in generations(root)?.into_iter().rev() {
        undo_generation(&g)?;
        done.push(retire(root, &g, "undone")?);
    }
    Ok(done)
}

/// Move a generation that no longer applies to `<root>/undone/<gen>-<why>-<time>`.
fn retire(root: &Path, gen_dir: &Path, why: &str) -> Result<PathBuf> {
    let undone = root.join("undone");
    fs::create_dir_all(&undone)?;
    let name = format!(
        "{}-{why}-{}",
        gen_dir.file_name().unwrap_or_default().to_string_lossy(),
        jiff::Timestamp::now().as_millisecond()
    );
    let to = undone.join(name);
    fs::rename(gen_dir, &to)
        .with_context(|| format!("cannot move {} to {}", gen_dir.display(), to.display()))?;
    Ok(to)
}

/// Put one generation back: remove what it added, restore what it moved, prove each
/// restored file's bytes.
fn undo_generation(gen_dir: &Path) -> Result<()> {
    let m = read_manifest(gen_dir)?;
    let mut added_dirs: Vec<PathBuf> = Vec::new();
    for a in &m.added {
        match fs::symlink_metadata(a) {
            Ok(_) => {
                fs::remove_file(a).with_context(|| format!("cannot remove {}", a.display()))?
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", a.display())),
        }
        if let Some(parent) = a.parent() {
            added_dirs.push(parent.to_path_buf());
        }
        // Python caches the bytecode of the modules it imported after the install
        // (`__pycache__/<name>.cpython-312.pyc`): gone with their source, as pip does.
        if let Some(cache) = remove_bytecode_of(a)? {
            added_dirs.push(cache);
        }
    }
    let mut dirs: Vec<&PathBuf> = m.created_dirs.iter().chain(&added_dirs).collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs.dedup();
    for d in dirs {
        let _ = fs::remove_dir(d); // only if empty; restore below recreates what is needed
    }
    let files = gen_dir.join("files");
    let mut wrong = Vec::new();
    for mv in &m.moved {
        let from = files.join(&mv.backup);
        if fs::symlink_metadata(&from).is_err() {
            // Never moved (an apply that stopped early): it must still be in place.
            if fs::symlink_metadata(&mv.path).is_err() {
                wrong.push(format!(
                    "{} is neither in the backup nor in place",
                    mv.path.display()
                ));
            }
            continue;
        }
        if let Some(parent) = mv.path.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        move_file(&from, &mv.path)?;
        if let Some(mode) = mv.mode {
            fs::set_permissions(&mv.path, fs::Permissions::from_mode(mode))?;
        }
        let ok = match (&mv.sha256, &mv.symlink) {
            (Some(sha), _) => commstack_digest::sha256_file(&mv.path).ok().as_ref() == Some(sha),
            (None, Some(target)) => fs::read_link(&mv.path).ok().as_ref() == Some(target),
            (None, None) => true,
        };
        if !ok {
            wrong.push(format!(
                "{} did not come back byte for byte",
                mv.path.display()
            ));
        }
    }
    if !wrong.is_empty() {
        bail!(
            "restoring {} left {} problem(s):\n  {}",
            gen_dir.display(),
            wrong.len(),
            wrong.join("\n  ")
        );
    }
    Ok(())
}

/// Remove the cached bytecode of a `.py` file; returns the cache directory.
fn remove_bytecode_of(py: &Path) -> Result<Option<PathBuf>> {
    let pycs = super::plan::bytecode_of(py);
    for pyc in &pycs {
        fs::remove_file(pyc).with_context(|| format!("cannot remove {}", pyc.display()))?;
    }
    Ok(py.parent().map(|d| d.join("__pycache__")))
}

/// Rename, or copy and remove across filesystems (the backup may live elsewhere).
fn move_file(from: &Path, to: &Path) -> Result<()> {
    match fs::rename(from, to) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(18) => {} // EXDEV
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot move {} to {}", from.display(), to.display()));
        }
    }
    let meta = fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(from)?, to)?;
    } else {
        let tmp = to.with_file_name(format!(
            ".{}.part",
            to.file_name().unwrap_or_default().to_string_lossy()
        ));
        fs::copy(from, &tmp)
            .with_context(|| format!("cannot copy {} to {}", from.display(), tmp.display()))?;
        fs::set_permissions(&tmp, meta.permissions())?;
        fs::rename(&tmp, to)?;
    }
    fs::remove_file(from).with_context(|| format!("cannot remove {}", from.display()))
}

/// After moving files away, remove directories left empty (as an uninstall does), up to
/// but not including `stop`.
fn remove_emptied_dirs(moved: &[PathBuf], stop: &Path) {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for p in moved {
        let mut d = p.parent();
        while let Some(dir) = d {
            if dir == stop || !dir.starts_with(stop) {
                break;
            }
            dirs.push(dir.to_path_buf());
            d = dir.parent();
        }
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs.dedup();
    for d in dirs {
        let _ = fs::remove_dir(d);
    }
}
