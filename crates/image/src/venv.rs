//! The image's Python environment, written into staging trees (no Python runs): a venv at
//! `/opt/commstack/venv` for the base's own `/usr/bin/python3.X`. The skeleton
//! (`pyvenv.cfg`, the `bin/python*` symlinks, the empty site-packages, the image user in
//! /etc/passwd and /etc/group, its home) is one tree; each wheel (or group of wheels) is
//! installed by `commstack_wheel::install` (RECORD-checked) into a tree of its own, with
//! its console-script launchers, so it becomes a layer of its own. No bytecode is
//! written: a non-root user could not write it at run time, and PYTHONDONTWRITEBYTECODE
//! keeps Python from trying. Each wheel's sha256 is checked before it is installed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_deepep::LockedWheel;
use commstack_wheel::{InstallLayout, Wheel, entry_points, install, launcher_script};

use crate::layer::Owner;
use crate::provenance::{Claims, Origin};

/// The venv, relative to the image root.
pub const VENV: &str = "opt/commstack/venv";
/// The launchers' interpreter.
pub const VENV_PYTHON: &str = "/opt/commstack/venv/bin/python";

/// The venv's Python: the base's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VenvLayout {
    /// `3.11.2`
    pub python_full: String,
    /// `3.11`
    pub python_minor: String,
}

/// The image's non-root user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageUser {
    pub name: String,
    pub uid: u64,
    pub gid: u64,
}

impl ImageUser {
    /// `home/<name>`, relative to the image root.
    pub fn home(&self) -> String {
        format!("home/{}", self.name)
    }
}

impl VenvLayout {
    pub fn site_packages(&self) -> String {
        format!("{VENV}/lib/python{}/site-packages", self.python_minor)
    }

    fn install_layout(&self, root: &Path, dist: &str) -> InstallLayout {
        let site = root.join(self.site_packages());
        InstallLayout {
            purelib: site.clone(),
            platlib: site,
            scripts: root.join(VENV).join("bin"),
            data: root.join(VENV),
            headers: root
                .join(VENV)
                .join(format!("include/site/python{}", self.python_minor))
                .join(dist),
        }
    }

    /// Where RECORD's `inner` path lands, relative to the image root.
    fn image_path(&self, wheel: &Wheel, inner: &str) -> String {
        let data = format!("{}.data/", wheel.dist_info.trim_end_matches(".dist-info"));
        let site = self.site_packages();
        let Some((scheme, rest)) = inner.strip_prefix(&data).and_then(|r| r.split_once('/')) else {
            return format!("{site}/{inner}");
        };
        match scheme {
            "scripts" => format!("{VENV}/bin/{rest}"),
            "data" => format!("{VENV}/{rest}"),
            "headers" => format!(
                "{VENV}/include/site/python{}/{}/{rest}",
                self.python_minor,
                wheel.name()
            ),
            _ => format!("{site}/{rest}"),
        }
    }
}

/// Checks `wheel`'s file against the sha256 the wheelhouse manifest and the lock give.
pub fn check_wheel(wheel: &LockedWheel) -> Result<()> {
    let actual = commstack_digest::sha256_file(&wheel.path)
        .with_context(|| format!("cannot hash the wheel {}", wheel.filename))?;
    if actual != wheel.sha256 {
        bail!(
            "the wheel {} ({}) has sha256 {actual}, but the lock and the wheelhouse say {}: the wheelhouse is damaged or stale. \
             Run `cargo xtask fetch --verify` (re-hashes the cache) and `cargo xtask build deepep` (re-assembles the wheelhouse), then build the image again",
            wheel.filename,
            wheel.path.display(),
            wheel.sha256
        );
    }
    Ok(())
}

/// Installs `wheels` (sha256-checked first) into `stage` with their launchers; returns what
/// claims every file written. Two wheels writing one path is an error unless the bytes are
/// equal (the empty `nvidia/__init__.py` many CUDA wheels ship): the first one claims it.
pub fn install_wheels(stage: &Path, layout: &VenvLayout, wheels: &[LockedWheel]) -> Result<Claims> {
    let mut claims = Claims::new();
    fs::create_dir_all(stage).with_context(|| format!("cannot create {}", stage.display()))?;
    for locked in wheels {
        check_wheel(locked)?;
        // Each wheel in a tree of its own, then merged: a clash is found, never overwritten.
        let work = tempfile::Builder::new()
            .prefix(".wheel-")
            .tempdir_in(stage.parent().unwrap_or(stage))
            .with_context(|| format!("cannot create a directory beside {}", stage.display()))?;
        let own = install_one(work.path(), layout, locked)?;
        for (path, origin) in own {
            let from = work.path().join(&path);
            let to = stage.join(&path);
            if to.symlink_metadata().is_ok() {
                if fs::read(&from)? == fs::read(&to)? {
                    continue;
                }
                bail!(
                    "{path} is shipped by {} and by {} with other bytes: one layer cannot hold both",
                    locked.filename,
                    claims
                        .get(&path)
                        .map(origin_name)
                        .unwrap_or_else(|| "another wheel".into())
                );
            }
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::rename(&from, &to)
                .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))?;
            claims.insert(path, origin);
        }
    }
    Ok(claims)
}

fn origin_name(origin: &Origin) -> String {
    match origin {
        Origin::Wheel { wheel, version, .. } | Origin::Launcher { wheel, version, .. } => {
            format!("{wheel} {version}")
        }
        Origin::Base { origin } => origin.clone(),
        Origin::Own { name, .. } => name.clone(),
    }
}

/// One wheel into `root` (empty), launchers included; the claims of every file there.
fn install_one(root: &Path, layout: &VenvLayout, locked: &LockedWheel) -> Result<Claims> {
    let wheel = Wheel::open(&locked.path)?;
    let installed = install(&locked.path, &layout.install_layout(root, wheel.name()))
        .with_context(|| format!("cannot install {} into the image", locked.filename))?;
    let wheel = installed.wheel;
    let mut claims = Claims::new();
    for entry in &wheel.record {
        claims.insert(
            layout.image_path(&wheel, &entry.path),
            Origin::Wheel {
                wheel: locked.name.clone(),
                version: locked.version.clone(),
                sha256: locked.sha256.clone(),
                record: entry.path.clone(),
                hash: entry.hash.clone().unwrap_or_default(),
            },
        );
    }
    let bin = root.join(VENV).join("bin");
    for ep in entry_points(&wheel)? {
        let rel = format!("{VENV}/bin/{}", ep.name);
        let path = root.join(&rel);
        if path.symlink_metadata().is_ok() {
            bail!(
                "{}: the entry point {} would replace a script the wheel ships",
                locked.filename,
                ep.name
            );
        }
        fs::create_dir_all(&bin)?;
        fs::write(&path, launcher_script(VENV_PYTHON, &ep))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        claims.insert(
            rel,
            Origin::Launcher {
                wheel: locked.name.clone(),
                version: locked.version.clone(),
                sha256: locked.sha256.clone(),
                entry_point: format!("{}:{}", ep.module, ep.attr),
            },
        );
    }
    // Only what is really in the tree: RECORD may list files the archive lacks only if
    // install failed, and then we never got here.
    let mut present = Claims::new();
    for path in tree_files(root)? {
        let origin = claims.remove(&path).with_context(|| {
            format!(
                "{}: installing it wrote {path}, which its RECORD does not list",
                locked.filename
            )
        })?;
        present.insert(path, origin);
    }
    Ok(present)
}

/// Files and symlinks under `root`, relative, `/`-separated.
pub fn tree_files(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root).min_depth(1).follow_links(false) {
        let entry = entry.with_context(|| format!("cannot walk {}", root.display()))?;
        if entry.file_type().is_dir() {
            continue;
        }
        let rel = entry.path().strip_prefix(root).expect("under root");
        let rel = rel
            .to_str()
            .with_context(|| format!("{}: a non-UTF-8 path", entry.path().display()))?;
        out.push(rel.to_string());
    }
    Ok(out)
}

/// Writes the venv skeleton and the image user into `stage`: pyvenv.cfg, bin/python*,
/// site-packages, etc/passwd and etc/group (the base's plus the user), the user's home,
/// and for DeepEP V2 `jit_cache` (EP_JIT_CACHE_DIR). Returns the claims and the owner
/// rules (the home and the JIT cache belong to the user).
pub fn write_skeleton(
    stage: &Path,
    layout: &VenvLayout,
    user: &ImageUser,
    base_passwd: &str,
    base_group: &str,
    source: &str,
    jit_cache: Option<&str>,
) -> Result<(Claims, Vec<Owner>)> {
    let venv = stage.join(VENV);
    fs::create_dir_all(venv.join("bin"))?;
    fs::create_dir_all(stage.join(layout.site_packages()))?;
    fs::write(
        venv.join("pyvenv.cfg"),
        format!(
            "home = /usr/bin\ninclude-system-site-packages = false\nversion = {}\n",
            layout.python_full
        ),
    )?;
    let target = format!("/usr/bin/python{}", layout.python_minor);
    for name in [
        "python".to_string(),
        "python3".to_string(),
        format!("python{}", layout.python_minor),
    ] {
        std::os::unix::fs::symlink(&target, venv.join("bin").join(name))?;
    }
    for (file, line, id, text) in [
        (
            "passwd",
            format!(
                "{n}:x:{u}:{g}:{n}:/{h}:/bin/sh\n",
                n = user.name,
                u = user.uid,
                g = user.gid,
                h = user.home()
            ),
            user.uid,
            base_passwd,
        ),
        (
            "group",
            format!("{}:x:{}:\n", user.name, user.gid),
            user.gid,
            base_group,
        ),
    ] {
        for existing in text.lines() {
            let mut fields = existing.split(':');
            let (name, id_field) = (fields.next(), fields.nth(1));
            if name == Some(user.name.as_str()) || id_field == Some(id.to_string().as_str()) {
                bail!(
                    "the base's /etc/{file} already has {existing:?}: the image user {} ({id}) would clash",
                    user.name
                );
            }
        }
        let mut out = text.to_string();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&line);
        fs::create_dir_all(stage.join("etc"))?;
        fs::write(stage.join("etc").join(file), out)?;
    }
    fs::create_dir_all(stage.join(user.home()))?;
    let mut claims = Claims::new();
    for path in tree_files(stage)? {
        let file = stage.join(&path);
        // A symlink's origin is its target, not the bytes of whatever it points at here.
        let sha256 = if file.symlink_metadata()?.file_type().is_symlink() {
            None
        } else {
            Some(commstack_digest::sha256_file(&file)?)
        };
        claims.insert(
            path.clone(),
            Origin::Own {
                name: format!("generated:{}", skeleton_rule(&path)),
                sha256,
                source: source.to_string(),
            },
        );
    }
    let mut owners = vec![Owner {
        path: PathBuf::from(user.home()),
        uid: user.uid,
        gid: user.gid,
    }];
    // DeepEP V2's JIT cache (EP_JIT_CACHE_DIR): an empty directory the user writes.
    if let Some(cache) = jit_cache {
        fs::create_dir_all(stage.join(cache))?;
        owners.push(Owner {
            path: PathBuf::from(cache),
            uid: user.uid,
            gid: user.gid,
        });
    }
    Ok((claims, owners))
}

fn skeleton_rule(path: &str) -> &'static str {
    if path.starts_with("etc/") {
        "image-user"
    } else {
        "venv"
    }
}
