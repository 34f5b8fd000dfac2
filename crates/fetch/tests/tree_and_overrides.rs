//! Tree hashes (one definition for directories and archives), accepting a re-packed
//! source archive only when asked, and `--source NAME=PATH` overrides.

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use common::*;
use commstack_digest::sha256_file;
use commstack_fetch::tree::{
    Strip, tree_sha256, tree_sha256_archive_and_file, tree_sha256_dir, unpack_verified,
};
use commstack_fetch::{
    Artifact, Cache, FetchError, Origin, Provenance, SourceError, SourceOverride, TreeCheck,
    fetch_all,
};
use commstack_testkit::{Route, TestServer};

/// `root/pkg/...`: files, an executable, a symlink, an empty dir and a `.git/`.
fn make_tree(root: &Path) -> std::path::PathBuf {
    let pkg = root.join("pkg");
    std::fs::create_dir_all(pkg.join("src")).unwrap();
    std::fs::create_dir_all(pkg.join("bin")).unwrap();
    std::fs::create_dir_all(pkg.join("empty")).unwrap();
    std::fs::create_dir_all(pkg.join(".git/objects")).unwrap();
    std::fs::write(pkg.join("README"), "hello\n").unwrap();
    std::fs::write(pkg.join("src/a.c"), "int a;\n").unwrap();
    std::fs::write(pkg.join("bin/run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(
        pkg.join("bin/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(pkg.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    symlink("src/a.c", pkg.join("link.c")).unwrap();
    pkg
}

fn tar(args: &[&str], cwd: &Path) {
    let status = Command::new("tar")
        .args(args)
        .current_dir(cwd)
        .status()
        .expect("GNU tar on PATH");
    assert!(status.success(), "tar {args:?}");
}

#[test]
fn the_definition_on_a_tiny_tree() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), "hi\n").unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("b/c"), "x").unwrap();
    std::fs::set_permissions(
        dir.path().join("b/c"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    symlink("a", dir.path().join("l")).unwrap();
    let stream = format!(
        "F - a\0{}\nF x b/c\0{}\nL l\0a\n",
        sha256(b"hi\n"),
        sha256(b"x")
    );
    assert_eq!(
        tree_sha256_dir(dir.path()).unwrap(),
        format!("sha256:{}", sha256(stream.as_bytes()))
    );
}

/// The tree hash reads an archive with its top directory stripped, as the source steps
/// unpack it: a link that stays in the archive only through that directory (`top/a -> .`,
/// `top/b -> a/..` is `top/`, but `b -> a/..` in the stripped tree is its parent) has no
/// hash, so `lock` cannot record a source the build would then refuse. The fuzzer found it.
#[test]
fn a_link_leaving_the_stripped_top_directory_has_no_tree_hash() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("top");
    std::fs::create_dir(&top).unwrap();
    std::fs::write(top.join("file"), "x\n").unwrap();
    symlink(".", top.join("a")).unwrap();
    symlink("a/..", top.join("b")).unwrap();
    tar(&["cf", "escape.tar", "top"], dir.path());
    let archive = dir.path().join("escape.tar");
    let err = tree_sha256(&archive, "escape.tar").unwrap_err().to_string();
    assert!(
        err.contains("top/b -> a/.. leaves the destination"),
        "{err}"
    );
    let out = dir.path().join("out");
    let err = unpack_verified(&archive, &out, Strip::TopDirIfSingle, "sha256:00")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("top/b -> a/.. leaves the destination"),
        "{err}"
    );
    assert!(!out.exists());

    // The same links one directory down stay inside the stripped tree: hashed as the
    // directory they come from.
    std::fs::remove_file(top.join("b")).unwrap();
    std::fs::create_dir(top.join("sub")).unwrap();
    symlink(".", top.join("sub/a")).unwrap();
    symlink("a/..", top.join("sub/b")).unwrap();
    tar(&["cf", "inside.tar", "top"], dir.path());
    let inside = dir.path().join("inside.tar");
    let tree = tree_sha256(&inside, "inside.tar").unwrap();
    assert_eq!(tree, tree_sha256_dir(&top).unwrap());
    unpack_verified(&inside, &out, Strip::TopDirIfSingle, &tree).unwrap();
}

/// `lock` reads a source's `.gitmodules` inside the top directory the tree hash strips,
/// by the same rule: an empty directory beside `top/` does not hide it.
#[test]
fn gitmodules_is_read_in_the_stripped_top_directory() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("src/top");
    std::fs::create_dir_all(top.join("third-party/fmt")).unwrap();
    std::fs::create_dir_all(dir.path().join("src/other")).unwrap();
    let modules = "[submodule \"fmt\"]\n\tpath = third-party/fmt\n";
    std::fs::write(top.join(".gitmodules"), modules).unwrap();
    std::fs::write(top.join("setup.py"), "print()\n").unwrap();
    tar(&["cf", "../a.tar", "top", "other"], &dir.path().join("src"));
    let scratch = dir.path().join("scratch");
    let (tree, file) =
        tree_sha256_archive_and_file(&dir.path().join("a.tar"), &scratch, ".gitmodules").unwrap();
    assert_eq!(tree, tree_sha256_dir(&top).unwrap());
    assert_eq!(file.as_deref(), Some(modules.as_bytes()));
}

#[test]
fn directory_tar_gz_and_zip_agree_and_ignore_metadata() {
    let work = tempfile::tempdir().unwrap();
    let pkg = make_tree(work.path());
    let from_dir = tree_sha256_dir(&pkg).unwrap();
    // The parent holds only pkg/: the single top-level directory is stripped there too.
    assert_eq!(tree_sha256_dir(work.path()).unwrap(), from_dir);

    tar(&["-czf", "a.tar.gz", "pkg"], work.path());
    tar(
        &[
            "-czf",
            "b.tgz",
            "--mtime=2001-01-01",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
            "pkg",
            ".",
        ],
        work.path(),
    );
    assert_ne!(
        sha256_file(&work.path().join("a.tar.gz")).unwrap(),
        sha256_file(&work.path().join("b.tgz")).unwrap()
    );
    assert_eq!(
        tree_sha256(&work.path().join("a.tar.gz"), "a.tar.gz").unwrap(),
        from_dir
    );
    assert_eq!(
        tree_sha256(&work.path().join("b.tgz"), "b.tgz").unwrap(),
        from_dir
    );

    let zip_path = work.path().join("c.zip");
    write_zip(&zip_path);
    assert_eq!(tree_sha256(&zip_path, "c.zip").unwrap(), from_dir);
}

/// The same tree as `make_tree`, written with the zip crate (unix modes, a symlink).
fn write_zip(path: &Path) {
    use std::io::Write;
    use zip::write::SimpleFileOptions;
    let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let plain = SimpleFileOptions::default().unix_permissions(0o644);
    zip.add_directory("pkg-9.9/", plain).unwrap();
    for (name, content, mode) in [
        ("pkg-9.9/README", "hello\n", 0o644),
        ("pkg-9.9/src/a.c", "int a;\n", 0o644),
        ("pkg-9.9/bin/run.sh", "#!/bin/sh\necho hi\n", 0o755),
        ("pkg-9.9/.git/HEAD", "something else entirely\n", 0o644),
    ] {
        zip.start_file(name, SimpleFileOptions::default().unix_permissions(mode))
            .unwrap();
        zip.write_all(content.as_bytes()).unwrap();
    }
    zip.add_symlink("pkg-9.9/link.c", "src/a.c", plain).unwrap();
    zip.finish().unwrap();
}

#[test]
fn content_mode_and_links_change_the_hash_but_git_does_not() {
    let work = tempfile::tempdir().unwrap();
    let pkg = make_tree(work.path());
    let before = tree_sha256_dir(&pkg).unwrap();
    std::fs::write(pkg.join(".git/HEAD"), "changed\n").unwrap();
    assert_eq!(tree_sha256_dir(&pkg).unwrap(), before);
    std::fs::set_permissions(pkg.join("src/a.c"), std::fs::Permissions::from_mode(0o744)).unwrap();
    let exec = tree_sha256_dir(&pkg).unwrap();
    assert_ne!(exec, before);
    std::fs::remove_file(pkg.join("link.c")).unwrap();
    symlink("README", pkg.join("link.c")).unwrap();
    assert_ne!(tree_sha256_dir(&pkg).unwrap(), exec);
}

/// Two archives of one tree (different mtimes), and one of another tree.
struct Archives {
    locked: Vec<u8>,
    repacked: Vec<u8>,
    other_tree: Vec<u8>,
    tree: String,
    _work: tempfile::TempDir,
}

fn archives() -> Archives {
    let work = tempfile::tempdir().unwrap();
    let pkg = make_tree(work.path());
    let tree = tree_sha256_dir(&pkg).unwrap();
    tar(
        &["-czf", "locked.tar.gz", "--mtime=2020-01-01", "pkg"],
        work.path(),
    );
    tar(
        &["-czf", "repacked.tar.gz", "--mtime=2024-06-01", "pkg"],
        work.path(),
    );
    std::fs::write(pkg.join("README"), "tampered\n").unwrap();
    tar(&["-czf", "other.tar.gz", "pkg"], work.path());
    let read = |name: &str| std::fs::read(work.path().join(name)).unwrap();
    Archives {
        locked: read("locked.tar.gz"),
        repacked: read("repacked.tar.gz"),
        other_tree: read("other.tar.gz"),
        tree,
        _work: work,
    }
}

#[test]
fn a_repacked_archive_is_accepted_only_when_asked_and_says_so() {
    let a = archives();
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    server.route("/src/pkg-1.0.tar.gz", Route::ok(a.repacked.clone()));
    let artifact =
        artifact(&server, "pkg", "/src/pkg-1.0.tar.gz", &a.locked).with_tree_sha256(&a.tree);
    let mut artifact = artifact;
    artifact.size = None; // a repack has its own size

    let err = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap_err();
    let FetchError::Artifacts(failures) = &err else {
        panic!("{err}")
    };
    assert!(matches!(
        &failures[0].attempts[0].error,
        SourceError::HashMismatch {
            tree: TreeCheck::Matches,
            ..
        }
    ));
    assert!(
        err.to_string().contains("pass --accept-tree-match"),
        "{err}"
    );
    assert_cache_holds(cache.path(), &[]);

    let mut accepting = options(cache.path());
    accepting.accept_tree_match = true;
    let fetched = fetch_all(std::slice::from_ref(&artifact), &accepting).unwrap();
    let expected = Provenance::TreeMatch {
        locked_sha256: sha(&artifact).to_string(),
        actual_sha256: sha256(&a.repacked),
        tree_sha256: a.tree.clone(),
    };
    assert_eq!(fetched[0].provenance, expected);
    assert!(!fetched[0].is_locked());
    assert!(fetched[0].deviation().unwrap().contains("TREE MATCH"));
    assert_cache_holds(cache.path(), &[(&sha256(&a.repacked), "pkg-1.0.tar.gz")]);

    // Next run: from the cache, still marked.
    let hits = server.hits("/src/pkg-1.0.tar.gz");
    let again = fetch_all(std::slice::from_ref(&artifact), &accepting).unwrap();
    assert_eq!(
        (again[0].origin.clone(), again[0].provenance.clone()),
        (Origin::Cache, expected)
    );
    assert_eq!(server.hits("/src/pkg-1.0.tar.gz"), hits);
}

#[test]
fn another_tree_is_refused_even_when_accepting_tree_matches() {
    let a = archives();
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    server.route("/pkg.tar.gz", Route::ok(a.other_tree.clone()));
    let mut artifact = artifact(&server, "pkg", "/pkg.tar.gz", &a.locked).with_tree_sha256(&a.tree);
    artifact.size = None;
    let mut options = options(cache.path());
    options.accept_tree_match = true;
    let err = fetch_all(std::slice::from_ref(&artifact), &options).unwrap_err();
    assert!(
        err.to_string().contains("its unpacked tree differs too"),
        "{err}"
    );
    assert_cache_holds(cache.path(), &[]);
}

#[test]
fn a_source_override_replaces_the_artifact_and_is_marked() {
    let a = archives();
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let checkout = tempfile::tempdir().unwrap();
    let pkg = make_tree(checkout.path());
    let locked = serve(&server, "pkg", "/pkg.tar.gz", &a.locked).with_tree_sha256(&a.tree);
    let other = serve(&server, "other", "/other.whl", &bytes(1000, 1));
    let mut options = options(cache.path());
    options.overrides = vec![format!("pkg={}", pkg.display()).parse().unwrap()];
    let fetched = fetch_all(&[locked, other], &options).unwrap();
    assert_eq!(fetched[0].path, pkg.canonicalize().unwrap());
    let Provenance::Override {
        tree_sha256,
        sha256,
        ..
    } = &fetched[0].provenance
    else {
        panic!("{:?}", fetched[0])
    };
    assert_eq!(
        (tree_sha256.as_deref(), sha256.as_deref()),
        (Some(a.tree.as_str()), None)
    );
    assert!(fetched[0].deviation().unwrap().contains("OVERRIDE"));
    assert!(matches!(fetched[0].origin, Origin::Local { .. }));
    assert!(fetched[1].is_locked());
    assert_eq!(
        server.hits("/pkg.tar.gz"),
        0,
        "the overridden artifact was not downloaded"
    );
}

#[test]
fn overrides_must_name_an_artifact_and_an_existing_path() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let artifact = serve(&server, "nvshmem", "/n.tar.gz", &bytes(10, 1));
    let mut options = options(cache.path());
    options.overrides = vec!["nvshmen=/tmp".parse().unwrap()];
    let err = fetch_all(std::slice::from_ref(&artifact), &options).unwrap_err();
    assert!(matches!(err, FetchError::UnknownOverride { .. }));
    assert!(
        err.to_string().contains("its artifacts are: nvshmem"),
        "{err}"
    );
    options.overrides = vec![SourceOverride {
        name: "nvshmem".into(),
        path: "/no/such/dir".into(),
    }];
    let err = fetch_all(std::slice::from_ref(&artifact), &options).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--source nvshmem=/no/such/dir: "),
        "{err}"
    );
    assert!("novalue".parse::<SourceOverride>().is_err());
    assert_eq!(server.connections(), 0);
}

#[test]
fn an_archive_pinned_by_tree_alone_is_checked_by_its_tree() {
    let a = archives();
    let server = TestServer::start();
    let cache_dir = tempfile::tempdir().unwrap();
    server.route("/archive/567632d.tar.gz", Route::ok(a.repacked.clone()));
    server.route("/archive/other.tar.gz", Route::ok(a.other_tree.clone()));
    let pinned =
        Artifact::tree_only("deepep", &server.url("/archive/567632d.tar.gz"), &a.tree).unwrap();
    let fetched = fetch_all(std::slice::from_ref(&pinned), &options(cache_dir.path())).unwrap();
    let expected = Provenance::LockedTree {
        sha256: sha256(&a.repacked),
        tree_sha256: a.tree.clone(),
    };
    assert_eq!(fetched[0].provenance, expected);
    assert!(fetched[0].is_locked() && fetched[0].deviation().is_none());
    assert_cache_holds(
        cache_dir.path(),
        &[(&sha256(&a.repacked), "567632d.tar.gz")],
    );

    let again = fetch_all(std::slice::from_ref(&pinned), &options(cache_dir.path())).unwrap();
    assert_eq!(
        (again[0].origin.clone(), again[0].provenance.clone()),
        (Origin::Cache, expected)
    );
    assert_eq!(server.hits("/archive/567632d.tar.gz"), 1);
    // --verify re-hashes a hit pinned by tree alone too: a damaged one is fetched again.
    let mut bytes = std::fs::read(&again[0].path).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&again[0].path, bytes).unwrap();
    let mut verify = options(cache_dir.path());
    verify.verify = true;
    let repaired = fetch_all(std::slice::from_ref(&pinned), &verify).unwrap();
    assert_eq!(server.hits("/archive/567632d.tar.gz"), 2, "fetched again");
    assert_eq!(std::fs::read(&repaired[0].path).unwrap(), a.repacked);
    // gc keeps it when told which artifacts are in use.
    let cache = Cache::new(cache_dir.path());
    let keep = cache.digests_in_use(std::slice::from_ref(&pinned)).unwrap();
    assert!(cache.gc(&keep, false).unwrap().removed.is_empty());

    let wrong =
        Artifact::tree_only("deepep", &server.url("/archive/other.tar.gz"), &a.tree).unwrap();
    let err = fetch_all(&[wrong], &options(tempfile::tempdir().unwrap().path())).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "tree hash mismatch: expected {}, got sha256:",
            a.tree
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("(archive sha256 {})", sha256(&a.other_tree))),
        "{text}"
    );
}
