//! Mirrors before upstream, offline runs, and the air-gap bundle round trip.

mod common;

use common::*;
use commstack_fetch::{
    Artifact, FetchError, MIRROR_MANIFEST, Mirror, Origin, SourceError, export_mirror, fetch_all,
    read_manifest,
};
use commstack_testkit::{Behavior, Route, TestServer};

#[test]
fn a_mirror_directory_is_used_before_upstream() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let mirror = tempfile::tempdir().unwrap();
    let data = bytes(40_000, 1);
    let artifact = serve(&server, "m", "/pkgs/m-1.0+local-py3-none-any.whl", &data);
    std::fs::write(mirror.path().join("m-1.0+local-py3-none-any.whl"), &data).unwrap();
    let mut options = options(cache.path());
    options.mirrors = vec![Mirror::parse(mirror.path().to_str().unwrap()).unwrap()];
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options).unwrap();
    assert!(matches!(&fetched[0].origin, Origin::Mirror { url } if url.starts_with("file://")));
    assert_eq!(fetched[0].bytes_downloaded, 0);
    assert_eq!(server.connections(), 0, "upstream was not contacted");
    assert_cache_holds(
        cache.path(),
        &[(sha(&artifact), "m-1.0+local-py3-none-any.whl")],
    );
}

#[test]
fn a_mirror_with_wrong_bytes_or_without_the_file_falls_back_to_upstream() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let bad_mirror = tempfile::tempdir().unwrap();
    let empty_mirror = tempfile::tempdir().unwrap();
    let data = bytes(40_000, 2);
    let artifact = serve(&server, "f", "/f.whl", &data);
    std::fs::write(bad_mirror.path().join("f.whl"), bytes(40_000, 3)).unwrap();
    let mut options = options(cache.path());
    options.mirrors = vec![
        Mirror::Dir(empty_mirror.path().into()),
        Mirror::Dir(bad_mirror.path().into()),
    ];
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options).unwrap();
    assert_eq!(
        fetched[0].origin,
        Origin::Upstream {
            url: artifact.urls[0].clone()
        }
    );
    // The bad mirror is named, the one that merely lacks the file is not.
    assert_eq!(
        fetched[0].bad_sources.len(),
        1,
        "{:?}",
        fetched[0].bad_sources
    );
    assert!(
        fetched[0].bad_sources[0].contains(&bad_mirror.path().display().to_string()),
        "{:?}",
        fetched[0].bad_sources
    );
    assert_cache_holds(cache.path(), &[(sha(&artifact), "f.whl")]);

    // Offline, the same mirror is reported as damaged, not as missing.
    let offline_cache = tempfile::tempdir().unwrap();
    let mut offline = options.clone();
    offline.cache_dir = offline_cache.path().into();
    offline.offline = true;
    offline.mirrors = vec![Mirror::Dir(bad_mirror.path().into())];
    let text = fetch_all(std::slice::from_ref(&artifact), &offline)
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("offline: 1 artifact(s) are damaged in the mirror"),
        "{text}"
    );
    assert!(
        !text.contains("in neither the cache nor a local mirror"),
        "{text}"
    );
}

#[test]
fn an_http_mirror_is_tried_first_and_file_urls_work_upstream() {
    let upstream = TestServer::start();
    let mirror = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(40_000, 4);
    let artifact = artifact(&upstream, "h", "/h.whl", &data);
    mirror.route("/bundle/h.whl", Route::ok(data.clone()));
    let mut options = options(cache.path());
    options.mirrors = vec![Mirror::parse(&mirror.url("/bundle")).unwrap()];
    let fetched = fetch_all(std::slice::from_ref(&artifact), &options).unwrap();
    assert_eq!(
        fetched[0].origin,
        Origin::Mirror {
            url: mirror.url("/bundle/h.whl")
        }
    );
    assert_eq!(upstream.connections(), 0);

    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("h.whl");
    std::fs::write(&file, &data).unwrap();
    let by_file =
        Artifact::new("h", &format!("file://{}", file.display()), sha(&artifact)).unwrap();
    let other_cache = tempfile::tempdir().unwrap();
    let fetched = fetch_all(&[by_file], &common::options(other_cache.path())).unwrap();
    assert!(matches!(&fetched[0].origin, Origin::Upstream { url } if url.starts_with("file://")));
    assert_cache_holds(other_cache.path(), &[(sha(&artifact), "h.whl")]);
}

#[test]
fn offline_opens_no_socket_and_lists_everything_missing() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let mirror = tempfile::tempdir().unwrap();
    let present = serve(&server, "present", "/present.whl", &bytes(1000, 5));
    let in_mirror = serve(&server, "in-mirror", "/in-mirror.whl", &bytes(1000, 6));
    let missing_a = serve(&server, "missing-a", "/missing-a.whl", &bytes(1000, 7));
    let missing_b = serve(&server, "missing-b", "/missing-b.tar.gz", &bytes(1000, 8));
    fetch_all(std::slice::from_ref(&present), &options(cache.path())).unwrap();
    let connections_before = server.connections();
    std::fs::write(mirror.path().join("in-mirror.whl"), bytes(1000, 6)).unwrap();

    let mut options = options(cache.path());
    options.offline = true;
    options.mirrors = vec![
        Mirror::Dir(mirror.path().into()),
        Mirror::parse(&server.url("/mirror")).unwrap(),
    ];
    let all = [
        present.clone(),
        in_mirror.clone(),
        missing_a.clone(),
        missing_b.clone(),
    ];
    let err = fetch_all(&all, &options).unwrap_err();
    assert_eq!(
        server.connections(),
        connections_before,
        "offline opened a socket"
    );
    let FetchError::Offline(missing) = &err else {
        panic!("not an offline error: {err}")
    };
    let names: Vec<_> = missing.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["missing-a", "missing-b"]);
    assert!(
        missing[0]
            .attempts
            .iter()
            .any(|a| a.error == SourceError::SkippedOffline)
    );
    let text = err.to_string();
    assert!(
        text.starts_with("offline: 2 artifact(s) are in neither the cache nor a local mirror"),
        "{text}"
    );
    assert!(
        text.contains(sha(&missing_a)) && text.contains("missing-b.tar.gz"),
        "{text}"
    );
    assert!(text.contains("cargo xtask mirror export"), "{text}");
    // What could be had offline was cached.
    assert_cache_holds(
        cache.path(),
        &[
            (sha(&present), "present.whl"),
            (sha(&in_mirror), "in-mirror.whl"),
        ],
    );
}

#[test]
fn mirror_export_then_offline_fetch_on_another_machine() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let artifacts: Vec<_> = (0..3)
        .map(|i| {
            serve(
                &server,
                &format!("a{i}"),
                &format!("/dist/a{i}-1.0.tar.gz"),
                &bytes(20_000 + i, i as u8),
            )
        })
        .collect();
    let fetched = fetch_all(&artifacts, &options(cache.path())).unwrap();
    let bundle = tempfile::tempdir().unwrap();
    let report = export_mirror(&fetched, bundle.path()).unwrap();
    assert_eq!((report.copied, report.kept), (3, 0));
    let manifest = read_manifest(bundle.path()).unwrap();
    assert_eq!(manifest.artifacts.len(), 3);
    assert_eq!(manifest.artifacts[0].filename, "a0-1.0.tar.gz");
    assert_eq!(manifest.artifacts[0].sha256, sha(&artifacts[0]));
    assert!(bundle.path().join(MIRROR_MANIFEST).is_file());
    // Exporting again copies nothing.
    assert_eq!(export_mirror(&fetched, bundle.path()).unwrap().kept, 3);

    let served_before = server.connections();
    let air_gapped_cache = tempfile::tempdir().unwrap();
    let mut options = options(air_gapped_cache.path());
    options.offline = true;
    options.mirrors = vec![Mirror::parse(&format!("file://{}", bundle.path().display())).unwrap()];
    let fetched = fetch_all(&artifacts, &options).unwrap();
    assert!(
        fetched
            .iter()
            .all(|f| matches!(f.origin, Origin::Mirror { .. }))
    );
    assert_eq!(server.connections(), served_before);
    let expected: Vec<(String, String)> = artifacts
        .iter()
        .map(|a| (sha(a).to_string(), a.filename.clone()))
        .collect();
    let expected: Vec<(&str, &str)> = expected
        .iter()
        .map(|(s, f)| (s.as_str(), f.as_str()))
        .collect();
    assert_cache_holds(air_gapped_cache.path(), &expected);
}

#[test]
fn a_mirror_that_misbehaves_over_http_still_never_poisons_the_cache() {
    let server = TestServer::start();
    let cache = tempfile::tempdir().unwrap();
    let data = bytes(50_000, 9);
    server.route(
        "/mirror/z.whl",
        Route::ok(data.clone()).behavior(Behavior::WrongBytes),
    );
    server.route("/up/z.whl", Route::status(404));
    let artifact = artifact(&server, "z", "/up/z.whl", &data);
    let mut options = options(cache.path());
    options.mirrors = vec![Mirror::parse(&server.url("/mirror/")).unwrap()];
    let text = fetch_all(std::slice::from_ref(&artifact), &options)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains(&format!(
            "{}: sha256 mismatch: expected {}",
            server.url("/mirror/z.whl"),
            sha(&artifact)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{}: HTTP 404", server.url("/up/z.whl"))),
        "{text}"
    );
    assert_cache_holds(cache.path(), &[]);
}
