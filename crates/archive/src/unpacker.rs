//! One reading of an archive, whatever its format: every entry checked and written under a
//! temporary root, links made last, then the checks over the whole tree (hard link targets,
//! symlinks through each other, the top directory to strip).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{self, BufWriter, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_digest::{SHOWN_NAME_MAX, terminal_safe_capped_bytes};

use crate::limits::Budget;
use crate::options::{Options, Strip};
use crate::paths::{Blocked, Kind, Node, Paths, ROOT};

/// A name from the archive (an entry's path, a link's target), for a message: control
/// characters escaped, cut to [`SHOWN_NAME_MAX`] characters.
pub(crate) fn shown(raw: &[u8]) -> String {
    terminal_safe_capped_bytes(raw, SHOWN_NAME_MAX)
}

pub(crate) fn shown_path(path: &Path) -> String {
    shown(path.as_os_str().as_bytes())
}

pub(crate) const S_IFMT: u32 = 0o170000;
pub(crate) const S_IFREG: u32 = 0o100000;
pub(crate) const S_IFDIR: u32 = 0o040000;
pub(crate) const S_IFLNK: u32 = 0o120000;

pub(crate) struct Unpacker {
    pub archive: PathBuf,
    /// The temporary directory everything is written under.
    pub root: PathBuf,
    pub options: Options,
    pub budget: Budget,
    pub entries: u64,
    pub bytes: u64,
    pub paths: Paths,
    /// Entries' paths in the order they first appeared.
    pub order: Vec<(Node, PathBuf)>,
}

/// What [`Unpacker::finish`] leaves for the move into place.
pub(crate) struct Finished {
    /// The top directory stripped, by its name.
    pub top: Option<PathBuf>,
    /// Regular files (hard links included), relative to the destination, in archive order.
    pub files: Vec<PathBuf>,
    /// Directories under the destination with the archive's modes, relative to it.
    pub dirs: Vec<(PathBuf, u32)>,
}

impl Unpacker {
    pub fn new(archive: &Path, root: &Path, options: &Options, budget: Budget) -> Unpacker {
        Unpacker {
            archive: archive.to_path_buf(),
            root: root.to_path_buf(),
            options: *options,
            budget,
            entries: 0,
            bytes: 0,
            paths: Paths::new(),
            order: Vec::new(),
        }
    }

    pub fn count(&mut self, name: &str) -> Result<()> {
        self.entries += 1;
        if self.entries > self.options.limits.max_entries {
            bail!(
                "{}: more than {} entries (at {name}): refused as a decompression bomb \
                 (bound: Limits::max_entries); if the archive is genuine, raise it",
                self.archive.display(),
                self.options.limits.max_entries
            );
        }
        Ok(())
    }

    /// An entry's path or a link's target longer than [`crate::Limits::max_name`] is
    /// refused before anything is made of it.
    pub fn check_name(&self, what: &str, raw: &[u8]) -> Result<()> {
        let max = self.options.limits.max_name;
        if raw.len() > max {
            bail!(
                "{}: {what} {} is {} bytes long, more than {max} (bound: Limits::max_name, \
                 Linux's PATH_MAX): refused",
                self.archive.display(),
                shown(raw),
                raw.len()
            );
        }
        Ok(())
    }

    pub fn check_mode(&self, name: &str, mode: u32) -> Result<()> {
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
    /// archive's root itself and, with [`Options::drop_git`], for anything under `.git`.
    /// Absolute paths, `..` and paths deeper than the bound are refused.
    pub fn entry_path(&self, raw: &[u8], name: &str) -> Result<Option<PathBuf>> {
        let rel = match clean(raw) {
            Ok(rel) => rel,
            Err(why) => bail!(
                "{}: entry {name} leaves the destination ({why}): refused; the archive is \
                 unsafe to unpack",
                self.archive.display()
            ),
        };
        let Some(rel) = rel else { return Ok(None) };
        let depth = rel.iter().count();
        if depth > self.options.limits.max_depth {
            bail!(
                "{}: entry {name} has {depth} path components, more than {} (bound: \
                 Limits::max_depth): refused",
                self.archive.display(),
                self.options.limits.max_depth
            );
        }
        if self.options.drop_git && rel.iter().any(|c| c == ".git") {
            return Ok(None);
        }
        Ok(Some(rel))
    }

    /// Records `rel` as `kind` (replacing an earlier entry of the path), after checking
    /// that no parent is a file or link and that the path count stays bounded; creates
    /// the parent directories. Returns the path's node.
    fn place(&mut self, rel: &Path, name: &str, kind: Kind) -> Result<Node> {
        let components: Vec<&[u8]> = rel.iter().map(OsStr::as_bytes).collect();
        let archive = self.archive.display();
        let (node, created) = match self.paths.insert(&components) {
            Ok(placed) => placed,
            Err(Blocked::BySymlink(i)) => bail!(
                "{archive}: entry {name} lies under the symlink {}: refused (it would be \
                 written through the link)",
                shown_path(&rel.iter().take(i + 1).collect::<PathBuf>())
            ),
            Err(Blocked::ByFile(i)) => bail!(
                "{archive}: entry {name} lies under {}, which the archive makes a file",
                shown_path(&rel.iter().take(i + 1).collect::<PathBuf>())
            ),
        };
        if self.paths.len() > self.options.limits.max_entries {
            bail!(
                "{archive}: more than {} paths (entries and the directories they imply; at \
                 {name}): refused (bound: Limits::max_entries)",
                self.options.limits.max_entries
            );
        }
        let is_dir = matches!(kind, Kind::Dir(_));
        match self.paths.kind(node) {
            None if !is_dir && self.paths.has_children(node) => bail!(
                "{archive}: entry {name} is a file or link, but earlier entries lie under it: refused"
            ),
            None => self.order.push((node, rel.to_path_buf())),
            Some(Kind::Dir(_)) if is_dir => {}
            Some(Kind::Dir(_)) => bail!(
                "{archive}: entry {name} is a directory earlier in the archive and a file or link later: refused"
            ),
            Some(_) if is_dir => bail!(
                "{archive}: entry {name} is a file or link earlier in the archive and a directory later: refused"
            ),
            // Links are not on disk yet.
            Some(Kind::Symlink(_) | Kind::HardLink(_)) => {}
            Some(Kind::File) => {
                let path = self.root.join(rel);
                fs::remove_file(&path)
                    .with_context(|| format!("{archive}: cannot replace entry {name}"))?;
            }
        }
        // A new parent is a directory not on disk yet; known ones are (made with the entry
        // that first implied them).
        if created >= 2
            && let Some(parent) = rel.parent()
        {
            let dir = self.root.join(parent);
            fs::create_dir_all(&dir)
                .with_context(|| format!("{archive}: cannot create the directories of {name}"))?;
        }
        self.paths.set_kind(node, kind);
        Ok(node)
    }

    pub fn dir(&mut self, rel: &Path, name: &str, mode: u32) -> Result<()> {
        self.place(rel, name, Kind::Dir(mode & 0o777))?;
        fs::create_dir_all(self.root.join(rel))
            .with_context(|| format!("{}: cannot create directory {name}", self.archive.display()))
    }

    /// A regular file of `declared` bytes: refused before a byte is written when it would
    /// take the archive past its budget, and refused if `reader` holds more.
    pub fn file(
        &mut self,
        rel: &Path,
        name: &str,
        mode: u32,
        declared: u64,
        reader: &mut dyn Read,
    ) -> Result<()> {
        let remaining = self.budget.content.saturating_sub(self.bytes);
        if declared > remaining {
            bail!(
                "{}: the archive unpacks to more than {} bytes of content (at entry {name}, \
                 {declared} bytes): refused as a decompression bomb before writing it \
                 (bound: {})",
                self.archive.display(),
                self.budget.content,
                self.budget.content_bound
            );
        }
        self.place(rel, name, Kind::File)?;
        let path = self.root.join(rel);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("{}: cannot write entry {name}", self.archive.display()))?;
        let mut out = BufWriter::new(file);
        // One byte past the declared size tells an entry that holds more than it says.
        let n = io::copy(&mut reader.take(declared.saturating_add(1)), &mut out)
            .with_context(|| format!("{}: cannot unpack entry {name}", self.archive.display()))?;
        if n > declared {
            bail!(
                "{}: entry {name} holds more than the {declared} bytes it declares: refused",
                self.archive.display()
            );
        }
        self.bytes += n;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        // Exactly the archive's bits, whatever the umask.
        file.set_permissions(fs::Permissions::from_mode(mode & 0o777))
            .with_context(|| format!("{}: cannot set the mode of {name}", self.archive.display()))
    }

    pub fn symlink(&mut self, rel: &Path, name: &str, target: &[u8]) -> Result<()> {
        self.check_name("the target of symlink", target)?;
        let depth = target.split(|&b| b == b'/').count();
        if depth > self.options.limits.max_depth {
            bail!(
                "{}: symlink {name} -> {} has {depth} components, more than {} (bound: \
                 Limits::max_depth): refused",
                self.archive.display(),
                shown(target),
                self.options.limits.max_depth
            );
        }
        if target.starts_with(b"/") && !self.options.keep_absolute_symlinks {
            bail!(
                "{}: symlink {name} -> {} points outside the destination (an absolute target): \
                 refused; the archive is unsafe to unpack",
                self.archive.display(),
                shown(target)
            );
        }
        if target.contains(&0) {
            bail!(
                "{}: symlink {name} has a NUL byte in its target: refused",
                self.archive.display()
            );
        }
        self.place(rel, name, Kind::Symlink(target.to_vec()))?;
        Ok(())
    }

    pub fn hardlink(&mut self, rel: &Path, name: &str, target: &[u8]) -> Result<()> {
        self.check_name("the target of hard link", target)?;
        let archive = self.archive.display();
        let to = shown(target);
        let found = match clean(target) {
            Ok(Some(t)) => {
                let components: Vec<&[u8]> = t.iter().map(OsStr::as_bytes).collect();
                self.paths.find(&components)
            }
            Ok(None) => {
                bail!("{archive}: hard link {name} -> {to} points to the archive's root: refused")
            }
            Err(why) => bail!(
                "{archive}: hard link {name} -> {to} points outside the destination ({why}): \
                 refused; the archive is unsafe to unpack"
            ),
        };
        // Looked up now: the target must come earlier (it may still be replaced later,
        // which `link_hard` sees).
        let Some(target) =
            found.filter(|&n| matches!(self.paths.kind(n), Some(Kind::File | Kind::HardLink(_))))
        else {
            bail!(
                "{archive}: hard link {name} -> {to}: the target is not a regular file earlier \
                 in the archive: refused"
            );
        };
        self.place(rel, name, Kind::HardLink(target))?;
        Ok(())
    }

    /// Hard links, the top directory, every symlink checked against all others and then
    /// written. Nothing is moved yet.
    pub fn finish(&self, strip: Strip) -> Result<Finished> {
        self.link_hard()?;
        let top = self.top(strip)?;
        let in_root = |rel: &Path| -> Option<PathBuf> {
            match &top {
                Some((_, t)) => rel.strip_prefix(t).ok().map(Path::to_path_buf),
                None => Some(rel.to_path_buf()),
            }
        };
        let root = top.as_ref().map_or(ROOT, |(n, _)| *n);
        for (node, rel) in &self.order {
            let Some(Kind::Symlink(target)) = self.paths.kind(*node) else {
                continue;
            };
            // An absolute target kept on request points into the tree's own root.
            if !(target.starts_with(b"/") && self.options.keep_absolute_symlinks)
                && let Err(why) = self.paths.resolve_inside(root, *node, target)
            {
                bail!(
                    "{}: symlink {} -> {} {why}: refused; the archive is unsafe to unpack",
                    self.archive.display(),
                    shown_path(rel),
                    shown(target)
                );
            }
        }
        for (node, rel) in &self.order {
            if let Some(Kind::Symlink(target)) = self.paths.kind(*node) {
                symlink(OsStr::from_bytes(target), self.root.join(rel)).with_context(|| {
                    format!(
                        "{}: cannot write symlink {}",
                        self.archive.display(),
                        shown_path(rel)
                    )
                })?;
            }
        }
        let mut files = Vec::new();
        let mut dirs = Vec::new();
        for (node, rel) in &self.order {
            match (self.paths.kind(*node), in_root(rel)) {
                (Some(Kind::File | Kind::HardLink(_)), Some(r)) => files.push(r),
                (Some(Kind::Dir(mode)), Some(r)) => dirs.push((r, *mode)),
                _ => {}
            }
        }
        Ok(Finished {
            top: top.map(|(_, t)| t),
            files,
            dirs,
        })
    }

    /// Hard links: only to a regular file of the archive (written already, and no symlink
    /// is on disk yet for the path to run through).
    fn link_hard(&self) -> Result<()> {
        let mut linked: HashSet<Node> = HashSet::new();
        let path_of: std::collections::HashMap<Node, &PathBuf> =
            self.order.iter().map(|(n, p)| (*n, p)).collect();
        for (node, rel) in &self.order {
            let Some(Kind::HardLink(target)) = self.paths.kind(*node) else {
                continue;
            };
            let is_file =
                matches!(self.paths.kind(*target), Some(Kind::File)) || linked.contains(target);
            let target_rel = path_of[target];
            if !is_file {
                bail!(
                    "{}: hard link {} -> {}: the target is not a regular file earlier in the \
                     archive: refused",
                    self.archive.display(),
                    shown_path(rel),
                    shown_path(target_rel)
                );
            }
            fs::hard_link(self.root.join(target_rel), self.root.join(rel)).with_context(|| {
                format!(
                    "{}: cannot write hard link {}",
                    self.archive.display(),
                    shown_path(rel)
                )
            })?;
            linked.insert(*node);
        }
        Ok(())
    }

    /// The single top directory to strip, per `strip`, with its node.
    fn top(&self, strip: Strip) -> Result<Option<(Node, PathBuf)>> {
        let first = |rel: &Path| PathBuf::from(rel.iter().next().expect("not empty"));
        match strip {
            Strip::None => Ok(None),
            // As the tree hash decides (tree.rs in commstack-fetch): files and links only
            // (directories are not hashed), all under one top directory.
            Strip::TopDirIfSingle => {
                let mut top: Option<PathBuf> = None;
                for (node, rel) in &self.order {
                    if matches!(self.paths.kind(*node), Some(Kind::Dir(_))) {
                        continue;
                    }
                    let t = first(rel);
                    if rel.iter().count() < 2 || top.as_ref().is_some_and(|x| *x != t) {
                        return Ok(None);
                    }
                    top = Some(t);
                }
                Ok(top.map(|t| (self.paths.child(ROOT, t.as_os_str().as_bytes()).unwrap(), t)))
            }
            Strip::TopDir => {
                let Some((_, rel0)) = self.order.first() else {
                    bail!(
                        "{}: the archive is empty: there is no top directory to strip",
                        self.archive.display()
                    );
                };
                let t = first(rel0);
                for (node, rel) in &self.order {
                    let is_top_itself = rel.iter().count() == 1;
                    if first(rel) != t
                        || (is_top_itself && !matches!(self.paths.kind(*node), Some(Kind::Dir(_))))
                    {
                        bail!(
                            "{}: entry {} is not inside a top directory ({}): the archive has no \
                             single top directory to strip; unpack it without stripping",
                            self.archive.display(),
                            shown_path(rel),
                            shown_path(&t)
                        );
                    }
                }
                Ok(Some((
                    self.paths.child(ROOT, t.as_os_str().as_bytes()).unwrap(),
                    t,
                )))
            }
        }
    }
}

/// `./a//b/` -> `a/b`; `None` for the root itself; refuses absolute paths and `..`.
pub(crate) fn clean(raw: &[u8]) -> std::result::Result<Option<PathBuf>, &'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_paths() {
        assert_eq!(clean(b"./a//b/").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(clean(b"./").unwrap(), None);
        assert!(clean(b"/etc/passwd").is_err());
        assert!(clean(b"a/../../b").is_err());
    }

    #[test]
    fn shown_names_are_one_short_line() {
        assert_eq!(shown(b"a\nb"), "a\\nb");
        let long = vec![b'x'; 100_000];
        let s = shown(&long);
        assert!(
            s.len() < 400 && s.ends_with("x... (100000 bytes in all)"),
            "{s}"
        );
        assert_eq!(s.matches("bytes in all").count(), 1, "{s}");
    }
}
