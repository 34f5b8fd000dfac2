//! One image layer: a directory tree written as a tar whose bytes depend only on the
//! tree's contents. Entries sorted by path, mtimes clamped to the epoch, uid/gid 0 with no
//! names, modes normalised (0755 for directories and executables, 0644 for other files),
//! hard links kept as hard links to the first path seen, GNU long names (no PAX headers,
//! so no PAX timestamps). Umask, the build directory and the clock do not reach the bytes.
//! [`write_layer_owned`] gives chosen paths another owner (the image user's home); with
//! no rule the bytes are [`write_layer`]'s.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::Digest;

use commstack_digest::HashingWriter;

/// A written layer tar and its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    pub path: PathBuf,
    /// `sha256:<hex>` of the uncompressed tar: the image config's rootfs diff_id.
    pub diff_id: String,
    pub size: u64,
}

/// An owner rule: the entry at `path` (relative, as in the tar) and everything under it
/// get `uid`/`gid` instead of 0. The longest matching rule wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub path: PathBuf,
    pub uid: u64,
    pub gid: u64,
}

/// Writes `root`'s tree (its contents, not `root` itself) as a layer tar at `out`.
pub fn write_layer(root: &Path, out: &Path, epoch: u64) -> Result<Layer> {
    write_layer_owned(root, out, epoch, &[])
}

/// [`write_layer`] with owner rules: what belongs to the image user is owned by it.
pub fn write_layer_owned(root: &Path, out: &Path, epoch: u64, owners: &[Owner]) -> Result<Layer> {
    let file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let hashing = HashingWriter::new(BufWriter::new(file));
    let mut builder = tar::Builder::new(hashing);
    builder.follow_symlinks(false);
    // Path of the first entry seen for each (device, inode) with several links.
    let mut first_of: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let walk = walkdir::WalkDir::new(root)
        .min_depth(1)
        .follow_links(false)
        .sort_by(|a, b| {
            a.file_name()
                .as_encoded_bytes()
                .cmp(b.file_name().as_encoded_bytes())
        });
    for entry in walk {
        let entry = entry.with_context(|| format!("cannot walk {}", root.display()))?;
        let rel = entry
            .path()
            .strip_prefix(root)
            .expect("under root")
            .to_path_buf();
        let meta = entry
            .path()
            .symlink_metadata()
            .with_context(|| format!("cannot stat {}", entry.path().display()))?;
        let mut header = tar::Header::new_gnu();
        let (uid, gid) = owners
            .iter()
            .filter(|o| rel.starts_with(&o.path))
            .max_by_key(|o| o.path.components().count())
            .map_or((0, 0), |o| (o.uid, o.gid));
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_mtime((meta.mtime().max(0) as u64).min(epoch));
        let ft = meta.file_type();
        if ft.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder.append_data(&mut header, &rel, std::io::empty())?;
        } else if ft.is_symlink() {
            let target = fs::read_link(entry.path())?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_mode(0o777);
            header.set_size(0);
            builder.append_link(&mut header, &rel, &target)?;
        } else if ft.is_file() {
            let key = (meta.dev(), meta.ino());
            if meta.nlink() > 1 {
                if let Some(first) = first_of.get(&key) {
                    header.set_entry_type(tar::EntryType::Link);
                    header.set_mode(file_mode(meta.mode()));
                    header.set_size(0);
                    builder.append_link(&mut header, &rel, first)?;
                    continue;
                }
                first_of.insert(key, rel.clone());
            }
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(file_mode(meta.mode()));
            header.set_size(meta.len());
            let data = File::open(entry.path())
                .with_context(|| format!("cannot read {}", entry.path().display()))?;
            builder.append_data(&mut header, &rel, data)?;
        } else {
            bail!(
                "{}: not a file, directory or symlink: an image layer holds none of those",
                entry.path().display()
            );
        }
    }
    let mut hashing = builder.into_inner()?;
    hashing.flush()?;
    Ok(Layer {
        path: out.to_path_buf(),
        diff_id: format!("sha256:{}", hex::encode(hashing.hasher.finalize())),
        size: hashing.size,
    })
}

/// 0755 when any execute bit is set, else 0644: the same file gives the same mode
/// whatever umask it was written under.
fn file_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 { 0o755 } else { 0o644 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_rules_own_a_subtree_and_no_rule_is_write_layer() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("tree");
        fs::create_dir_all(root.join("home/u/.config")).unwrap();
        fs::write(root.join("home/u/.config/x"), "x").unwrap();
        fs::create_dir_all(root.join("home/other")).unwrap();
        fs::write(root.join("etc"), "e").unwrap();
        let plain = write_layer(&root, &dir.path().join("a.tar"), 0).unwrap();
        let none = write_layer_owned(&root, &dir.path().join("b.tar"), 0, &[]).unwrap();
        assert_eq!(plain.diff_id, none.diff_id);
        let owners = [Owner {
            path: PathBuf::from("home/u"),
            uid: 1000,
            gid: 1001,
        }];
        let owned = write_layer_owned(&root, &dir.path().join("c.tar"), 0, &owners).unwrap();
        let mut archive = tar::Archive::new(File::open(&owned.path).unwrap());
        let ids: Vec<(String, u64, u64)> = archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().display().to_string(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                )
            })
            .collect();
        let expect = |p: &str, ids_: (u64, u64)| {
            let found = ids.iter().find(|(n, _, _)| n.trim_end_matches('/') == p);
            assert_eq!(found.map(|(_, u, g)| (*u, *g)), Some(ids_), "{p}: {ids:?}");
        };
        expect("home", (0, 0));
        expect("home/u", (1000, 1001));
        expect("home/u/.config/x", (1000, 1001));
        expect("home/other", (0, 0));
        expect("etc", (0, 0));
    }
}
