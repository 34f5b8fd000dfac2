//! Proxies come from the environment, as reqwest reads them: a client built by
//! commstack-http sends a request for another host to `HTTP_PROXY`. Its own test binary:
//! the environment is the process's.

use std::time::Duration;

use commstack_http::{Bound, ClientSettings, Get, RetryPolicy, client, get};
use commstack_testkit::{Route, TestServer};

#[test]
fn requests_go_through_the_proxy_the_environment_names() {
    let proxy = TestServer::start();
    // A proxy gets the absolute URL as the request target.
    proxy.route(
        "http://mirror.commstack.invalid/dists/x",
        Route::ok(b"via proxy".to_vec()),
    );
    // SAFETY: the only test of this binary; nothing else reads the environment meanwhile.
    unsafe {
        std::env::set_var("HTTP_PROXY", proxy.base_url());
        std::env::remove_var("NO_PROXY");
        std::env::remove_var("no_proxy");
    }
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let client = client(&ClientSettings::default()).unwrap();
            let request = Get {
                url: "http://mirror.commstack.invalid/dists/x",
                accept: None,
                what: "the file",
                bound: Bound {
                    max_bytes: 100,
                    time: Duration::from_secs(10),
                },
            };
            let policy = RetryPolicy {
                retries: 0,
                backoff: Duration::ZERO,
                max_backoff: Duration::ZERO,
                max_retry_after: Duration::ZERO,
            };
            get(&client, &request, &policy).await
        })
        .unwrap();
    assert_eq!(answer.body, b"via proxy");
    assert_eq!(proxy.hits("http://mirror.commstack.invalid/dists/x"), 1);
}
