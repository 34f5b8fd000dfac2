//! The bounded GET against a real HTTP server on 127.0.0.1 (commstack-testkit) that
//! misbehaves: too big, announced or not, too slow, failing first.

use std::time::{Duration, Instant};

use commstack_http::{Bound, ClientSettings, Get, HttpError, RetryPolicy, client, get};
use commstack_testkit::{Behavior, Route, TestServer};

const POLICY: RetryPolicy = RetryPolicy {
    retries: 2,
    backoff: Duration::from_millis(50),
    max_backoff: Duration::from_millis(200),
    max_retry_after: Duration::from_secs(1),
};

fn bound(max_bytes: u64, secs: u64) -> Bound {
    Bound {
        max_bytes,
        time: Duration::from_secs(secs),
    }
}

fn run(url: &str, bound: Bound, policy: &RetryPolicy) -> Result<commstack_http::Answer, HttpError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = client(&ClientSettings::default()).unwrap();
        let request = Get {
            url,
            accept: Some("application/json"),
            what: "the page",
            bound,
        };
        get(&client, &request, policy).await
    })
}

#[test]
fn a_body_within_its_bound_is_read_and_other_statuses_are_returned_unread() {
    let server = TestServer::start();
    server.route("/ok", Route::ok(b"hello".to_vec()));
    let answer = run(&server.url("/ok"), bound(5, 10), &POLICY).unwrap();
    assert_eq!(
        (answer.status.as_u16(), &answer.body[..]),
        (200, &b"hello"[..])
    );
    let sent = &server.requests_for("/ok")[0];
    assert_eq!(sent.header("Accept"), Some("application/json"));
    assert_eq!(sent.header("User-Agent"), Some(commstack_http::USER_AGENT));
    // A 404 is an answer for the caller, not a failure to retry.
    let answer = run(&server.url("/missing"), bound(5, 10), &POLICY).unwrap();
    assert_eq!(answer.status.as_u16(), 404);
    assert!(answer.body.is_empty());
    assert_eq!(server.hits("/missing"), 1);
}

#[test]
fn a_body_over_its_bound_is_refused_as_announced_or_as_it_arrives() {
    let server = TestServer::start();
    let len = 256 << 20;
    server.route(
        "/announced",
        Route::ok(vec![b'x']).behavior(Behavior::Huge {
            len,
            announce: true,
        }),
    );
    server.route(
        "/endless",
        Route::ok(vec![b'x']).behavior(Behavior::Huge {
            len,
            announce: false,
        }),
    );
    let err = run(&server.url("/announced"), bound(1 << 20, 60), &POLICY).unwrap_err();
    assert!(
        matches!(err, HttpError::TooLarge { announced: true, size, limit, .. } if size == len && limit == 1 << 20),
        "{err:?}"
    );
    assert!(
        err.to_string().ends_with(
            "/announced: the page announces 256 MiB (268435456 bytes) (Content-Length), more than its bound \
             of 1 MiB (1048576 bytes): refused before reading it"
        ),
        "{err}"
    );
    let err = run(&server.url("/endless"), bound(1 << 20, 60), &POLICY).unwrap_err();
    let HttpError::TooLarge {
        announced: false,
        size,
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    // Cut at the first chunk past the bound, not at the end.
    assert!(size > 1 << 20 && size < 2 << 20, "{size}");
    assert!(
        err.to_string()
            .contains("the page is larger than its bound of 1 MiB (1048576 bytes): refused at"),
        "{err}"
    );
    let sent = server.body_bytes_sent("/endless");
    assert!(sent < 64 << 20, "the server sent {sent} bytes");
    // Neither is retried: a bigger answer is no transient failure.
    assert_eq!(server.hits("/announced") + server.hits("/endless"), 2);
}

#[test]
fn a_dripping_body_is_cut_off_at_the_overall_time_not_the_read_timeout() {
    let server = TestServer::start();
    // One byte every 100 ms: no read waits long, the whole would take 100 s.
    server.route(
        "/drip",
        Route::ok(vec![b'x'; 1000]).behavior(Behavior::Slow {
            chunk: 1,
            delay: Duration::from_millis(100),
        }),
    );
    let started = Instant::now();
    let err = run(&server.url("/drip"), bound(1 << 20, 1), &POLICY).unwrap_err();
    let took = started.elapsed();
    let HttpError::TooSlow { received, .. } = &err else {
        panic!("{err:?}");
    };
    assert!((1..1000).contains(received), "{received}");
    assert!(
        err.to_string()
            .contains("/drip: the page did not arrive within its bound of 1 s (the whole download, retries included"),
        "{err}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn transient_failures_are_retried_within_the_policy_and_the_time() {
    let server = TestServer::start();
    server.route(
        "/flaky",
        Route::ok(b"ok".to_vec()).behavior(Behavior::FailFirst {
            n: 2,
            status: 503,
            retry_after: None,
        }),
    );
    let answer = run(&server.url("/flaky"), bound(10, 10), &POLICY).unwrap();
    assert_eq!(answer.body, b"ok");
    assert_eq!(server.hits("/flaky"), 3);

    // Always failing: retries + 1 attempts, then the last answer.
    server.route(
        "/down",
        Route::ok(Vec::new()).behavior(Behavior::FailFirst {
            n: 100,
            status: 500,
            retry_after: None,
        }),
    );
    let err = run(&server.url("/down"), bound(10, 10), &POLICY).unwrap_err();
    assert!(
        matches!(err, HttpError::GaveUp { attempts: 3, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .ends_with("/down answered 500 Internal Server Error (gave up after 3 attempts)"),
        "{err}"
    );
    assert_eq!(server.hits("/down"), 3);

    // A Retry-After that would end past the time bound: refused at once, naming the bound
    // and the failure, instead of sleeping into it.
    server.route(
        "/later",
        Route::ok(Vec::new()).behavior(Behavior::FailFirst {
            n: 100,
            status: 429,
            retry_after: Some(30),
        }),
    );
    let patient = RetryPolicy {
        max_retry_after: Duration::from_secs(30),
        ..POLICY
    };
    let started = Instant::now();
    let err = run(&server.url("/later"), bound(10, 2), &patient).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        err.to_string()
            .contains("did not arrive within its bound of 2 s")
            && err.to_string().contains("last failure: ")
            && err
                .to_string()
                .contains("/later answered 429 Too Many Requests"),
        "{err}"
    );
    assert_eq!(server.hits("/later"), 1);
}
