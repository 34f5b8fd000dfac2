//! Unpack a wheel into a directory (as is) or install it into a layout (the `.data`
//! directory's schemes mapped to their own directories, like an installer does).
//! The bytes are extracted by `commstack_archive` (the one unpacker, with its refusals and
//! limits) into a staging directory inside the target; every file is checked against
//! RECORD there, and only then moved into place, so a wheel whose RECORD disagrees
//! installs nothing. Executable bits recorded in the archive are kept (nvcc in the
//! nvidia-cuda-nvcc wheel must stay executable), other mode bits normalised.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::read::{HashingWriter, RecordMismatch, Wheel, compare_record, shown};
use crate::record::format_sha256;

/// Where each part of a wheel goes (the install scheme).
#[derive(Clone, Debug)]
pub struct InstallLayout {
    pub purelib: PathBuf,
    pub platlib: PathBuf,
    pub scripts: PathBuf,
    pub data: PathBuf,
    pub headers: PathBuf,
}

impl InstallLayout {
    /// One prefix for everything: libraries at the root, scripts in `bin/`, headers in
    /// `include/`, data at the root.
    pub fn prefix(root: &Path) -> InstallLayout {
        InstallLayout {
            purelib: root.to_path_buf(),
            platlib: root.to_path_buf(),
            scripts: root.join("bin"),
            data: root.to_path_buf(),
            headers: root.join("include"),
        }
    }
}

/// What an unpack or install wrote.
#[derive(Debug)]
pub struct Installed {
    pub wheel: Wheel,
    /// Every file written, in archive order.
    pub files: Vec<PathBuf>,
}

/// Extract every file as it is in the archive under `dest` (created if missing; files
/// already there are never overwritten).
pub fn unpack(wheel_path: &Path, dest: &Path) -> Result<Installed> {
    let wheel = Wheel::open(wheel_path)?;
    extract(wheel, dest, |inner| Ok(dest.join(inner)))
}

/// Install into `layout`: `<name>.data/<scheme>/...` goes to that scheme's directory,
/// everything else to purelib or platlib (per `Root-Is-Purelib`).
pub fn install(wheel_path: &Path, layout: &InstallLayout) -> Result<Installed> {
    let wheel = Wheel::open(wheel_path)?;
    let data_dir = format!(
        "{}/",
        wheel.dist_info.trim_end_matches(".dist-info").to_string() + ".data"
    );
    let root = if wheel.root_is_purelib() {
        layout.purelib.clone()
    } else {
        layout.platlib.clone()
    };
    let layout = layout.clone();
    extract(wheel, &root.clone(), move |inner| {
        let Some(rest) = inner.strip_prefix(&data_dir) else {
            return Ok(root.join(inner));
        };
        let (scheme, path) = rest
            .split_once('/')
            .with_context(|| format!("{}: a file directly in the .data directory", shown(inner)))?;
        let base = match scheme {
            "purelib" => &layout.purelib,
            "platlib" => &layout.platlib,
            "scripts" => &layout.scripts,
            "data" => &layout.data,
            "headers" => &layout.headers,
            other => bail!(
                "{}: unknown install scheme {other:?} in the .data directory",
                shown(inner)
            ),
        };
        Ok(base.join(path))
    })
}

/// Unpack into a staging directory under `stage_in` (the target's root, so that placing
/// a file is a link on one filesystem), check RECORD, then place each file where
/// `target_of` says.
/// On any error, what it wrote (files and the directories it created) is removed again.
fn extract(
    wheel: Wheel,
    stage_in: &Path,
    target_of: impl Fn(&str) -> Result<PathBuf>,
) -> Result<Installed> {
    let mut placed = Placed::default();
    let result = extract_into(wheel, stage_in, target_of, &mut placed);
    if result.is_err() {
        placed.remove();
    }
    result
}

fn extract_into(
    wheel: Wheel,
    stage_in: &Path,
    target_of: impl Fn(&str) -> Result<PathBuf>,
    placed: &mut Placed,
) -> Result<Installed> {
    if let Some(link) = wheel.entries.iter().find(|e| e.is_symlink) {
        bail!(
            "{}: {} is a symlink; wheels cannot hold links",
            wheel.path.display(),
            shown(&link.path)
        );
    }
    placed
        .create_dir_all(stage_in)
        .with_context(|| format!("cannot create {}", stage_in.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".wheel-unpack-")
        .tempdir_in(stage_in)
        .with_context(|| {
            format!(
                "cannot create a staging directory in {}",
                stage_in.display()
            )
        })?;
    let tree = staging.path().join("tree");
    let options = commstack_archive::Options {
        plain_dir_modes: true,
        ..commstack_archive::Options::default()
    };
    let unpacked = commstack_archive::unpack(&wheel.path, &tree, &options)?;
    same_names(&wheel, &unpacked.files)?;

    let mut seen = BTreeMap::new();
    let mut staged = Vec::with_capacity(unpacked.files.len());
    for rel in &unpacked.files {
        // Zip names are text, so the paths made from them are too.
        let inner = rel
            .to_str()
            .with_context(|| format!("{}: a non-UTF-8 name", wheel.path.display()))?
            .to_string();
        let path = tree.join(rel);
        let unreadable = || {
            format!(
                "{}: cannot read entry {}",
                wheel.path.display(),
                shown(&inner)
            )
        };
        let mut hasher = HashingWriter::default();
        io::copy(
            &mut File::open(&path).with_context(unreadable)?,
            &mut hasher,
        )
        .with_context(unreadable)?;
        seen.insert(
            inner.clone(),
            (
                format_sha256(&sha2::Digest::finalize(hasher.hasher)),
                hasher.len,
            ),
        );
        staged.push((inner, path));
    }
    let problems = compare_record(&wheel.record, &seen, &wheel.record_path());
    if !problems.is_empty() {
        return Err(RecordMismatch {
            wheel: wheel.path.display().to_string(),
            problems,
        }
        .into());
    }

    // Every target decided before the first is placed: a bad scheme, or two entries that
    // install to one path (`x` and `<name>.data/purelib/x`), write nothing.
    let mut claimed: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut placements = Vec::with_capacity(staged.len());
    for (inner, from) in staged {
        let target = target_of(&inner).with_context(|| format!("{}", wheel.path.display()))?;
        if let Some(other) = claimed.insert(target.clone(), inner.clone()) {
            bail!(
                "{}: entries {} and {} both install to {}: refused, nothing written",
                wheel.path.display(),
                shown(&other),
                shown(&inner),
                shown(&target.to_string_lossy())
            );
        }
        placements.push((inner, from, target));
    }
    for (inner, from, target) in placements {
        place_entry(&wheel, &inner, &from, &target, placed)?;
    }
    Ok(Installed {
        wheel,
        files: std::mem::take(&mut placed.files),
    })
}

/// The files unpacked are the files the zip names, each once: RECORD is checked against
/// the former, `Wheel::verify` against the latter, so a name the unpacker reads otherwise
/// (`.`, `a//b`, a directory by its mode without a trailing `/`) or twice is refused.
fn same_names(wheel: &Wheel, unpacked: &[PathBuf]) -> Result<()> {
    let mut named = std::collections::BTreeSet::new();
    for e in wheel.entries.iter().filter(|e| !e.is_dir) {
        if !named.insert(e.path.as_str()) {
            bail!(
                "{}: the zip has two entries named {}: refused",
                wheel.path.display(),
                shown(&e.path)
            );
        }
    }
    let written: std::collections::BTreeSet<&str> =
        unpacked.iter().filter_map(|p| p.to_str()).collect();
    if let Some(odd) = named.symmetric_difference(&written).next() {
        bail!(
            "{}: the zip entry {} does not name a file as written (an entry `.` or `a//b`, or a \
             directory without a trailing `/`): refused",
            wheel.path.display(),
            shown(odd)
        );
    }
    Ok(())
}

/// What an install has written so far, removed again if anything fails: a wheel installs
/// whole or not at all.
#[derive(Default)]
struct Placed {
    files: Vec<PathBuf>,
    /// Directories it created, parents first.
    dirs: Vec<PathBuf>,
}

impl Placed {
    fn remove(&self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
        for d in self.dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }

    /// `dir` and its missing parents, each recorded.
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        let mut missing = Vec::new();
        let mut at = dir;
        while !at.as_os_str().is_empty() && at.symlink_metadata().is_err() {
            missing.push(at.to_path_buf());
            match at.parent() {
                Some(parent) => at = parent,
                None => break,
            }
        }
        for d in missing.into_iter().rev() {
            match fs::create_dir(&d) {
                Ok(()) => self.dirs.push(d),
                // Made meanwhile by someone else: theirs, not ours to remove.
                Err(_) if d.is_dir() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// One staged file into place, its mode normalised.
fn place_entry(
    wheel: &Wheel,
    inner: &str,
    from: &Path,
    target: &Path,
    placed: &mut Placed,
) -> Result<()> {
    // The target's path holds the entry's name: shown escaped.
    let target_shown = shown(&target.to_string_lossy());
    if let Some(parent) = target.parent() {
        placed
            .create_dir_all(parent)
            .with_context(|| format!("cannot create the directory of {target_shown}"))?;
    }
    let executable = fs::metadata(from)?.permissions().mode() & 0o111 != 0;
    let mode = if executable { 0o755 } else { 0o644 };
    fs::set_permissions(from, fs::Permissions::from_mode(mode)).with_context(|| {
        format!(
            "{}: cannot set the mode of entry {}",
            wheel.path.display(),
            shown(inner)
        )
    })?;
    place(from, target).with_context(|| {
        format!(
            "cannot create {target_shown} (from {}; does another wheel own it?)",
            wheel.path.display()
        )
    })?;
    placed.files.push(target.to_path_buf());
    Ok(())
}

/// Put the staged file `from` at `to`, never replacing what is there: a hard link (one
/// filesystem, atomic, refuses an existing `to`), else a copy into a new file.
fn place(from: &Path, to: &Path) -> io::Result<()> {
    match fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Err(e),
        Err(_) => {
            let mode = fs::metadata(from)?.permissions().mode();
            let mut out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(to)?;
            let copied = io::copy(&mut File::open(from)?, &mut out).and_then(|_| {
                // The umask may have cleared bits of `mode`: set them exactly.
                out.set_permissions(fs::Permissions::from_mode(mode))
            });
            if copied.is_err() {
                // Ours (create_new), and half-written: not left for the next install to
                // take for another wheel's.
                let _ = fs::remove_file(to);
            }
            copied
        }
    }
}
