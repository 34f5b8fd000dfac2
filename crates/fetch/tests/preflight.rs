//! `preflight`: before a long job downloads anything, every artifact must be had from the
//! cache, a mirror file or a source that answers. A missing one fails at once, named,
//! with nothing downloaded.

mod common;

use common::*;
use commstack_fetch::{Mirror, fetch_all, preflight};
use commstack_testkit::{Route, TestServer};

#[test]
fn a_missing_source_fails_before_any_download_and_is_named() {
    let server = TestServer::start();
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let big = bytes(1 << 20, 1);
    let served = serve(&server, "served", "/served.whl", &big);
    let gone = artifact(&server, "nvshmem", "/nvshmem_src.tar.gz", b"never served");
    server.route("/nvshmem_src.tar.gz", Route::status(404));
    // One in a directory mirror, one already cached: both count as there.
    let mirror = work.path().join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    let mirrored_bytes = bytes(100, 2);
    std::fs::write(mirror.join("mirrored.tar.gz"), &mirrored_bytes).unwrap();
    let mirrored = artifact(&server, "mirrored", "/mirrored.tar.gz", &mirrored_bytes);
    let cached_bytes = bytes(100, 3);
    let cached = serve(&server, "cached", "/cached.whl", &cached_bytes);
    let mut options = options(&cache);
    fetch_all(std::slice::from_ref(&cached), &options).unwrap();
    options.mirrors = vec![Mirror::Dir(mirror)];

    let all = [served, gone, mirrored, cached];
    let err = preflight(&all, &options).unwrap_err().to_string();
    assert!(
        err.contains("1 artifact(s) cannot be had") && err.contains("nothing was downloaded"),
        "{err}"
    );
    assert!(
        err.contains("nvshmem_src.tar.gz") && err.contains("404"),
        "{err}"
    );
    assert!(!err.contains("served.whl"), "{err}");
    // The served file was asked for one byte, not downloaded; the mirrored and cached
    // ones were not asked for at all.
    let asks = server.requests_for("/served.whl");
    assert_eq!(asks.len(), 1);
    assert_eq!(asks[0].header("range"), Some("bytes=0-0"));
    assert_eq!(server.hits("/mirrored.tar.gz"), 0);
    assert_eq!(
        server.hits("/cached.whl"),
        1,
        "only the fetch that cached it"
    );
    assert_cache_holds(&cache, &[(&sha256(&cached_bytes), "cached.whl")]);

    // Once the source answers, preflight passes.
    server.route("/nvshmem_src.tar.gz", Route::ok(b"never served".to_vec()));
    preflight(&all, &options).unwrap();
}

#[test]
fn offline_preflight_names_what_is_in_neither_cache_nor_mirror() {
    let server = TestServer::start();
    let work = tempfile::tempdir().unwrap();
    let a = serve(&server, "a", "/a.whl", &bytes(10, 4));
    let mut options = options(&work.path().join("cache"));
    options.offline = true;
    let err = preflight(&[a], &options).unwrap_err().to_string();
    assert!(err.contains("a.whl"), "{err}");
    assert_eq!(server.connections(), 0, "offline opens no socket");
}
