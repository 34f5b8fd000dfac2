//! `cargo xtask lock` as a user runs it: files written whole or not at all, no network when
//! nothing changed, `--check` offline with a readable diff, errors pointing into stack.toml.

use std::path::Path;
use std::process::Output;

use commstack_testkit::pypi::{FixtureIndex, WheelSpec};
use commstack_testkit::{Behavior, TestServer};

mod common;
use common::text;

fn index() -> FixtureIndex {
    let mut ix = common::torch_index("3.4.5");
    ix.add(WheelSpec::new("six", "1.17.0"));
    ix
}

fn manifest(url: &str) -> String {
    format!(
        "[target]\npython = \"3.12\"\nbase = \"ubuntu-24.04\"\n\n[torch]\nversion = \"2.11.0\"\ncuda = 13\n\n\
         [nvshmem]\nversion = \"match-torch\"\ncuda-archs = [\"90\"]\n\n[deepep]\nrev = \"567632d\"\napi = \"v1\"\n\n\
         [resolve]\nindex-url = \"{url}\"\n"
    )
}

fn xtask(dir: &Path, args: &[&str]) -> Output {
    common::xtask_in(dir, &dir.join("home"), args)
}

#[test]
fn lock_then_noop_then_check() {
    let server = TestServer::start();
    let url = index().serve(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stack.toml"), manifest(&url)).unwrap();

    let out = xtask(dir.path(), &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    let lock = std::fs::read_to_string(dir.path().join("stack.lock")).unwrap();
    assert!(lock.contains("name = \"torch\""));
    let reqs = std::fs::read_to_string(dir.path().join("requirements.lock")).unwrap();
    assert!(reqs.contains("torch==2.11.0 \\\n    --hash=sha256:"));

    // Nothing changed: no connection at all.
    let before = server.connections();
    let out = xtask(dir.path(), &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("up to date"), "{}", text(&out));
    assert_eq!(
        server.connections(),
        before,
        "a no-op lock must not touch the network"
    );

    let out = xtask(dir.path(), &["lock", "--check"]);
    assert!(out.status.success(), "{}", text(&out));

    // Change the manifest: --check fails offline and says what changed.
    drop(server);
    let changed = std::fs::read_to_string(dir.path().join("stack.toml"))
        .unwrap()
        .replace("cuda-archs = [\"90\"]", "cuda-archs = [\"90\", \"100\"]");
    std::fs::write(dir.path().join("stack.toml"), changed).unwrap();
    let out = xtask(dir.path(), &["lock", "--check"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("stack.lock is out of date"), "{t}");
    assert!(
        t.contains("nvshmem.cuda-archs: the lock has \"90\", stack.toml says \"90,100\""),
        "{t}"
    );
    assert!(t.contains("run `cargo xtask lock`"), "{t}");

    // A hand-edited requirements file is caught too.
    std::fs::write(dir.path().join("stack.toml"), manifest(&url)).unwrap();
    std::fs::write(dir.path().join("requirements.lock"), "torch==2.11.0\n").unwrap();
    let out = xtask(dir.path(), &["lock", "--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).contains("requirements.lock does not match stack.lock"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_failed_lock_leaves_the_old_files_untouched() {
    let server = TestServer::start();
    let ix = index();
    let url = ix.serve(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stack.toml"), manifest(&url)).unwrap();
    assert!(xtask(dir.path(), &["lock"]).status.success());
    let lock = std::fs::read(dir.path().join("stack.lock")).unwrap();
    let reqs = std::fs::read(dir.path().join("requirements.lock")).unwrap();

    ix.misbehave(
        &server,
        "torch",
        Behavior::FailFirst {
            n: 1000,
            status: 503,
            retry_after: None,
        },
    );
    let with_extra = manifest(&url) + "extra-requirements = [\"six\"]\n";
    std::fs::write(dir.path().join("stack.toml"), with_extra).unwrap();
    let out = xtask(dir.path(), &["lock"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("/simple/torch/ answered 503"),
        "{}",
        text(&out)
    );
    assert_eq!(std::fs::read(dir.path().join("stack.lock")).unwrap(), lock);
    assert_eq!(
        std::fs::read(dir.path().join("requirements.lock")).unwrap(),
        reqs
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn relock_keeps_comments() {
    let server = TestServer::start();
    let url = index().serve(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stack.toml"), manifest(&url)).unwrap();
    assert!(xtask(dir.path(), &["lock"]).status.success());
    let lock = std::fs::read_to_string(dir.path().join("stack.lock")).unwrap();
    let annotated = lock.replacen(
        "[[package]]\nname = \"torch\"",
        "# audited 2026-12-02\n[[package]]\nname = \"torch\"",
        1,
    );
    assert_ne!(annotated, lock);
    std::fs::write(dir.path().join("stack.lock"), &annotated).unwrap();
    std::fs::write(
        dir.path().join("stack.toml"),
        manifest(&url) + "extra-requirements = [\"six\"]\n",
    )
    .unwrap();
    let out = xtask(dir.path(), &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    let relocked = std::fs::read_to_string(dir.path().join("stack.lock")).unwrap();
    assert!(
        relocked.contains("# audited 2026-12-02\n[[package]]\nname = \"torch\""),
        "{relocked}"
    );
    assert!(relocked.contains("name = \"six\""));
}

#[test]
fn bad_manifest_points_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad =
        manifest("https://pypi.org/simple").replace("cuda = 13", "cuda = 13\nnccl = \"2.28.9\"");
    std::fs::write(dir.path().join("stack.toml"), bad).unwrap();
    let out = xtask(dir.path(), &["lock"]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("stack.toml:8:1: unknown field `nccl`"), "{t}");
    assert!(!dir.path().join("stack.lock").exists());

    let out = xtask(dir.path(), &["--stack", "nope.toml", "lock"]);
    assert!(
        text(&out).contains("cannot read the stack manifest nope.toml (pick one with --stack FILE"),
        "{}",
        text(&out)
    );
}

/// A sha256 edited consistently in stack.lock and requirements.lock passes the offline
/// check (it cannot know better); `--check --online` compares with the index and names the
/// package; `lock --force` (the command its message names) writes the index's hash back.
#[test]
fn a_consistently_edited_hash_is_caught_online_and_repaired_by_force() {
    let server = TestServer::start();
    let url = index().serve(&server);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("stack.toml"), manifest(&url)).unwrap();
    let out = xtask(dir.path(), &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    let lock_path = dir.path().join("stack.lock");
    let req_path = dir.path().join("requirements.lock");
    let (lock, reqs) = (
        std::fs::read_to_string(&lock_path).unwrap(),
        std::fs::read_to_string(&req_path).unwrap(),
    );
    let marker = "torch==2.11.0 \\\n    --hash=sha256:";
    let at = reqs.find(marker).unwrap() + marker.len();
    let good = &reqs[at..at + 64];
    assert!(lock.contains(good));
    let evil = "f".repeat(64);
    std::fs::write(&lock_path, lock.replace(good, &evil)).unwrap();
    std::fs::write(&req_path, reqs.replace(good, &evil)).unwrap();

    let out = xtask(dir.path(), &["lock", "--check"]);
    assert!(out.status.success(), "offline cannot know: {}", text(&out));
    let out = xtask(dir.path(), &["lock", "--check", "--online"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("stack.lock does not match the index"), "{t}");
    assert!(
        t.contains("torch (") && t.contains(&evil) && t.contains(good),
        "{t}"
    );
    assert!(t.contains("run `cargo xtask lock --force`"), "{t}");

    let out = xtask(dir.path(), &["lock", "--force"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&lock_path).unwrap(), lock);
    assert_eq!(std::fs::read_to_string(&req_path).unwrap(), reqs);
    let out = xtask(dir.path(), &["lock", "--check", "--online"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("every hash matches the index"),
        "{}",
        text(&out)
    );
}

/// The Debian fixture's Packages.gz (commstack-debian's tests).
fn packages_gz() -> Vec<u8> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/debian/tests/fixtures/Packages.gz");
    std::fs::read(path).unwrap()
}

/// The noble InRelease signed by `key`, dated `days_ago` days before now.
fn inrelease(key: &commstack_testkit::debian::ArchiveKey, days_ago: i64) -> Vec<u8> {
    let date = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24 * days_ago);
    let text = commstack_testkit::debian::release_text(
        "noble",
        "noble",
        &date.strftime("%a, %d %b %Y %H:%M:%S UTC").to_string(),
        None,
        &[("main/binary-amd64/Packages.gz", &packages_gz())],
    );
    key.clearsign(&text)
}

/// `lock --force` with a stack.lock in place: the mirror's index must not be older than the
/// one that lock records (the flow passes the old lock to the resolver).
#[test]
fn relocking_refuses_a_mirror_index_older_than_the_lock_records() {
    let server = TestServer::start();
    let url = index().serve(&server);
    let key = commstack_testkit::debian::ArchiveKey::new();
    let inrelease_path = "/ubuntu/dists/noble/InRelease";
    server.route(
        "/ubuntu/dists/noble/main/binary-amd64/Packages.gz",
        commstack_testkit::Route::ok(packages_gz()),
    );
    server.route(
        inrelease_path,
        commstack_testkit::Route::ok(inrelease(&key, 1)),
    );
    let dir = tempfile::tempdir().unwrap();
    let stack = manifest(&url)
        + &format!(
            "\n[image]\nmirror = \"{}\"\nkeyring = \"{}\"\ninclude = [\"app\"]\n",
            server.url("/ubuntu"),
            key.keyring().display()
        );
    std::fs::write(dir.path().join("stack.toml"), stack).unwrap();
    let out = xtask(dir.path(), &["lock"]);
    assert!(out.status.success(), "{}", text(&out));
    let lock_path = dir.path().join("stack.lock");
    let lock = std::fs::read_to_string(&lock_path).unwrap();
    assert!(lock.contains("suite = \"noble\""), "{lock}");

    // The mirror now serves an index older than the one locked: a rollback.
    server.route(
        inrelease_path,
        commstack_testkit::Route::ok(inrelease(&key, 5)),
    );
    let out = xtask(dir.path(), &["lock", "--force"]);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains(
            "older than the index stack.lock already records for this mirror and suite ([base] release-date = "
        ) && said.contains("delete stack.lock and run `cargo xtask lock`"),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&lock_path).unwrap(), lock);
}
