//! The test server, checked with a raw TCP client so every byte it sends is seen.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use commstack_testkit::{Behavior, Route, TestServer};

/// What came back on one `Connection: close` request.
struct Raw {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The read ended with an error (e.g. connection reset) rather than EOF.
    error: Option<ErrorKind>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn request(server: &TestServer, method: &str, path: &str, extra: &[(&str, &str)]) -> Raw {
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
        server.addr()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    let error = loop {
        match stream.read(&mut buf) {
            Ok(0) => break None,
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) => break Some(e.kind()),
        }
    };
    let split = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8(bytes[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Raw {
        status,
        headers,
        body: bytes[split + 4..].to_vec(),
        error,
    }
}

fn get(server: &TestServer, path: &str) -> Raw {
    request(server, "GET", path, &[])
}

fn body(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn unknown_path_is_404_and_logged() {
    let server = TestServer::start();
    let raw = get(&server, "/nope?x=1");
    assert_eq!(raw.status, 404);
    assert_eq!(server.hits("/nope"), 1);
    let log = server.requests();
    assert_eq!(log[0].method, "GET");
    assert_eq!(log[0].query.as_deref(), Some("x=1"));
}

#[test]
fn serves_body_with_headers_and_head() {
    let server = TestServer::start();
    server.route(
        "/simple/x/",
        Route::ok(b"{}".to_vec()).header("Content-Type", "application/vnd.pypi.simple.v1+json"),
    );
    let raw = get(&server, "/simple/x/");
    assert_eq!(raw.status, 200);
    assert_eq!(raw.body, b"{}");
    assert_eq!(
        raw.header("Content-Type"),
        Some("application/vnd.pypi.simple.v1+json")
    );
    let head = request(&server, "HEAD", "/simple/x/", &[]);
    assert_eq!(head.header("Content-Length"), Some("2"));
    assert!(head.body.is_empty());
    assert_eq!(server.hits("/simple/x/"), 2);
}

#[test]
fn honours_range_unless_told_not_to() {
    let server = TestServer::start();
    let data = body(1000);
    server.route("/a", Route::ok(data.clone()));
    server.route(
        "/b",
        Route::ok(data.clone()).behavior(Behavior::IgnoreRange),
    );
    let raw = request(&server, "GET", "/a", &[("Range", "bytes=600-")]);
    assert_eq!(raw.status, 206);
    assert_eq!(raw.header("Content-Range"), Some("bytes 600-999/1000"));
    assert_eq!(raw.body, &data[600..]);
    assert_eq!(
        server.requests_for("/a")[0].range.as_deref(),
        Some("bytes=600-")
    );
    let past_end = request(&server, "GET", "/a", &[("Range", "bytes=1000-")]);
    assert_eq!(past_end.status, 416);
    let ignored = request(&server, "GET", "/b", &[("Range", "bytes=600-")]);
    assert_eq!(ignored.status, 200);
    assert_eq!(ignored.body, data);
}

#[test]
fn truncate_announces_full_length_and_closes_early() {
    let server = TestServer::start();
    let data = body(5000);
    server.route(
        "/t",
        Route::ok(data.clone()).behavior(Behavior::Truncate { after: 1234 }),
    );
    let raw = get(&server, "/t");
    assert_eq!(raw.header("Content-Length"), Some("5000"));
    assert_eq!(raw.body, &data[..1234]);
}

#[test]
fn drop_midway_resets_the_connection() {
    let server = TestServer::start();
    server.route(
        "/d",
        Route::ok(body(100_000)).behavior(Behavior::DropMidway),
    );
    let raw = get(&server, "/d");
    assert!(
        raw.body.len() <= 50_000,
        "sent {} bytes, more than half",
        raw.body.len()
    );
    assert_eq!(raw.error, Some(ErrorKind::ConnectionReset));
}

#[test]
fn wrong_bytes_keep_the_length_and_differ_in_one_byte() {
    let server = TestServer::start();
    let data = body(999);
    server.route("/w", Route::ok(data.clone()).behavior(Behavior::WrongBytes));
    let raw = get(&server, "/w");
    assert_eq!(raw.body.len(), data.len());
    assert_eq!(
        raw.body.iter().zip(&data).filter(|(a, b)| a != b).count(),
        1
    );
}

#[test]
fn slow_trickles() {
    let server = TestServer::start();
    let slow = Behavior::Slow {
        chunk: 10,
        delay: Duration::from_millis(20),
    };
    server.route("/s", Route::ok(body(50)).behavior(slow));
    let start = Instant::now();
    let raw = get(&server, "/s");
    assert_eq!(raw.body, body(50));
    assert!(start.elapsed() >= Duration::from_millis(80));
}

#[test]
fn fail_first_then_succeed_and_redirect() {
    let server = TestServer::start();
    let fail = Behavior::FailFirst {
        n: 2,
        status: 429,
        retry_after: Some(1),
    };
    server.route("/f", Route::ok(b"fine".to_vec()).behavior(fail));
    server.route("/r", Route::redirect("/f"));
    let first = get(&server, "/f");
    assert_eq!(
        (first.status, first.header("Retry-After")),
        (429, Some("1"))
    );
    assert_eq!(get(&server, "/f").status, 429);
    assert_eq!(get(&server, "/f").body, b"fine");
    let redirect = get(&server, "/r");
    assert_eq!(
        (redirect.status, redirect.header("Location")),
        (302, Some("/f"))
    );
}

#[test]
fn route_seq_answers_in_order_then_repeats_the_last() {
    let server = TestServer::start();
    server.route_seq(
        "/q",
        vec![
            Route::status(500),
            Route::ok(b"a".to_vec()),
            Route::ok(b"b".to_vec()),
        ],
    );
    let statuses: Vec<_> = (0..4)
        .map(|_| get(&server, "/q"))
        .map(|r| (r.status, r.body))
        .collect();
    assert_eq!(statuses[0].0, 500);
    assert_eq!(statuses[1], (200, b"a".to_vec()));
    assert_eq!(statuses[2], (200, b"b".to_vec()));
    assert_eq!(statuses[3], (200, b"b".to_vec()));
}

#[test]
fn keep_alive_serves_several_requests_on_one_connection() {
    let server = TestServer::start();
    server.route("/k", Route::ok(b"0123456789".to_vec()));
    let mut stream = TcpStream::connect(server.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let one = "GET /k HTTP/1.1\r\nHost: x\r\n\r\n";
    stream.write_all(format!("{one}{one}").as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(10).filter(|w| w == b"0123456789").count() < 2 {
        let n = stream.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "connection closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(server.connections(), 1);
    assert_eq!(server.hits("/k"), 2);
}

#[test]
fn no_client_means_no_connection() {
    let server = TestServer::start();
    assert_eq!(server.connections(), 0);
    assert!(server.requests().is_empty());
}

#[test]
fn a_huge_body_is_the_pattern_repeated_with_or_without_its_length() {
    let server = TestServer::start();
    let len = 200_003u64;
    for announce in [true, false] {
        server.route(
            "/huge",
            Route::ok(b"abc".to_vec()).behavior(Behavior::Huge { len, announce }),
        );
        let raw = request(&server, "GET", "/huge", &[("Range", "bytes=0-9")]);
        assert_eq!(raw.status, 200, "Range is ignored");
        assert_eq!(raw.body.len() as u64, len);
        assert!(raw.body.chunks(3).all(|c| b"abc".starts_with(c)));
        let expected = announce.then(|| len.to_string());
        assert_eq!(raw.header("Content-Length"), expected.as_deref());
    }
    // Every body byte reached the socket, counted per path (heads are a few hundred bytes).
    let sent = server.body_bytes_sent("/huge");
    assert!((2 * len..2 * len + 1000).contains(&sent), "{sent}");
}
