//! Helpers shared by the unpacker's tests: tar entries written raw (so unsafe names can be
//! made), a sandbox around each archive, and the "refused, nothing left" check.
#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::path::PathBuf;

use commstack_archive::{Options, Strip, unpack};
use tar::EntryType;

/// One tar entry, names and link targets written raw into the header (so `..` and
/// absolute names can be made).
pub struct E<'a> {
    pub name: &'a str,
    pub kind: EntryType,
    pub mode: u32,
    pub link: Option<&'a str>,
    pub data: &'a [u8],
}

pub fn file<'a>(name: &'a str, mode: u32, data: &'a [u8]) -> E<'a> {
    E {
        name,
        kind: EntryType::Regular,
        mode,
        link: None,
        data,
    }
}
pub fn dir(name: &str, mode: u32) -> E<'_> {
    E {
        name,
        kind: EntryType::Directory,
        mode,
        link: None,
        data: b"",
    }
}
pub fn sym<'a>(name: &'a str, target: &'a str) -> E<'a> {
    E {
        name,
        kind: EntryType::Symlink,
        mode: 0o777,
        link: Some(target),
        data: b"",
    }
}
pub fn hard<'a>(name: &'a str, target: &'a str) -> E<'a> {
    E {
        name,
        kind: EntryType::Link,
        mode: 0o644,
        link: Some(target),
        data: b"",
    }
}
pub fn special(name: &str, kind: EntryType) -> E<'_> {
    E {
        name,
        kind,
        mode: 0o644,
        link: None,
        data: b"",
    }
}

pub fn tar_bytes(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        let old = h.as_old_mut();
        old.name[..e.name.len()].copy_from_slice(e.name.as_bytes());
        if let Some(l) = e.link {
            old.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_entry_type(e.kind);
        h.set_mode(e.mode);
        h.set_size(e.data.len() as u64);
        h.set_cksum();
        b.append(&h, e.data).unwrap();
    }
    b.into_inner().unwrap()
}

pub fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// A sandbox: the archive in `in/`, the destination `out/dest`.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub archive: PathBuf,
}

impl Sandbox {
    pub fn new(name: &str, bytes: &[u8]) -> Sandbox {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("in")).unwrap();
        let archive = dir.path().join("in").join(name);
        fs::write(&archive, bytes).unwrap();
        Sandbox { dir, archive }
    }
    pub fn dest(&self) -> PathBuf {
        self.dir.path().join("out/dest")
    }
    /// Everything in the sandbox but the archive, relative.
    pub fn written(&self) -> Vec<String> {
        walkdir::WalkDir::new(self.dir.path())
            .min_depth(1)
            .into_iter()
            .map(|e| e.unwrap().path().to_path_buf())
            .filter(|p| p != &self.archive && p != &self.dir.path().join("in"))
            .map(|p| {
                p.strip_prefix(self.dir.path())
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect()
    }
    /// Refused with an error mentioning each of `needles`, and nothing written anywhere
    /// (`out/`, the destination's parent, is all that may exist, and empty).
    pub fn refused(&self, options: &Options, needles: &[&str]) -> String {
        let err = format!(
            "{:#}",
            unpack(&self.archive, &self.dest(), options).unwrap_err()
        );
        for n in needles {
            assert!(err.contains(n), "{n:?} not in: {err}");
        }
        assert!(!self.dest().exists(), "{err}");
        assert_eq!(self.written(), ["out"], "left behind after: {err}");
        err
    }
}

pub fn top() -> Options {
    Options::strip(Strip::TopDir)
}
