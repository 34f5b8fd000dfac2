//! Writing `rootfs.tar` from mmdebstrap's tar: the bytes depend only on the files.
//!
//! Entries in path order (component by component, as commstack-image's `write_layer`
//! walks a tree: a directory comes before what it holds), GNU headers (long names as GNU
//! extensions, never PAX, so no PAX timestamps), mtimes clamped to the epoch, the
//! packages' own numeric uid/gid and modes (setuid, group shadow, ...) with no user or
//! group names, hard links kept as hard links to the first path of their group in that
//! order. Data is copied from the raw tar by offset: nothing is unpacked.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use sha2::Digest;

use crate::rawtar::{Kind, RawEntry};
use commstack_digest::HashingWriter;

/// The written layer: `sha256:<hex>` of the tar bytes and their size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub diff_id: String,
    pub size: u64,
}

/// Component-wise path order: `a/b` before `a-c` (as a tree walk sorted by name).
pub fn path_order(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// Write `entries` (read from `raw`) to `out` as the normalised layer.
pub fn write_rootfs<'a>(
    raw: &Path,
    entries: &'a [RawEntry],
    out: &Path,
    epoch: u64,
) -> Result<Written> {
    let by_path: HashMap<&'a str, &'a RawEntry> =
        entries.iter().map(|e| (e.path.as_str(), e)).collect();
    // Each hard link's group root: the regular file holding the data (chains followed).
    let root_of = |e: &'a RawEntry| -> Result<&'a str> {
        let mut cur: &'a RawEntry = e;
        for _ in 0..64 {
            match cur.kind {
                Kind::HardLink => {
                    let target = cur.link.as_deref().expect("hard links have a target");
                    cur = by_path.get(target).with_context(|| {
                        format!(
                            "hard link {} points at {target}, which is not in the tar",
                            e.path
                        )
                    })?;
                }
                Kind::File => return Ok(cur.path.as_str()),
                _ => bail!("hard link {} does not end at a regular file", e.path),
            }
        }
        bail!("hard link {} is a loop", e.path)
    };
    let mut order: Vec<&RawEntry> = entries.iter().collect();
    order.sort_by(|a, b| path_order(&a.path, &b.path));
    // The first member of each hard-link group (in output order) carries the data.
    let mut leader: HashMap<&str, &str> = HashMap::new(); // group root -> leader path
    let mut linked: HashMap<&str, bool> = HashMap::new(); // group root -> has links
    for e in &order {
        if matches!(e.kind, Kind::File | Kind::HardLink) {
            let root = root_of(e)?;
            leader.entry(root).or_insert(e.path.as_str());
            if e.kind == Kind::HardLink {
                linked.insert(root, true);
            }
        }
    }

    let file = File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut builder = tar::Builder::new(HashingWriter::new(BufWriter::new(file)));
    let mut data = File::open(raw).with_context(|| format!("cannot open {}", raw.display()))?;
    for e in order {
        let mut header = tar::Header::new_gnu();
        header.set_uid(e.uid);
        header.set_gid(e.gid);
        header.set_mode(e.mode);
        header.set_mtime(e.mtime.min(epoch));
        header.set_size(0);
        let written = match e.kind {
            Kind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                builder.append_data(&mut header, &e.path, std::io::empty())
            }
            Kind::Symlink => {
                header.set_entry_type(tar::EntryType::Symlink);
                let target = e.link.as_deref().expect("symlinks have a target");
                builder.append_link(&mut header, &e.path, target)
            }
            Kind::File | Kind::HardLink => {
                let root = root_of(e)?;
                let lead = leader[root];
                if lead != e.path {
                    header.set_entry_type(tar::EntryType::Link);
                    builder.append_link(&mut header, &e.path, lead)
                } else {
                    let source = by_path[root];
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(source.size);
                    // A hard link's group shares one inode: the data's own mode and owner.
                    if linked.contains_key(root) {
                        header.set_mode(source.mode);
                        header.set_uid(source.uid);
                        header.set_gid(source.gid);
                    }
                    data.seek(SeekFrom::Start(source.data_offset))?;
                    builder.append_data(&mut header, &e.path, (&mut data).take(source.size))
                }
            }
        };
        written.with_context(|| format!("cannot write {} into {}", e.path, out.display()))?;
    }
    let mut hashing = builder.into_inner()?;
    hashing.flush()?;
    Ok(Written {
        diff_id: format!("sha256:{}", hex::encode(hashing.hasher.finalize())),
        size: hashing.size,
    })
}
