//! Unpack a wheel into a directory (as is) or install it into a layout (the `.data`
//! directory's schemes mapped to their own directories, like an installer does).
//! Every file is checked against RECORD while it is written; executable bits recorded in
//! the archive are kept (nvcc in the nvidia-cuda-nvcc wheel must stay executable).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::read::{RecordMismatch, Wheel, compare_record, open_archive};
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

/// Extract every file as it is in the archive under `dest`.
pub fn unpack(wheel_path: &Path, dest: &Path) -> Result<Installed> {
    let wheel = Wheel::open(wheel_path)?;
    extract(wheel, |inner| Ok(dest.join(inner)))
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
    extract(wheel, move |inner| {
        let Some(rest) = inner.strip_prefix(&data_dir) else {
            return Ok(root.join(inner));
        };
        let (scheme, path) = rest
            .split_once('/')
            .with_context(|| format!("{inner}: a file directly in the .data directory"))?;
        let base = match scheme {
            "purelib" => &layout.purelib,
            "platlib" => &layout.platlib,
            "scripts" => &layout.scripts,
            "data" => &layout.data,
            "headers" => &layout.headers,
            other => bail!("{inner}: unknown install scheme {other:?} in the .data directory"),
        };
        Ok(base.join(path))
    })
}

fn extract(wheel: Wheel, target_of: impl Fn(&str) -> Result<PathBuf>) -> Result<Installed> {
    let mut archive = open_archive(&wheel.path)?;
    let mut seen = BTreeMap::new();
    let mut files = Vec::new();
    for i in 0..archive.len() {
        let mut f = archive.by_index(i)?;
        let inner = f.name()?.to_string();
        if f.is_symlink() {
            bail!(
                "{}: {inner} is a symlink; wheels cannot hold links",
                wheel.path.display()
            );
        }
        if f.is_dir() {
            continue;
        }
        if f.enclosed_name().is_none()
            || Path::new(&inner)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
        {
            bail!(
                "{}: {inner} would be written outside the target directory",
                wheel.path.display()
            );
        }
        let target = target_of(&inner)?;
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let executable = f.unix_mode().is_some_and(|m| m & 0o111 != 0);
        let mode = if executable { 0o755 } else { 0o644 };
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&target)
            .with_context(|| {
                format!(
                    "cannot create {} (from {}; does another wheel own it?)",
                    target.display(),
                    wheel.path.display()
                )
            })?;
        let mut tee = TeeHasher {
            inner: io::BufWriter::new(out),
            hasher: Default::default(),
        };
        io::copy(&mut f, &mut tee)
            .with_context(|| format!("{}: cannot extract {inner}", wheel.path.display()))?;
        tee.inner.flush()?;
        let out: File = tee.inner.into_inner().map_err(|e| e.into_error())?;
        // The umask may have cleared bits of `mode`: set them exactly.
        out.set_permissions(fs::Permissions::from_mode(mode))?;
        seen.insert(
            inner,
            (
                format_sha256(&sha2::Digest::finalize(tee.hasher.hasher)),
                tee.hasher.len,
            ),
        );
        files.push(target);
    }
    let problems = compare_record(&wheel.record, &seen, &wheel.record_path());
    if !problems.is_empty() {
        return Err(RecordMismatch {
            wheel: wheel.path.display().to_string(),
            problems,
        }
        .into());
    }
    Ok(Installed { wheel, files })
}

struct TeeHasher<W> {
    inner: W,
    hasher: crate::read::HashingWriter,
}

impl<W: Write> Write for TeeHasher<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.write_all(&buf[..n])?;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
