//! Any bytes, as a .tar, .tar.gz or .zip (the first byte picks), through the one
//! unpacker: it may refuse, it must not crash, and nothing may be written outside the
//! destination, nor may a link in it lead outside.
//!
//! Then hash-then-unpack agreement: the tree a source step builds from (unpacked with the
//! top directory stripped, `.git` left out, checked before it is moved into place) is the
//! tree the tree hash reads (`with_unpacked`, as `commstack_fetch::tree` hashes an
//! archive), with the definition's single top directory stripped; and two readings of one
//! archive agree. The tree hash is a function of exactly this listing (paths, contents,
//! executable bits, link targets: tree.rs's definition, step 4), so whatever it hashes
//! equal, the steps write equal.

#![no_main]

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use commstack_archive::{Limits, Options, Strip, unpack, unpack_checked, with_unpacked};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let root = sandbox.path();
    for dir in ["in", "out", "beside"] {
        std::fs::create_dir(root.join(dir)).unwrap();
    }
    let name = ["a.tar", "a.tar.gz", "a.zip"][usize::from(pick % 3)];
    let strip = [Strip::None, Strip::TopDirIfSingle, Strip::TopDir][usize::from(pick / 3 % 3)];
    let archive = root.join("in").join(name);
    std::fs::write(&archive, bytes).unwrap();
    let dest = root.join("out/dest");
    let options = Options {
        strip,
        limits: limits(),
        // Untrusted input: absolute links refused, as for every download.
        keep_absolute_symlinks: false,
        drop_git: pick & 8 != 0,
        // The archive's modes applied, the harder case for cleanup (wheel_install has the other).
        plain_dir_modes: false,
    };
    let result = unpack(&archive, &dest, &options);
    let real_dest = dest.canonicalize().ok();
    // Errors inside the walk come from directories the archive made unreadable (mode
    // 000), which can only be under dest: nothing to check there.
    for entry in walkdir::WalkDir::new(root)
        .min_depth(1)
        .into_iter()
        .flatten()
    {
        let path = entry.into_path();
        let allowed = path.starts_with(root.join("in"))
            || path == root.join("out")
            || path == root.join("beside")
            || path.starts_with(&dest);
        assert!(
            allowed,
            "written outside the destination: {}",
            path.display()
        );
        if result.is_err() {
            assert!(
                !path.starts_with(&dest),
                "a refused archive left {}",
                path.display()
            );
        }
        if path.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            assert!(!target.is_absolute(), "absolute link {}", path.display());
            // Followed through every link on the way (chains like a -> ., b -> a/..).
            let resolved = match path.canonicalize() {
                Ok(real) => Some(real),
                Err(_) => path
                    .parent()
                    .and_then(|p| p.canonicalize().ok())
                    .map(|p| lexical(&p.join(&target))),
            };
            if let (Some(resolved), Some(real_dest)) = (resolved, &real_dest) {
                assert!(
                    resolved.starts_with(real_dest),
                    "link {} -> {} leads to {}",
                    path.display(),
                    target.display(),
                    resolved.display()
                );
            }
        }
    }
    give_back(&dest);
    agreement(&archive, root);
});

fn limits() -> Limits {
    Limits {
        max_bytes: 1 << 20,
        min_expansion: 4 << 20,
        max_entries: 1000,
        min_free: 0,
        ..Limits::default()
    }
}

/// What the tree hash reads of a tree: files (executable?, content) and symlinks (target)
/// by path; directories do not count.
#[derive(Debug, PartialEq, Eq)]
enum Item {
    File(bool, Vec<u8>),
    Link(Vec<u8>),
}

fn listing(dir: &Path) -> BTreeMap<Vec<u8>, Item> {
    let mut out = BTreeMap::new();
    for entry in walkdir::WalkDir::new(dir).min_depth(1) {
        let entry = entry.expect("the tree is readable (root)");
        let rel = entry
            .path()
            .strip_prefix(dir)
            .unwrap()
            .as_os_str()
            .as_bytes()
            .to_vec();
        let ft = entry.file_type();
        if ft.is_symlink() {
            let target = std::fs::read_link(entry.path()).unwrap();
            out.insert(rel, Item::Link(target.as_os_str().as_bytes().to_vec()));
        } else if ft.is_file() {
            let x = entry.metadata().unwrap().permissions().mode() & 0o111 != 0;
            out.insert(rel, Item::File(x, std::fs::read(entry.path()).unwrap()));
        }
    }
    out
}

/// The definition's step 3: the single top directory every entry lies under, stripped.
fn strip_single_top(items: BTreeMap<Vec<u8>, Item>) -> BTreeMap<Vec<u8>, Item> {
    let first = |p: &[u8]| p.split(|&b| b == b'/').next().unwrap_or_default().to_vec();
    let tops: std::collections::BTreeSet<Vec<u8>> = items.keys().map(|p| first(p)).collect();
    if tops.len() != 1 || !items.keys().all(|p| p.contains(&b'/')) {
        return items;
    }
    items
        .into_iter()
        .map(|(p, i)| {
            (
                p[p.iter().position(|&b| b == b'/').unwrap() + 1..].to_vec(),
                i,
            )
        })
        .collect()
}

fn agreement(archive: &Path, root: &Path) {
    // As commstack_fetch::tree reads an archive: `.git` left out, links checked inside the
    // top directory the definition strips (a link leaving it once hashed, then the step
    // refused it: fuzz/corpus/unpack/link-leaves-the-stripped-top).
    let hashing = Options {
        strip: Strip::TopDirIfSingle,
        drop_git: true,
        limits: limits(),
        ..Options::default()
    };
    let scratch = root.join("scratch");
    let hashed = with_unpacked(archive, &scratch, &hashing, |tree| Ok(listing(tree)));
    let again = with_unpacked(archive, &scratch, &hashing, |tree| Ok(listing(tree)));
    assert_eq!(
        hashed.as_ref().ok(),
        again.as_ref().ok(),
        "two readings of one archive differ"
    );
    // Checking links inside the top directory only refuses more: what is hashed, the
    // unstripped reading accepts and lists alike.
    if let Ok(hashed) = &hashed {
        let plain = Options {
            strip: Strip::None,
            ..hashing
        };
        let unstripped = with_unpacked(archive, &scratch, &plain, |tree| Ok(listing(tree)));
        assert_eq!(
            unstripped.as_ref().ok(),
            Some(hashed),
            "the unstripped reading differs"
        );
    }
    let step = hashing;
    let built = root.join("out/built");
    let mut seen = None;
    let placed = unpack_checked(archive, &built, &step, |tree| {
        seen = Some(listing(tree));
        Ok(())
    });
    match (hashed, placed) {
        (Ok(hashed), Ok(_)) => {
            assert_eq!(
                seen.as_ref(),
                Some(&hashed),
                "the checked tree is not the hashed one"
            );
            let written = listing(&built);
            give_back(&built);
            assert!(
                written == strip_single_top(hashed),
                "the tree built from differs from the tree hashed"
            );
        }
        (Err(_), Err(_)) => {}
        (Ok(_), Err(e)) => panic!("hashed, but the step refused it: {e:#}"),
        (Err(e), Ok(_)) => panic!("the step wrote a tree that has no hash: {e:#}"),
    }
    assert!(
        std::fs::read_dir(&scratch).map_or(true, |mut d| d.next().is_none()),
        "the hash left its scratch tree"
    );
}

/// Directories the archive made read-only or unreadable: give them back for cleanup
/// (each is yielded before the walk reads it).
fn give_back(dir: &Path) {
    for entry in walkdir::WalkDir::new(dir).into_iter().flatten() {
        if entry.file_type().is_dir() {
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o755));
        }
    }
}

/// `path` with `.` and `..` resolved by text.
fn lexical(path: &Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
