//! A project page is read with a bound (docs/bounds.md): an index that sends a page without
//! end is cut off at 64 MiB as the bytes arrive, not read into memory whole.

use std::str::FromStr;

use commstack_pypi::IndexClient;
use commstack_testkit::{Behavior, Route, TestServer};
use pep508_rs::PackageName;

#[test]
fn a_project_page_without_end_is_cut_off_at_its_bound() {
    let server = TestServer::start();
    server.route(
        "/simple/torch/",
        Route::ok(b"{\"files\":[".to_vec())
            .header("Content-Type", "application/vnd.pypi.simple.v1+json")
            .behavior(Behavior::Huge {
                len: 96 << 20,
                announce: false,
            }),
    );
    let client = IndexClient::new(&server.url("/simple"), None).unwrap();
    let name = PackageName::from_str("torch").unwrap();
    let err = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(client.project(&name))
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains(
            "/simple/torch/: the project page is larger than its bound of 64 MiB (67108864 bytes)"
        ) && err.contains("resolve.index-url"),
        "{err}"
    );
    let sent = server.body_bytes_sent("/simple/torch/");
    assert!(sent < 90 << 20, "the server sent {sent} bytes");
}
