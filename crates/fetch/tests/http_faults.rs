//! A real loopback server that misbehaves; every test ends with the right file in the
//! cache or a clear error, never a wrong or partial file in the cache.

mod common;

use std::time::{Duration, Instant};

use common::*;
use commstack_fetch::{FetchError, Origin, SourceError, fetch_all};
use commstack_testkit::{Behavior, Route, TestServer};

#[test]
fn plain_download_lands_in_the_cache_and_second_run_uses_it() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(300_000, 1);
    let artifact = serve(&server, "pkg", "/files/pkg-1.0.tar.gz", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(fetched[0].bytes_downloaded, data.len() as u64);
    assert_eq!(
        fetched[0].origin,
        Origin::Upstream {
            url: artifact.urls[0].clone()
        }
    );
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "pkg-1.0.tar.gz")]);

    let again = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(again[0].origin, Origin::Cache);
    assert_eq!(again[0].bytes_downloaded, 0);
    assert_eq!(server.hits("/files/pkg-1.0.tar.gz"), 1);
}

#[test]
fn truncated_bodies_are_resumed_with_range_until_complete() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(100_000, 2);
    server.route(
        "/t.whl",
        Route::ok(data.clone()).behavior(Behavior::Truncate { after: 30_000 }),
    );
    let artifact = artifact(&server, "t", "/t.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    let ranges: Vec<_> = server
        .requests_for("/t.whl")
        .into_iter()
        .map(|r| r.range)
        .collect();
    assert_eq!(
        ranges,
        [
            None,
            Some("bytes=30000-".into()),
            Some("bytes=60000-".into()),
            Some("bytes=90000-".into())
        ]
    );
    assert_eq!(
        fetched[0].bytes_downloaded,
        data.len() as u64,
        "no byte fetched twice"
    );
    assert_cache_holds(cache.path(), &[(sha(&artifact), "t.whl")]);
}

#[test]
fn dropped_connection_midway_is_resumed() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(400_000, 3);
    let dropping = Route::ok(data.clone()).behavior(Behavior::DropMidway);
    server.route_seq("/d.whl", vec![dropping, Route::ok(data.clone())]);
    let artifact = artifact(&server, "d", "/d.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    let log = server.requests_for("/d.whl");
    assert_eq!(log.len(), 2);
    // Whatever part of the first half survived the reset is kept and resumed from.
    let resumed_at: u64 = match &log[1].range {
        Some(range) => range
            .trim_start_matches("bytes=")
            .trim_end_matches('-')
            .parse()
            .unwrap(),
        None => 0,
    };
    assert!(resumed_at <= 200_000);
    assert_eq!(fetched[0].bytes_downloaded, data.len() as u64);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "d.whl")]);
}

#[test]
fn wrong_bytes_are_refused_with_artifact_url_and_both_hashes() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(50_000, 4);
    server.route(
        "/w.tar.gz",
        Route::ok(data.clone()).behavior(Behavior::WrongBytes),
    );
    let artifact = artifact(&server, "wrongpkg", "/w.tar.gz", &data);
    let err = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap_err();
    let FetchError::Artifacts(failures) = &err else {
        panic!("unexpected error {err}")
    };
    let SourceError::HashMismatch {
        expected, actual, ..
    } = &failures[0].attempts[0].error
    else {
        panic!("unexpected error {err}")
    };
    assert_eq!(expected, sha(&artifact));
    let mut wrong = data.clone();
    wrong[25_000] ^= 0xff;
    assert_eq!(actual, &sha256(&wrong));
    let text = err.to_string();
    for needle in [
        "wrongpkg",
        &artifact.urls[0],
        sha(&artifact),
        &sha256(&wrong),
        "what to do",
    ] {
        assert!(
            text.contains(needle),
            "error does not mention {needle}:\n{text}"
        );
    }
    assert_cache_holds(cache.path(), &[]);
    assert_eq!(
        partial_len(cache.path(), sha(&artifact)),
        None,
        "the wrong bytes were not kept"
    );
}

#[test]
fn not_found_fails_at_once_and_says_so() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(10, 5);
    let artifact = artifact(&server, "gone", "/gone.whl", &data);
    let err = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("gone (gone.whl") && text.contains("HTTP 404"),
        "{text}"
    );
    assert!(text.contains("--mirror"), "{text}");
    assert_eq!(server.hits("/gone.whl"), 1, "a 404 is not retried");
    assert_cache_holds(cache.path(), &[]);
}

#[test]
fn server_errors_are_retried_then_succeed() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(20_000, 6);
    let fail = Behavior::FailFirst {
        n: 2,
        status: 500,
        retry_after: None,
    };
    server.route("/e.whl", Route::ok(data.clone()).behavior(fail));
    let artifact = artifact(&server, "e", "/e.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_eq!(server.hits("/e.whl"), 3);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "e.whl")]);
}

#[test]
fn persistent_server_errors_give_up_after_the_retries() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(20_000, 7);
    server.route("/e.whl", Route::status(503));
    let artifact = artifact(&server, "down", "/e.whl", &data);
    let err = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("HTTP 503 (after 4 attempt(s))"), "{text}");
    assert!(text.contains("run the fetch again later"), "{text}");
    assert_eq!(server.hits("/e.whl"), 4, "1 try + 3 retries");
    assert_cache_holds(cache.path(), &[]);
}

#[test]
fn too_many_requests_honours_retry_after() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(20_000, 8);
    let fail = Behavior::FailFirst {
        n: 1,
        status: 429,
        retry_after: Some(1),
    };
    server.route("/r.whl", Route::ok(data.clone()).behavior(fail));
    let artifact = artifact(&server, "r", "/r.whl", &data);
    let start = Instant::now();
    fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "waited only {:?}",
        start.elapsed()
    );
    assert_eq!(server.hits("/r.whl"), 2);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "r.whl")]);
}

#[test]
fn slow_server_within_the_read_timeout_succeeds() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(64_000, 9);
    let slow = Behavior::Slow {
        chunk: 4_000,
        delay: Duration::from_millis(10),
    };
    server.route("/s.whl", Route::ok(data.clone()).behavior(slow));
    let artifact = artifact(&server, "s", "/s.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_eq!(server.hits("/s.whl"), 1);
}

#[test]
fn stalling_server_times_out_and_is_resumed() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(3_000, 10);
    // 1000 bytes, then silence longer than the read timeout.
    let stall = Behavior::Slow {
        chunk: 1_000,
        delay: Duration::from_secs(3),
    };
    server.route("/st.whl", Route::ok(data.clone()).behavior(stall));
    let artifact = artifact(&server, "st", "/st.whl", &data);
    let mut options = options(cache.path());
    options.read_timeout = Duration::from_millis(300);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    let ranges: Vec<_> = server
        .requests_for("/st.whl")
        .into_iter()
        .map(|r| r.range)
        .collect();
    assert_eq!(
        ranges,
        [None, Some("bytes=1000-".into()), Some("bytes=2000-".into())]
    );
}

#[test]
fn resume_downloads_only_the_rest_when_range_is_honoured() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(500_000, 11);
    let artifact = serve(&server, "big", "/big.whl", &data);
    std::fs::create_dir_all(cache.path().join("tmp")).unwrap();
    std::fs::write(
        cache
            .path()
            .join("tmp")
            .join(format!("{}.part", sha(&artifact))),
        &data[..400_000],
    )
    .unwrap();
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    let log = server.requests_for("/big.whl");
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].range.as_deref(), Some("bytes=400000-"));
    assert_eq!(fetched[0].bytes_downloaded, 100_000);
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_eq!(partial_len(cache.path(), sha(&artifact)), None);
}

#[test]
fn resume_restarts_when_the_server_ignores_range() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(200_000, 12);
    server.route(
        "/ir.whl",
        Route::ok(data.clone()).behavior(Behavior::IgnoreRange),
    );
    let artifact = artifact(&server, "ir", "/ir.whl", &data);
    std::fs::create_dir_all(cache.path().join("tmp")).unwrap();
    std::fs::write(
        cache
            .path()
            .join("tmp")
            .join(format!("{}.part", sha(&artifact))),
        &data[..150_000],
    )
    .unwrap();
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    let log = server.requests_for("/ir.whl");
    assert_eq!(
        (log.len(), log[0].range.as_deref()),
        (1, Some("bytes=150000-"))
    );
    // The 200 body is the whole file: written from the start, not appended.
    assert_eq!(fetched[0].bytes_downloaded, 200_000);
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "ir.whl")]);
}

#[test]
fn a_partial_file_with_wrong_bytes_is_fetched_again_from_scratch() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(100_000, 13);
    let artifact = serve(&server, "p", "/p.whl", &data);
    std::fs::create_dir_all(cache.path().join("tmp")).unwrap();
    std::fs::write(
        cache
            .path()
            .join("tmp")
            .join(format!("{}.part", sha(&artifact))),
        bytes(60_000, 99),
    )
    .unwrap();
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    let ranges: Vec<_> = server
        .requests_for("/p.whl")
        .into_iter()
        .map(|r| r.range)
        .collect();
    assert_eq!(ranges, [Some("bytes=60000-".into()), None]);
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_cache_holds(cache.path(), &[(sha(&artifact), "p.whl")]);
}

#[test]
fn redirects_are_followed() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(30_000, 14);
    server.route("/new/x.whl", Route::ok(data.clone()));
    server.route("/old/x.whl", Route::redirect("/new/x.whl"));
    let artifact = artifact(&server, "x", "/old/x.whl", &data);
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap();
    assert_eq!(std::fs::read(&fetched[0].path).unwrap(), data);
    assert_eq!(
        (server.hits("/old/x.whl"), server.hits("/new/x.whl")),
        (1, 1)
    );
}

#[test]
fn a_size_other_than_the_lock_is_refused_before_the_body() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(30_000, 15);
    server.route("/sz.whl", Route::ok(bytes(40_000, 15)));
    let artifact = artifact(&server, "sz", "/sz.whl", &data);
    let text = fetch_all(std::slice::from_ref(&artifact), &options(cache.path()))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("size mismatch: the lock says 30000 bytes, the server 40000"),
        "{text}"
    );
    assert_cache_holds(cache.path(), &[]);
}

#[test]
fn one_failure_does_not_stop_the_others_and_all_failures_are_listed() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let good: Vec<_> = (0..5)
        .map(|i| {
            serve(
                &server,
                &format!("good{i}"),
                &format!("/g{i}.whl"),
                &bytes(10_000, 20 + i),
            )
        })
        .collect();
    let bad_a = artifact(&server, "missing-a", "/ma.whl", &bytes(10, 1));
    let bad_b = artifact(&server, "missing-b", "/mb.whl", &bytes(10, 2));
    let mut all = good.clone();
    all.insert(2, bad_a);
    all.push(bad_b);
    let mut options = options(cache.path());
    options.jobs = 3;
    let text = fetch_all(&all, &options).unwrap_err().to_string();
    assert!(
        text.starts_with("2 artifact(s) could not be fetched"),
        "{text}"
    );
    assert!(
        text.contains("missing-a") && text.contains("missing-b"),
        "{text}"
    );
    let expected: Vec<(String, String)> = good
        .iter()
        .map(|a| (sha(a).to_string(), a.filename.clone()))
        .collect();
    let expected: Vec<(&str, &str)> = expected
        .iter()
        .map(|(s, f)| (s.as_str(), f.as_str()))
        .collect();
    assert_cache_holds(cache.path(), &expected);
}

#[test]
fn an_unpinned_artifact_is_refused_and_the_others_fetched() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let good = serve(&server, "good", "/good.whl", &bytes(1000, 30));
    server.route("/deepep.tar.gz", Route::ok(bytes(1000, 31)));
    let mut unpinned = artifact(&server, "deepep", "/deepep.tar.gz", &bytes(1000, 31));
    unpinned.sha256 = None;
    let err = fetch_all(&[unpinned, good.clone()], &options(cache.path())).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("1 artifact(s) could not be fetched"),
        "{text}"
    );
    assert!(
        text.contains("deepep (deepep.tar.gz, no hash)")
            && text.contains("neither sha256 nor tree hash"),
        "{text}"
    );
    assert_eq!(
        server.hits("/deepep.tar.gz"),
        0,
        "nothing unverifiable is downloaded"
    );
    assert_cache_holds(cache.path(), &[(sha(&good), "good.whl")]);
}

#[test]
fn a_server_that_ignores_range_and_always_truncates_gives_up_after_the_retries() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(100_000, 32);
    // Every answer starts again at byte 0 and stops at 40 000: the file never gets further.
    let route = Route::ok(data.clone())
        .behavior(Behavior::Truncate { after: 40_000 })
        .ignore_range();
    server.route("/bad.whl", route);
    let artifact = artifact(&server, "bad", "/bad.whl", &data);
    let err = fetch_all(std::slice::from_ref(&artifact), &options(cache.path())).unwrap_err();
    assert!(err.to_string().contains("(after 5 attempt(s))"), "{err}");
    // 1 attempt that got somewhere, then 1 + 3 retries that got no further.
    assert_eq!(server.hits("/bad.whl"), 5);
    assert_cache_holds(cache.path(), &[]);
}
