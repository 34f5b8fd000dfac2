//! What [`crate::unpack`] is asked to do besides refusing unsafe entries ([`Options`],
//! [`Strip`]), and the archive formats it reads ([`Format`]).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, Result};

use crate::limits::Limits;

/// Whether the archive's single top directory is dropped (as GitHub and
/// `git archive --prefix` put one around the tree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strip {
    /// Keep every path as it is.
    #[default]
    None,
    /// `tar --strip-components=1`, but stricter: every entry must lie under one and the
    /// same top directory, else the archive is refused.
    TopDir,
    /// Strip the top directory when every file and link lies under one, else keep the
    /// paths: the rule the tree hash (`commstack_fetch::tree`) applies (directories do not
    /// count; those outside it are left out), so an archive and what it unpacks to hash
    /// alike.
    TopDirIfSingle,
}

/// What [`unpack`] does besides refusing unsafe entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub strip: Strip,
    pub limits: Limits,
    /// Keep absolute symlink targets (a root filesystem's links point into its own root,
    /// e.g. `bin/python -> /usr/bin/python3.11`). Only for archives we wrote ourselves, such
    /// as image layers: safe to write, as links are made last and never followed while
    /// unpacking, but such a tree is not safe to follow outside a container.
    pub keep_absolute_symlinks: bool,
    /// Leave out every entry with a path component named `.git` (not written, not a path
    /// of the tree): what the tree hash leaves out, so that a source's written tree is the
    /// hashed one. A `.git` directory in a source tree would make `git`, which build
    /// scripts run, obey whatever config it holds.
    pub drop_git: bool,
    /// Give every directory 0755 instead of the mode the archive records: for a wheel,
    /// whose directory modes mean nothing to an install (pip ignores them) and whose 0555
    /// or 0000 directory would keep its files unreadable and its staging tree unremovable.
    pub plain_dir_modes: bool,
}

impl Options {
    pub fn strip(strip: Strip) -> Options {
        Options {
            strip,
            ..Options::default()
        }
    }
}

/// The archive formats [`unpack`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    TarGz,
    /// `.zip` and `.whl`.
    Zip,
}

impl Format {
    /// From the file name's extension; `None` for anything else.
    pub fn from_name(name: &str) -> Option<Format> {
        let name = name.to_ascii_lowercase();
        if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Format::TarGz)
        } else if name.ends_with(".tar") {
            Some(Format::Tar)
        } else if name.ends_with(".zip") || name.ends_with(".whl") {
            Some(Format::Zip)
        } else {
            None
        }
    }

    /// From the first bytes (gzip, zip and ustar magic), else from the file name: the
    /// content wins, as caches store files under names that need not say what they are.
    pub fn detect(path: &Path) -> Result<Format> {
        let mut head = Vec::with_capacity(262);
        File::open(path)
            .with_context(|| format!("cannot open the archive {}", path.display()))?
            .take(262)
            .read_to_end(&mut head)
            .with_context(|| format!("cannot read the archive {}", path.display()))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            return Ok(Format::TarGz);
        }
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            return Ok(Format::Zip);
        }
        if head.get(257..262) == Some(b"ustar") {
            return Ok(Format::Tar);
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Format::from_name(&name).with_context(|| {
            format!(
                "{}: neither a .tar, .tar.gz/.tgz nor a .zip/.whl archive (by content or name)",
                path.display()
            )
        })
    }
}
