//! Reading mmdebstrap's tar: every entry's metadata and where its data lies (so the
//! normalised tar can be written in another order without unpacking), plus the dpkg
//! files provenance and the installed-set check need. PAX extended headers (mmdebstrap's
//! tar writes them for non-ASCII names) and GNU long names are read by the `tar` crate
//! and folded into the entry's path here; they are not carried over.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{Context, Result, bail};

/// What an entry is. Device nodes, FIFOs and anything else are refused when read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    HardLink,
}

/// One entry of the raw tar.
#[derive(Clone, Debug)]
pub struct RawEntry {
    /// Relative, no leading `./`, no trailing `/`.
    pub path: String,
    pub kind: Kind,
    /// Permission bits with setuid/setgid/sticky (`& 0o7777`).
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    pub size: u64,
    /// Byte offset of the entry's data in the raw tar.
    pub data_offset: u64,
    /// Symlink target as written, or a hard link's target path (normalised like `path`).
    pub link: Option<String>,
}

/// The raw tar read once.
#[derive(Debug, Default)]
pub struct RawTar {
    pub entries: Vec<RawEntry>,
    /// `var/lib/dpkg/status`.
    pub status: Option<String>,
    /// Package name -> the lines of its `var/lib/dpkg/info/<name>[:arch].list`.
    pub lists: BTreeMap<String, Vec<String>>,
}

/// Read `path` (mmdebstrap's output tar).
pub fn read_raw(path: &Path) -> Result<RawTar> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let mut raw = RawTar::default();
    let entries = archive
        .entries()
        .with_context(|| format!("cannot read the tar {}", path.display()))?;
    for entry in entries {
        let mut entry = entry.with_context(|| format!("cannot read the tar {}", path.display()))?;
        let header = entry.header();
        let et = header.entry_type();
        if et.is_pax_global_extensions() || et.is_pax_local_extensions() {
            // Folded into the next entry by the tar crate; a global header carries nothing
            // we keep.
            continue;
        }
        let name_bytes = entry.path_bytes().into_owned();
        let name = String::from_utf8(name_bytes).map_err(|e| {
            anyhow::anyhow!(
                "{}: an entry's name is not UTF-8 ({:?}): base.json names files as text",
                path.display(),
                String::from_utf8_lossy(e.as_bytes())
            )
        })?;
        let rel =
            normalise_path(&name).with_context(|| format!("{}: entry {name:?}", path.display()))?;
        let shown = rel.as_deref().unwrap_or(".");
        let kind = match et {
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File,
            tar::EntryType::Symlink => Kind::Symlink,
            tar::EntryType::Link => Kind::HardLink,
            tar::EntryType::Char | tar::EntryType::Block => bail!(
                "{}: {shown} is a device node: the base must hold none (mmdebstrap runs with \
                 --skip=output/dev; a package that ships one cannot go into the image)",
                path.display()
            ),
            other => bail!(
                "{}: {shown} is a {other:?} entry: a layer holds only directories, files, \
                 symlinks and hard links",
                path.display()
            ),
        };
        let Some(rel) = rel else {
            continue; // the root directory itself
        };
        let link = match kind {
            Kind::Symlink => Some(link_text(&entry, path, &rel)?),
            Kind::HardLink => {
                let target = link_text(&entry, path, &rel)?;
                Some(normalise_path(&target)?.with_context(|| {
                    format!("{}: hard link {rel} points at the root", path.display())
                })?)
            }
            _ => None,
        };
        let header = entry.header();
        let meta = RawEntry {
            kind,
            mode: header.mode()? & 0o7777,
            uid: header.uid()?,
            gid: header.gid()?,
            mtime: header.mtime()?,
            size: if kind == Kind::File { entry.size() } else { 0 },
            data_offset: entry.raw_file_position(),
            link,
            path: rel.clone(),
        };
        if kind == Kind::File {
            if rel == "var/lib/dpkg/status" {
                raw.status = Some(read_text(&mut entry, &rel)?);
            } else if let Some(pkg) = list_package(&rel) {
                let text = read_text(&mut entry, &rel)?;
                raw.lists
                    .entry(pkg)
                    .or_default()
                    .extend(text.lines().map(str::to_string));
            }
        }
        raw.entries.push(meta);
    }
    Ok(raw)
}

fn link_text<R: Read>(entry: &tar::Entry<'_, R>, tar: &Path, rel: &str) -> Result<String> {
    let bytes = entry
        .link_name_bytes()
        .with_context(|| format!("{}: link {rel} has no target", tar.display()))?;
    String::from_utf8(bytes.into_owned())
        .map_err(|_| anyhow::anyhow!("{}: link {rel}'s target is not UTF-8", tar.display()))
}

fn read_text<R: Read>(entry: &mut tar::Entry<'_, R>, rel: &str) -> Result<String> {
    let mut text = String::new();
    entry
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read {rel} from the raw tar (not UTF-8?)"))?;
    Ok(text)
}

/// `./usr/bin/` -> `usr/bin`; `.` or `./` -> None (the root). Absolute paths and `..`
/// are refused: mmdebstrap never writes them, so one means the tar is not what we think.
pub fn normalise_path(name: &str) -> Result<Option<String>> {
    let trimmed = name.strip_prefix("./").unwrap_or(name);
    let trimmed = trimmed.trim_end_matches('/');
    if trimmed.is_empty() || trimmed == "." {
        return Ok(None);
    }
    if trimmed.starts_with('/') || trimmed.split('/').any(|c| c == ".." || c.is_empty()) {
        bail!("{name:?} is not a plain relative path");
    }
    Ok(Some(trimmed.to_string()))
}

/// `var/lib/dpkg/info/libc6:amd64.list` -> `libc6`.
fn list_package(rel: &str) -> Option<String> {
    let file = rel.strip_prefix("var/lib/dpkg/info/")?;
    let stem = file.strip_suffix(".list")?;
    if stem.contains('/') {
        return None;
    }
    Some(stem.split(':').next().unwrap_or(stem).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_relative() {
        assert_eq!(normalise_path("./").unwrap(), None);
        assert_eq!(normalise_path(".").unwrap(), None);
        assert_eq!(normalise_path("./usr/bin/").unwrap().unwrap(), "usr/bin");
        assert_eq!(normalise_path("etc/passwd").unwrap().unwrap(), "etc/passwd");
        assert!(normalise_path("./a/../b").is_err());
        assert!(normalise_path("/etc").is_err());
    }

    #[test]
    fn list_files_name_their_package() {
        assert_eq!(
            list_package("var/lib/dpkg/info/libc6:amd64.list").as_deref(),
            Some("libc6")
        );
        assert_eq!(
            list_package("var/lib/dpkg/info/bash.list").as_deref(),
            Some("bash")
        );
        assert_eq!(list_package("var/lib/dpkg/info/bash.md5sums"), None);
    }
}
