//! The one unpacker for every archive commstack opens (`.tar`, `.tar.gz`/`.tgz`, `.zip`,
//! `.whl`), and the one tree copy ([`copy_tree`]) in place of `cp -a`.
//!
//! [`unpack`] writes into a fresh temporary directory next to the destination and renames
//! it into place at the end, so a refused or broken archive leaves nothing behind. It
//! refuses, naming the entry:
//!
//! - absolute paths and paths with a `..` component;
//! - symlinks whose target, resolved lexically through every other link of the archive
//!   (chains such as `a -> .`, `b -> a/..` included), leaves the destination, or that
//!   loop; absolute symlink targets;
//! - hard links to a path outside the destination or to anything but a regular file
//!   earlier in the archive;
//! - device files, FIFOs and entry types it does not know;
//! - setuid, setgid and sticky bits: refused rather than stripped, since nothing commstack
//!   unpacks needs them and a stripped bit would silently change what the tree is;
//! - more bytes or entries than [`Limits`] allows (decompression bombs).
//!
//! Links are written last, after every file and directory: no file is ever written
//! through a link, so the order of entries cannot be used to escape.

use commstack_digest::terminal_safe;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};

/// How much an archive may write before it is taken for a decompression bomb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of file content.
    pub max_bytes: u64,
    /// Entries of any kind (files, directories, links).
    pub max_entries: u64,
}

impl Default for Limits {
    /// Far above anything commstack unpacks (the largest wheels are a few GiB).
    fn default() -> Limits {
        Limits {
            max_bytes: 64 << 30,
            max_entries: 1_000_000,
        }
    }
}

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
    /// Strip the top directory when there is exactly one, else keep the paths: the same
    /// rule the tree hash (`commstack_fetch::tree`) applies, so an archive and what it
    /// unpacks to hash alike.
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

/// What [`unpack`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Regular files (hard links included), relative to the destination, in archive order.
    pub files: Vec<PathBuf>,
    /// Entries read (after skipping pax global headers).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Unpack `archive` into `dest`, which must not exist (its parent is created). See the
/// crate docs for what is refused; on any error `dest` is not created.
pub fn unpack(archive: &Path, dest: &Path, options: &Options) -> Result<Unpacked> {
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: unpacking {} writes a fresh directory; remove it first",
            dest.display(),
            archive.display()
        );
    }
    let format = Format::detect(archive)?;
    let tmp = temp_next_to(dest)?;
    let mut u = Unpacker {
        archive: archive.to_path_buf(),
        root: tmp.path().to_path_buf(),
        limits: options.limits,
        keep_absolute_symlinks: options.keep_absolute_symlinks,
        entries: 0,
        bytes: 0,
        kinds: HashMap::new(),
        order: Vec::new(),
    };
    let open = || {
        File::open(archive)
            .map(BufReader::new)
            .with_context(|| format!("cannot open the archive {}", archive.display()))
    };
    match format {
        Format::Tar => u.tar(open()?)?,
        Format::TarGz => u.tar(flate2::read::GzDecoder::new(open()?))?,
        Format::Zip => u.zip(open()?)?,
    }
    u.finish(options.strip, tmp, dest)
}

/// Copy the directory `src` to `dest`, which must not exist, as `cp -a` does for what
/// commstack copies: files with their modes, symlinks as links (never followed),
/// directories with their modes. Devices, FIFOs and sockets are refused.
pub fn copy_tree(src: &Path, dest: &Path) -> Result<()> {
    copy_tree_except(src, dest, |_| false)
}

/// [`copy_tree`], leaving out every entry (and what is under it) for which `skip`, given
/// the path relative to `src`, says true.
pub fn copy_tree_except(src: &Path, dest: &Path, skip: impl Fn(&Path) -> bool) -> Result<()> {
    let root_meta = fs::metadata(src)
        .with_context(|| format!("cannot copy {}: no such directory", src.display()))?;
    if !root_meta.is_dir() {
        bail!("cannot copy {}: not a directory", src.display());
    }
    if dest.symlink_metadata().is_ok() {
        bail!(
            "{} already exists: copying {} writes a fresh directory; remove it first",
            dest.display(),
            src.display()
        );
    }
    let tmp = temp_next_to(dest)?;
    let mut dirs = vec![(PathBuf::new(), root_meta.permissions().mode())];
    let walk = walkdir::WalkDir::new(src)
        .follow_links(false)
        .min_depth(1)
        .into_iter()
        .filter_entry(|e| !skip(e.path().strip_prefix(src).unwrap_or(e.path())));
    for entry in walk {
        let entry = entry.with_context(|| format!("cannot walk {}", src.display()))?;
        let rel = entry
            .path()
            .strip_prefix(src)
            .expect("walkdir stays under its root")
            .to_path_buf();
        let to = tmp.path().join(&rel);
        let ft = entry.file_type();
        if ft.is_dir() {
            fs::create_dir(&to).with_context(|| format!("cannot create {}", to.display()))?;
            let mode = entry.metadata()?.permissions().mode();
            dirs.push((rel, mode));
        } else if ft.is_symlink() {
            let target = fs::read_link(entry.path())
                .with_context(|| format!("cannot read the link {}", entry.path().display()))?;
            symlink(&target, &to).with_context(|| format!("cannot link {}", to.display()))?;
        } else if ft.is_file() {
            // fs::copy keeps the permission bits.
            fs::copy(entry.path(), &to).with_context(|| {
                format!("cannot copy {} to {}", entry.path().display(), to.display())
            })?;
        } else {
            bail!(
                "{} is neither a file, a directory nor a symlink (a device, FIFO or socket): \
                 copy_tree copies only those; remove it from {} or copy it by hand",
                entry.path().display(),
                src.display()
            );
        }
    }
    set_dir_modes(tmp.path(), dirs)?;
    // Dropping `tmp` afterwards finds nothing left to remove.
    fs::rename(tmp.path(), dest).with_context(|| {
        format!(
            "cannot move the copy of {} to {}",
            src.display(),
            dest.display()
        )
    })
}

/// A temporary directory in `dest`'s parent (created if missing), so that the final
/// rename stays on one filesystem.
fn temp_next_to(dest: &Path) -> Result<tempfile::TempDir> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}.partial-"))
        .tempdir_in(parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })
}

/// Directory modes last (deepest first): a read-only directory would refuse its entries.
fn set_dir_modes(root: &Path, mut dirs: Vec<(PathBuf, u32)>) -> Result<()> {
    dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
    for (rel, mode) in dirs {
        let path = root.join(&rel);
        fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    }
    Ok(())
}

/// What each path of the archive became (a later entry of a path replaces an earlier one).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Dir(u32),
    File,
    /// Written in [`Unpacker::finish`], after every file.
    Symlink(PathBuf),
    /// The archive path (validated) of the file it links to.
    HardLink(PathBuf),
}

const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
const S_IFDIR: u32 = 0o040000;
const S_IFLNK: u32 = 0o120000;
/// Longest symlink target read from a zip entry (Linux PATH_MAX).
const MAX_LINK: u64 = 4096;

struct Unpacker {
    archive: PathBuf,
    /// The temporary directory everything is written under.
    root: PathBuf,
    limits: Limits,
    keep_absolute_symlinks: bool,
    entries: u64,
    bytes: u64,
    kinds: HashMap<PathBuf, Kind>,
    /// Paths in the order they first appeared.
    order: Vec<PathBuf>,
}

impl Unpacker {
    fn tar(&mut self, reader: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        let entries = archive
            .entries()
            .with_context(|| format!("{}: not a readable tar archive", self.archive.display()))?;
        for entry in entries {
            let mut entry = entry.with_context(|| {
                format!(
                    "{}: cannot read the next tar entry (truncated or corrupt archive?): fetch it again",
                    self.archive.display()
                )
            })?;
            let kind = entry.header().entry_type();
            // git archive's pax_global_header (the commit id) is no file of the tree.
            if kind == tar::EntryType::XGlobalHeader {
                continue;
            }
            let raw = entry.path_bytes().into_owned();
            // Shown in errors only (the path comes from `raw`): escaped for the terminal.
            let name = terminal_safe(&String::from_utf8_lossy(&raw)).into_owned();
            self.count(&name)?;
            let mode = entry.header().mode().with_context(|| {
                format!(
                    "{}: entry {name} has a bad mode field",
                    self.archive.display()
                )
            })?;
            self.check_mode(&name, mode)?;
            let Some(rel) = self.entry_path(&raw, &name)? else {
                continue;
            };
            use tar::EntryType as T;
            match kind {
                T::Directory => self.dir(&rel, &name, mode)?,
                // Pre-POSIX tar marks directories by a trailing slash only.
                T::Regular if raw.ends_with(b"/") => self.dir(&rel, &name, mode)?,
                T::Regular | T::Continuous | T::GNUSparse => {
                    self.file(&rel, &name, mode, &mut entry)?
                }
                T::Symlink => {
                    let target = entry.link_name_bytes().with_context(|| {
                        format!("{}: symlink {name} has no target", self.archive.display())
                    })?;
                    let target = PathBuf::from(OsStr::from_bytes(&target));
                    self.symlink(&rel, &name, target)?
                }
                T::Link => {
                    let target = entry.link_name_bytes().with_context(|| {
                        format!("{}: hard link {name} has no target", self.archive.display())
                    })?;
                    self.hardlink(&rel, &name, &target)?
                }
                T::Char | T::Block | T::Fifo => bail!(
                    "{}: entry {name} is a {} : refused (source trees and wheels hold only files, \
                     directories and links); the archive is not what it claims to be",
                    self.archive.display(),
                    match kind {
                        T::Char => "character device",
                        T::Block => "block device",
                        _ => "FIFO",
                    }
                ),
                other => bail!(
                    "{}: entry {name} has the tar entry type {:?} ({}), which commstack does not unpack",
                    self.archive.display(),
                    other,
                    other.as_byte() as char
                ),
            }
        }
        Ok(())
    }

    fn zip(&mut self, reader: BufReader<File>) -> Result<()> {
        let mut archive = zip::ZipArchive::new(reader)
            .with_context(|| format!("{} is not a valid zip archive", self.archive.display()))?;
        for i in 0..archive.len() {
            let mut f = archive.by_index(i).with_context(|| {
                format!("{}: cannot read zip entry {i}", self.archive.display())
            })?;
            let raw_name = f
                .name()
                .with_context(|| {
                    format!("{}: zip entry {i} has a bad name", self.archive.display())
                })?
                .into_owned();
            // Shown in errors only (the path comes from `raw_name`): escaped.
            let name = terminal_safe(&raw_name).into_owned();
            self.count(&name)?;
            let unix = f.unix_mode();
            // The zip crate clears setuid, setgid and sticky bits from the mode it reports;
            // the raw attributes still hold them (for entries made on Unix) to refuse them.
            let raw = f.external_attributes() >> 16;
            let mode = match unix {
                Some(m) if raw & !0o7000 == m => raw,
                Some(m) => m,
                None => 0,
            };
            self.check_mode(&name, mode)?;
            let Some(rel) = self.entry_path(raw_name.as_bytes(), &name)? else {
                continue;
            };
            let ftype = mode & S_IFMT;
            let perms = |default| unix.map_or(default, |m| m & 0o777);
            if f.is_dir() || ftype == S_IFDIR {
                self.dir(&rel, &name, perms(0o755))?;
            } else if f.is_symlink() || ftype == S_IFLNK {
                // A zip symlink is a file whose content is the target.
                let mut target = Vec::new();
                (&mut f).take(MAX_LINK + 1).read_to_end(&mut target)?;
                if target.len() as u64 > MAX_LINK {
                    bail!(
                        "{}: symlink {name} has a target longer than {MAX_LINK} bytes: refused",
                        self.archive.display()
                    );
                }
                self.symlink(&rel, &name, PathBuf::from(OsStr::from_bytes(&target)))?;
            } else if ftype == 0 || ftype == S_IFREG {
                self.file(&rel, &name, perms(0o644), &mut f)?;
            } else {
                bail!(
                    "{}: entry {name} is a special file (mode {mode:o}: a device, FIFO or socket): \
                     refused; the archive is not what it claims to be",
                    self.archive.display()
                );
            }
        }
        Ok(())
    }

    fn count(&mut self, name: &str) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            bail!(
                "{}: more than {} entries (at {name}): refused as a decompression bomb; \
                 if the archive is genuine, raise Limits::max_entries",
                self.archive.display(),
                self.limits.max_entries
            );
        }
        Ok(())
    }

    fn check_mode(&self, name: &str, mode: u32) -> Result<()> {
        if mode & 0o7000 != 0 {
            bail!(
                "{}: entry {name} has mode {:o} with a setuid, setgid or sticky bit: refused \
                 (nothing commstack unpacks needs one); repack the archive without it",
                self.archive.display(),
                mode & 0o7777
            );
        }
        Ok(())
    }

    /// The relative path of an entry: `./` and empty components dropped; `None` for the
    /// archive's root itself. Absolute paths and `..` are refused.
    fn entry_path(&self, raw: &[u8], name: &str) -> Result<Option<PathBuf>> {
        match clean(raw) {
            Ok(rel) => Ok(rel),
            Err(why) => bail!(
                "{}: entry {name} leaves the destination ({why}): refused; the archive is unsafe to unpack",
                self.archive.display()
            ),
        }
    }

    /// An entry may not lie under a file or a link of the archive.
    fn check_parents(&self, rel: &Path, name: &str) -> Result<()> {
        for parent in rel.ancestors().skip(1) {
            match self.kinds.get(parent) {
                None | Some(Kind::Dir(_)) => {}
                Some(Kind::Symlink(_)) => bail!(
                    "{}: entry {name} lies under the symlink {}: refused (it would be written \
                     through the link)",
                    self.archive.display(),
                    shown(parent)
                ),
                Some(_) => bail!(
                    "{}: entry {name} lies under {}, which the archive makes a file",
                    self.archive.display(),
                    shown(parent)
                ),
            }
        }
        Ok(())
    }

    /// Record `rel` as `kind`, replacing an earlier entry of the same path.
    fn replace(&mut self, rel: &Path, name: &str, kind: Kind) -> Result<()> {
        let path = self.root.join(rel);
        match self.kinds.get(rel) {
            None => self.order.push(rel.to_path_buf()),
            Some(Kind::Dir(_)) if matches!(kind, Kind::Dir(_)) => {}
            Some(Kind::Dir(_)) => bail!(
                "{}: entry {name} is a directory earlier in the archive and a file or link later: refused",
                self.archive.display()
            ),
            Some(_) if matches!(kind, Kind::Dir(_)) => bail!(
                "{}: entry {name} is a file or link earlier in the archive and a directory later: refused",
                self.archive.display()
            ),
            // Links are not on disk yet; hard links neither.
            Some(Kind::Symlink(_) | Kind::HardLink(_)) => {}
            Some(Kind::File) => fs::remove_file(&path)
                .with_context(|| format!("cannot replace {}", path.display()))?,
        }
        self.kinds.insert(rel.to_path_buf(), kind);
        Ok(())
    }

    fn dir(&mut self, rel: &Path, name: &str, mode: u32) -> Result<()> {
        self.check_parents(rel, name)?;
        self.replace(rel, name, Kind::Dir(mode & 0o777))?;
        let path = self.root.join(rel);
        fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))
    }

    fn file(&mut self, rel: &Path, name: &str, mode: u32, reader: &mut dyn Read) -> Result<()> {
        self.check_parents(rel, name)?;
        self.replace(rel, name, Kind::File)?;
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| {
                format!(
                    "{}: cannot write entry {name} to {}",
                    self.archive.display(),
                    path.display()
                )
            })?;
        let remaining = self.limits.max_bytes.saturating_sub(self.bytes);
        let mut out = BufWriter::new(file);
        // One byte past the limit tells a bomb from an archive that fills it exactly.
        let n = io::copy(&mut reader.take(remaining.saturating_add(1)), &mut out)
            .with_context(|| format!("{}: cannot unpack entry {name}", self.archive.display()))?;
        if n > remaining {
            bail!(
                "{}: the archive unpacks to more than {} bytes (at entry {name}): refused as a \
                 decompression bomb; if it is genuine, raise Limits::max_bytes",
                self.archive.display(),
                self.limits.max_bytes
            );
        }
        self.bytes += n;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        // Exactly the archive's bits, whatever the umask.
        file.set_permissions(fs::Permissions::from_mode(mode & 0o777))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
        Ok(())
    }

    fn symlink(&mut self, rel: &Path, name: &str, target: PathBuf) -> Result<()> {
        self.check_parents(rel, name)?;
        if target.is_absolute() && !self.keep_absolute_symlinks {
            bail!(
                "{}: symlink {name} -> {} points outside the destination (an absolute target): \
                 refused; the archive is unsafe to unpack",
                self.archive.display(),
                shown(&target)
            );
        }
        self.replace(rel, name, Kind::Symlink(target))
    }

    fn hardlink(&mut self, rel: &Path, name: &str, target: &[u8]) -> Result<()> {
        self.check_parents(rel, name)?;
        let shown = terminal_safe(&String::from_utf8_lossy(target)).into_owned();
        let target = match clean(target) {
            Ok(Some(t)) => t,
            Ok(None) => bail!(
                "{}: hard link {name} -> {shown} points to the archive's root: refused",
                self.archive.display()
            ),
            Err(why) => bail!(
                "{}: hard link {name} -> {shown} points outside the destination ({why}): refused; \
                 the archive is unsafe to unpack",
                self.archive.display()
            ),
        };
        self.replace(rel, name, Kind::HardLink(target))
    }

    /// Hard links, the top directory, symlinks, directory modes, then the rename.
    fn finish(self, strip: Strip, tmp: tempfile::TempDir, dest: &Path) -> Result<Unpacked> {
        let archive = self.archive.display();
        // Hard links: only to a regular file of the archive (written already, and no
        // symlink is on disk yet for the path to run through).
        let mut linked: HashSet<&Path> = HashSet::new();
        for rel in &self.order {
            let Some(Kind::HardLink(target)) = self.kinds.get(rel) else {
                continue;
            };
            let is_file = matches!(self.kinds.get(target), Some(Kind::File))
                || linked.contains(target.as_path());
            if !is_file {
                bail!(
                    "{archive}: hard link {} -> {}: the target is not a regular file earlier in the \
                     archive: refused",
                    shown(rel),
                    shown(target)
                );
            }
            let (from, to) = (self.root.join(target), self.root.join(rel));
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            fs::hard_link(&from, &to)
                .with_context(|| format!("{archive}: cannot write hard link {}", rel.display()))?;
            linked.insert(rel);
        }

        let top = self.top(strip)?;
        let in_root = |rel: &Path| -> PathBuf {
            match &top {
                Some(t) => rel.strip_prefix(t).unwrap_or(rel).to_path_buf(),
                None => rel.to_path_buf(),
            }
        };

        // Symlinks: every target checked against all links before any is written.
        let links: HashMap<PathBuf, PathBuf> = self
            .kinds
            .iter()
            .filter_map(|(rel, k)| match k {
                Kind::Symlink(t) => Some((in_root(rel), t.clone())),
                _ => None,
            })
            .collect();
        for rel in &self.order {
            let Some(Kind::Symlink(target)) = self.kinds.get(rel) else {
                continue;
            };
            if target.is_absolute() && self.keep_absolute_symlinks {
                // Points into the tree's own root, not checked against this directory.
                continue;
            }
            let at = in_root(rel);
            let parent: Vec<OsString> = at
                .parent()
                .map(|p| p.iter().map(OsStr::to_os_string).collect())
                .unwrap_or_default();
            if let Err(why) = resolve_inside(&links, parent, target) {
                bail!(
                    "{archive}: symlink {} -> {} {why}: refused; the archive is unsafe to unpack",
                    shown(rel),
                    shown(target)
                );
            }
        }
        for rel in &self.order {
            let Some(Kind::Symlink(target)) = self.kinds.get(rel) else {
                continue;
            };
            let path = self.root.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)
                    .with_context(|| format!("cannot create {}", parent.display()))?;
            }
            symlink(target, &path).with_context(|| {
                format!(
                    "{archive}: cannot write symlink {}: the archive also puts a directory or \
                     entries there; refused",
                    rel.display()
                )
            })?;
        }

        let files = self
            .order
            .iter()
            .filter(|rel| matches!(self.kinds.get(*rel), Some(Kind::File | Kind::HardLink(_))))
            .map(|rel| in_root(rel))
            .collect();
        let from = match &top {
            Some(t) => self.root.join(t),
            None => self.root.clone(),
        };
        // Moved while every directory is still writable (moving a directory to another
        // parent needs write access to it, and a failure must still be able to clean up);
        // the archive's directory modes are applied in place afterwards.
        fs::rename(&from, dest)
            .with_context(|| format!("cannot move the unpacked {archive} to {}", dest.display()))?;
        let mut dirs: Vec<(PathBuf, u32)> = self
            .kinds
            .iter()
            .filter_map(|(rel, k)| match k {
                Kind::Dir(mode) => Some((in_root(rel), *mode)),
                _ => None,
            })
            .collect();
        if top.is_none() {
            // The temporary directory is 0700; the tree's root gets what mkdir would give.
            dirs.push((PathBuf::new(), 0o755));
        }
        if let Err(e) = set_dir_modes(dest, dirs) {
            let _ = fs::remove_dir_all(dest);
            return Err(e);
        }
        drop(tmp);
        Ok(Unpacked {
            files,
            entries: self.entries,
            bytes: self.bytes,
        })
    }

    /// The single top directory to strip, per `strip`.
    fn top(&self, strip: Strip) -> Result<Option<PathBuf>> {
        if strip == Strip::None {
            return Ok(None);
        }
        let mut top: Option<&OsStr> = None;
        let mut offender: Option<&Path> = None;
        for rel in &self.order {
            let first = rel.iter().next().expect("entry paths are not empty");
            let is_top_itself = rel.iter().count() == 1;
            let fits = top.is_none_or(|t| t == first)
                && (!is_top_itself || matches!(self.kinds.get(rel), Some(Kind::Dir(_))));
            if !fits {
                offender = Some(rel);
                break;
            }
            top = Some(first);
        }
        match (strip, top, offender) {
            (_, Some(t), None) => Ok(Some(PathBuf::from(t))),
            (Strip::TopDirIfSingle, _, _) => Ok(None),
            (_, None, None) => bail!(
                "{}: the archive is empty: there is no top directory to strip",
                self.archive.display()
            ),
            (_, _, Some(o)) => bail!(
                "{}: entry {} is not inside a top directory{}: the archive has no single \
                 top directory to strip; unpack it without stripping",
                self.archive.display(),
                o.display(),
                top.map(|t| format!(" ({})", t.to_string_lossy()))
                    .unwrap_or_default()
            ),
        }
    }
}

/// `./a//b/` -> `a/b`; `None` for the root itself; refuses absolute paths and `..`.
fn clean(raw: &[u8]) -> std::result::Result<Option<PathBuf>, &'static str> {
    if raw.starts_with(b"/") {
        return Err("an absolute path");
    }
    if raw.contains(&0) {
        return Err("a NUL byte in the name");
    }
    let mut out = PathBuf::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("a `..` component"),
            p => out.push(OsStr::from_bytes(p)),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Whether `target`, followed from the directory `parent` (components below the
/// destination), stays inside, going through the archive's `links` as the kernel would.
/// Lexical: a component that is a file, or missing, counts as a directory, which can
/// only refuse more than the kernel would follow.
fn resolve_inside(
    links: &HashMap<PathBuf, PathBuf>,
    parent: Vec<OsString>,
    target: &Path,
) -> std::result::Result<(), &'static str> {
    // As Linux's MAXSYMLINKS.
    const MAX_HOPS: u32 = 40;
    let mut stack = parent;
    let mut pending: VecDeque<OsString> = target.iter().map(OsStr::to_os_string).collect();
    let mut hops = 0;
    while let Some(part) = pending.pop_front() {
        match Path::new(&part).components().next() {
            Some(Component::ParentDir) => {
                if stack.pop().is_none() {
                    return Err("leaves the destination");
                }
            }
            Some(Component::CurDir) | None => {}
            Some(Component::RootDir | Component::Prefix(_)) => {
                return Err("leaves the destination (through an absolute link)");
            }
            Some(Component::Normal(_)) => {
                stack.push(part);
                let here: PathBuf = stack.iter().collect();
                if let Some(next) = links.get(&here) {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err("runs through too many links (a loop?)");
                    }
                    if next.is_absolute() {
                        return Err("leaves the destination (through an absolute link)");
                    }
                    stack.pop();
                    for p in next.iter().rev() {
                        pending.push_front(p.to_os_string());
                    }
                }
            }
        }
    }
    Ok(())
}

/// A path from the archive, for an error message: its text with control characters escaped.
fn shown(path: &Path) -> String {
    terminal_safe(&path.to_string_lossy()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn links(pairs: &[(&str, &str)]) -> HashMap<PathBuf, PathBuf> {
        pairs
            .iter()
            .map(|(a, b)| (PathBuf::from(a), PathBuf::from(b)))
            .collect()
    }

    fn check(l: &HashMap<PathBuf, PathBuf>, at: &str, target: &str) -> bool {
        let parent = Path::new(at)
            .parent()
            .map(|p| p.iter().map(OsStr::to_os_string).collect())
            .unwrap_or_default();
        resolve_inside(l, parent, Path::new(target)).is_ok()
    }

    #[test]
    fn links_resolve_through_other_links() {
        let l = links(&[("a", "."), ("b", "a/.."), ("lib/x.so", "x.so.1")]);
        assert!(check(&l, "a", "."));
        assert!(
            !check(&l, "b", "a/.."),
            "a is the root, so a/.. is above it"
        );
        assert!(check(&l, "lib/x.so", "x.so.1"));
        assert!(check(&l, "lib/y", "../lib/x.so"));
        assert!(!check(&l, "lib/y", "../../etc"));
        assert!(check(&l, "d/e", "../d") && !check(&l, "d/e", "../../d"));
        let l = links(&[("up", "..")]);
        assert!(!check(&l, "z", "up/x"));
        let loop_ = links(&[("p", "q"), ("q", "p")]);
        assert!(!check(&loop_, "p", "q"));
    }

    #[test]
    fn clean_paths() {
        assert_eq!(clean(b"./a//b/").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(clean(b"./").unwrap(), None);
        assert!(clean(b"/etc/passwd").is_err());
        assert!(clean(b"a/../../b").is_err());
    }
}
