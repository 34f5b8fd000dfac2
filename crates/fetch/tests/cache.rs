//! `cache ls|verify|gc`, and several processes fetching into one cache at once.

mod common;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use commstack_fetch::{Artifact, Cache, Origin, fetch_all};
use commstack_testkit::{Behavior, Route, TestServer};

#[test]
fn ls_verify_and_gc() {
    let server = TestServer::start();
    let cache_dir = tempfile::tempdir().unwrap();
    let artifacts: Vec<_> = (0..3)
        .map(|i| {
            serve(
                &server,
                &format!("c{i}"),
                &format!("/c{i}.whl"),
                &bytes(5_000, i),
            )
        })
        .collect();
    let fetched = fetch_all(&artifacts, &options(cache_dir.path())).unwrap();
    let cache = Cache::new(cache_dir.path());
    let entries = cache.ls().unwrap();
    let names: Vec<_> = entries
        .iter()
        .map(|e| (e.filename.as_str(), e.size))
        .collect();
    assert_eq!(
        names,
        [("c0.whl", 5_000), ("c1.whl", 5_000), ("c2.whl", 5_000)]
    );

    // Corrupt one file behind the cache's back.
    std::fs::write(&fetched[1].path, b"bit rot").unwrap();
    let (checked, corrupt) = cache.verify(false).unwrap();
    assert_eq!((checked, corrupt.len()), (3, 1));
    assert_eq!(corrupt[0].entry.filename, "c1.whl");
    assert_eq!(corrupt[0].actual_sha256, sha256(b"bit rot"));
    assert!(fetched[1].path.exists(), "verify without remove keeps it");
    let (_, corrupt) = cache.verify(true).unwrap();
    assert!(corrupt[0].removed && !fetched[1].path.exists());
    // The next fetch brings it back.
    let again = fetch_all(&artifacts, &options(cache_dir.path())).unwrap();
    assert!(matches!(again[1].origin, Origin::Upstream { .. }));
    assert!(cache.verify(false).unwrap().1.is_empty());

    // gc keeps what is named, drops the rest and stale partial downloads.
    std::fs::write(cache.partial_path(&"f".repeat(64)), b"half").unwrap();
    let keep: HashSet<String> = [sha(&artifacts[0]).to_string()].into();
    let dry = cache.gc(&keep, true).unwrap();
    assert_eq!(
        (dry.removed.len(), dry.partials.len(), dry.bytes_freed),
        (2, 1, 10_004)
    );
    assert_eq!(cache.ls().unwrap().len(), 3, "a dry run removes nothing");
    let report = cache.gc(&keep, false).unwrap();
    assert_eq!(report.removed.len(), 2);
    assert_cache_holds(cache_dir.path(), &[(sha(&artifacts[0]), "c0.whl")]);
    assert!(!cache.partial_path(&"f".repeat(64)).exists());
}

#[test]
fn gc_leaves_a_digest_alone_while_a_fetch_holds_its_lock() {
    let server = TestServer::start();
    let cache_dir = tempfile::tempdir().unwrap();
    let artifact = serve(&server, "held", "/held.whl", &bytes(1_000, 1));
    fetch_all(std::slice::from_ref(&artifact), &options(cache_dir.path())).unwrap();
    let cache = Cache::new(cache_dir.path());
    let held = cache
        .try_lock(sha(&artifact))
        .unwrap()
        .expect("nobody holds it");
    assert!(
        cache.try_lock(sha(&artifact)).unwrap().is_none(),
        "a second open file is refused the lock"
    );
    assert!(cache.gc(&HashSet::new(), false).unwrap().removed.is_empty());
    drop(held);
    assert_eq!(cache.gc(&HashSet::new(), false).unwrap().removed.len(), 1);
}

/// The child half of `four_processes_fetch_into_one_cache`: run only when that test
/// spawns this binary with the job in the environment.
#[test]
#[ignore = "run as a child process by four_processes_fetch_into_one_cache"]
fn child_fetch_process() {
    let job = std::env::var("COMMSTACK_FETCH_CHILD_JOB")
        .expect("COMMSTACK_FETCH_CHILD_JOB unset: this is the child half of four_processes_fetch_into_one_cache, not a test of its own");
    let (cache, artifacts): (String, Vec<Artifact>) = serde_json::from_str(&job).unwrap();
    let fetched = fetch_all(&artifacts, &options(std::path::Path::new(&cache))).unwrap();
    // After a newline: the harness has already printed "test NAME ... " on this line.
    println!("\nFETCHED {}", serde_json::to_string(&fetched).unwrap());
}

#[test]
fn four_processes_fetch_into_one_cache() {
    let server = TestServer::start();
    let cache_dir = tempfile::tempdir().unwrap();
    // Slow enough that the four processes overlap.
    let slow = Behavior::Slow {
        chunk: 64 * 1024,
        delay: Duration::from_millis(15),
    };
    let artifacts: Vec<_> = (0..4)
        .map(|i| {
            let data = bytes(1_000_000 + i, i as u8);
            let path = format!("/w/pkg{i}-1.0-py3-none-any.whl");
            server.route(&path, Route::ok(data.clone()).behavior(slow.clone()));
            artifact(&server, &format!("pkg{i}"), &path, &data)
        })
        .collect();
    let job = serde_json::to_string(&(cache_dir.path(), &artifacts)).unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "child_fetch_process",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("COMMSTACK_FETCH_CHILD_JOB", &job)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut downloads = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("FETCHED "))
            .expect("the child printed its result");
        let fetched: serde_json::Value = serde_json::from_str(line).unwrap();
        let fetched = fetched.as_array().unwrap();
        assert_eq!(fetched.len(), 4);
        downloads += fetched
            .iter()
            .filter(|f| f["origin"]["kind"] == "upstream")
            .count();
    }
    // Each file was downloaded by exactly one process; the others waited and used it.
    assert_eq!(downloads, 4);
    for artifact in &artifacts {
        let path = format!("/w/{}", artifact.filename);
        assert_eq!(server.hits(&path), 1, "{path} downloaded more than once");
    }
    let expected: Vec<(String, String)> = artifacts
        .iter()
        .map(|a| (sha(a).to_string(), a.filename.clone()))
        .collect();
    let expected: Vec<(&str, &str)> = expected
        .iter()
        .map(|(s, f)| (s.as_str(), f.as_str()))
        .collect();
    assert_cache_holds(cache_dir.path(), &expected);
    let leftovers = std::fs::read_dir(cache_dir.path().join("tmp"))
        .unwrap()
        .count();
    assert_eq!(leftovers, 0, "no partial file left behind");
}

/// A byte flipped in a cached file: a consumer's check quarantines it and says where, the
/// next fetch downloads it again (no "cached" loop); `verify` catches it in fetch itself.
#[test]
fn damaged_cache_files_are_quarantined_and_fetched_again() {
    let server = commstack_testkit::TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let data = bytes(4096, 9);
    let a = serve(&server, "a", "/a.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&a), &options(&cache)).unwrap();
    let path = fetched[0].path.clone();
    let flip = |p: &std::path::Path| {
        let mut b = std::fs::read(p).unwrap();
        b[100] ^= 1;
        std::fs::write(p, b).unwrap();
    };
    flip(&path);

    // Under a second name too (a hard link to the same damaged bytes): both go.
    let alias = path.with_file_name("alias.whl");
    std::fs::hard_link(&path, &alias).unwrap();
    let err = commstack_fetch::check_cached_file(&path, &sha256(&data)).unwrap_err();
    assert!(
        !alias.exists(),
        "the damaged bytes' other name stayed in the cache"
    );
    assert!(
        err.contains("is damaged")
            && err.contains("quarantine")
            && err.contains("cargo xtask fetch"),
        "{err}"
    );
    assert!(!path.exists());
    let quarantined = std::fs::read_dir(cache.join("quarantine")).unwrap().count();
    assert_eq!(quarantined, 1);
    let again = fetch_all(std::slice::from_ref(&a), &options(&cache)).unwrap();
    assert_eq!(
        again[0].bytes_downloaded,
        data.len() as u64,
        "downloaded again"
    );
    commstack_fetch::check_cached_file(&again[0].path, &sha256(&data)).unwrap();

    // Damaged again: plain fetch trusts the cache, --verify does not.
    flip(&again[0].path);
    let trusted = fetch_all(std::slice::from_ref(&a), &options(&cache)).unwrap();
    assert_eq!(trusted[0].bytes_downloaded, 0);
    let mut verify = options(&cache);
    verify.verify = true;
    let checked = fetch_all(std::slice::from_ref(&a), &verify).unwrap();
    assert_eq!(checked[0].bytes_downloaded, data.len() as u64);
    assert_eq!(std::fs::read(&checked[0].path).unwrap(), data);
    assert_eq!(
        std::fs::read_dir(cache.join("quarantine")).unwrap().count(),
        2
    );
}
