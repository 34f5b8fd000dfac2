//! A signed index must be current and bounded: a mirror on 127.0.0.1 (commstack-testkit)
//! serves InRelease files signed, here and now, by a throwaway key made with the real gpg
//! (testkit's `ArchiveKey`), with the dates each test needs, and checked by the real gpgv;
//! or serves them too slowly, or without end.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use commstack_debian::freshness::{Freshness, Recorded};
use commstack_debian::mirror::IndexBounds;
use commstack_debian::{BaseRequest, LockedBase, lock_base};
use commstack_http::Bound;
use commstack_testkit::debian::{ArchiveKey, release_text};
use commstack_testkit::{Behavior, Route, TestServer};
use jiff::{SignedDuration, Timestamp};

const INRELEASE: &str = "/debian/dists/bookworm/InRelease";
const PACKAGES_GZ: &str = "/debian/dists/bookworm/main/binary-amd64/Packages.gz";

fn packages() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/Packages");
    std::fs::read(path).unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// `Tue, 01 Dec 2026 00:00:00 UTC`, as Debian writes dates.
fn rfc2822(t: Timestamp) -> String {
    t.strftime("%a, %d %b %Y %H:%M:%S UTC").to_string()
}

fn days(n: i64) -> SignedDuration {
    SignedDuration::from_hours(24 * n)
}

/// Now, to the second (an InRelease's dates have no fractions).
fn now() -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second()).unwrap()
}

/// The bookworm InRelease, signed by `key`, with `date` and `valid_until`, listing the
/// fixture's Packages and Packages.gz.
fn signed(key: &ArchiveKey, date: Timestamp, valid_until: Option<Timestamp>) -> Vec<u8> {
    let text = packages();
    let release = release_text(
        "oldstable",
        "bookworm",
        &rfc2822(date),
        valid_until.map(rfc2822).as_deref(),
        &[
            ("main/binary-amd64/Packages", &text),
            ("main/binary-amd64/Packages.gz", &gzip(&text)),
        ],
    );
    key.clearsign(&release)
}

/// A mirror serving [`signed`] and the fixture's Packages.gz.
fn mirror(key: &ArchiveKey, date: Timestamp, valid_until: Option<Timestamp>) -> TestServer {
    let server = TestServer::start();
    server.route(INRELEASE, Route::ok(signed(key, date, valid_until)));
    server.route(PACKAGES_GZ, Route::ok(gzip(&packages())));
    server
}

fn request(server: &TestServer, key: &ArchiveKey, freshness: Freshness) -> BaseRequest {
    BaseRequest {
        mirror: server.url("/debian"),
        suite: "bookworm".into(),
        architecture: "amd64".into(),
        keyring: key.keyring().to_path_buf(),
        include: vec!["app".into()],
        freshness,
        bounds: IndexBounds::default(),
    }
}

/// Judged at `now` with the default maximum age.
fn at(now: Timestamp) -> Freshness {
    let mut f = Freshness::now(730);
    f.now = now;
    f
}

fn lock(request: &BaseRequest) -> anyhow::Result<LockedBase> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(lock_base(request))
}

fn refusal(request: &BaseRequest) -> String {
    format!("{:#}", lock(request).unwrap_err())
}

#[test]
fn an_expired_index_is_refused_naming_its_dates() {
    let key = ArchiveKey::new();
    let now = now();
    // Signed in 2005, valid for a week: what a mirror replaying an old index serves.
    let date: Timestamp = "2005-01-01T00:00:00Z".parse().unwrap();
    let until: Timestamp = "2005-01-08T00:00:00Z".parse().unwrap();
    let server = mirror(&key, date, Some(until));
    let err = refusal(&request(&server, &key, at(now)));
    assert!(
        err.contains("InRelease expired: its Valid-Until is 2005-01-08T00:00:00Z")
            && err.contains("it is dated 2005-01-01T00:00:00Z")
            && err.contains(&now.to_string())
            && err.contains("image.mirror"),
        "{err}"
    );
    // Refused before the index is read.
    assert_eq!(server.hits(PACKAGES_GZ), 0);

    // Valid-Until, not the age, decides when there is one: an old date still valid passes.
    let server = mirror(&key, now - days(1000), Some(now + days(1)));
    lock(&request(&server, &key, at(now))).unwrap();
}

#[test]
fn an_index_dated_in_the_future_is_refused_beyond_five_minutes() {
    let key = ArchiveKey::new();
    let now = now();
    let date: Timestamp = "2031-06-01T00:00:00Z".parse().unwrap();
    let server = mirror(&key, date, None);
    let err = refusal(&request(&server, &key, at(now)));
    assert!(
        err.contains("is dated 2031-06-01T00:00:00Z")
            && err.contains("ahead of this machine's clock")
            && err.contains("at most 5 min is allowed"),
        "{err}"
    );
    // Within the skew: a mirror whose clock runs a little ahead.
    let server = mirror(&key, now + SignedDuration::from_mins(4), None);
    lock(&request(&server, &key, at(now))).unwrap();
    let server = mirror(&key, now + SignedDuration::from_mins(6), None);
    let err = refusal(&request(&server, &key, at(now)));
    assert!(err.contains("6 min ahead"), "{err}");
}

#[test]
fn an_index_without_valid_until_is_refused_past_the_maximum_age() {
    let key = ArchiveKey::new();
    let now = now();
    let old = now - days(731);
    let server = mirror(&key, old, None);
    let err = refusal(&request(&server, &key, at(now)));
    assert!(
        err.contains(&format!("is dated {old}, 731 days 0 h before now ({now})"))
            && err.contains("has no Valid-Until")
            && err.contains("image.index-max-age-days = 730"),
        "{err}"
    );
    // The stack's own maximum age admits it.
    let mut longer = at(now);
    longer.max_age_days = 800;
    lock(&request(&server, &key, longer)).unwrap();
    // Within the default: a released suite after its last point release.
    let server = mirror(&key, now - days(729), None);
    lock(&request(&server, &key, at(now))).unwrap();
}

#[test]
fn an_index_older_than_the_recorded_one_is_refused() {
    let key = ArchiveKey::new();
    let now = now();
    let recorded = now - days(10);
    let with_recorded = || {
        let mut f = at(now);
        f.recorded = Some(Recorded {
            date: recorded,
            lock: "stack.lock".into(),
        });
        f
    };
    // Signed, current by every other measure, but older than what the lock saw: a rollback.
    let older = now - days(20);
    let server = mirror(&key, older, None);
    let err = refusal(&request(&server, &key, with_recorded()));
    assert!(
        err.contains(&format!(
            "is dated {older}, older than the index stack.lock already records for this mirror and suite \
             ([base] release-date = {recorded})"
        )) && err.contains("delete stack.lock and run `cargo xtask lock`"),
        "{err}"
    );
    // The same index again, or a newer one, is no rollback.
    for date in [recorded, now - days(1)] {
        let server = mirror(&key, date, None);
        let base = lock(&request(&server, &key, with_recorded())).unwrap();
        assert_eq!(base.release_date, date);
    }
}

/// Runs the lock on a thread and waits at most `limit`: the old code read a dripping
/// server for as long as it dripped.
fn lock_within(request: BaseRequest, limit: Duration) -> (anyhow::Result<LockedBase>, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(lock(&request));
    });
    let result = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still reading the index after {limit:?}"));
    (result, started.elapsed())
}

#[test]
fn an_inrelease_dripping_slowly_is_cut_off_at_its_overall_bound() {
    let key = ArchiveKey::new();
    let now = now();
    let server = mirror(&key, now - days(1), None);
    let signed = signed(&key, now - days(1), None);
    // One byte every 100 ms: each read arrives well within the read timeout, and the
    // whole file (about 900 bytes) would take a minute and a half.
    assert!(signed.len() > 600, "{} bytes", signed.len());
    server.route(
        INRELEASE,
        Route::ok(signed).behavior(Behavior::Slow {
            chunk: 1,
            delay: Duration::from_millis(100),
        }),
    );
    let mut req = request(&server, &key, at(now));
    req.bounds.inrelease.time = Duration::from_secs(2);
    let (result, took) = lock_within(req, Duration::from_secs(30));
    let err = format!("{:#}", result.unwrap_err());
    assert!(
        err.contains("InRelease: the InRelease did not arrive within its bound of 2 s")
            && err.contains("docs/bounds.md"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn an_endless_inrelease_is_cut_off_at_its_size_bound_while_it_arrives() {
    let key = ArchiveKey::new();
    let server = mirror(&key, now(), None);
    // 256 MiB without Content-Length: only reading tells its size.
    let len = 256 << 20;
    server.route(
        INRELEASE,
        Route::ok(b"Origin: x\n".to_vec()).behavior(Behavior::Huge {
            len,
            announce: false,
        }),
    );
    let err = refusal(&request(&server, &key, at(now())));
    assert!(
        err.contains(
            "InRelease: the InRelease is larger than its bound of 4 MiB (4194304 bytes): refused at"
        ),
        "{err}"
    );
    // Reading stopped at the bound (the rest is what the socket buffers took), far from
    // the end.
    let sent = server.body_bytes_sent(INRELEASE);
    assert!(sent < 64 << 20, "the server sent {sent} bytes");

    // Announced: refused before reading any of it.
    server.route(
        INRELEASE,
        Route::ok(b"Origin: x\n".to_vec()).behavior(Behavior::Huge {
            len,
            announce: true,
        }),
    );
    let err = refusal(&request(&server, &key, at(now())));
    assert!(
        err.contains(
            "announces 256 MiB (268435456 bytes) (Content-Length), more than its bound of 4 MiB"
        ),
        "{err}"
    );
}

#[test]
fn a_packages_index_is_read_no_further_than_its_signed_size_and_time() {
    let key = ArchiveKey::new();
    let now = now();
    let server = mirror(&key, now, None);
    let gz = gzip(&packages());
    // The signed file, then more and more: cut at the signed size.
    server.route(
        PACKAGES_GZ,
        Route::ok(gz.clone()).behavior(Behavior::Huge {
            len: 256 << 20,
            announce: false,
        }),
    );
    let err = refusal(&request(&server, &key, at(now)));
    assert!(
        err.contains(&format!(
            "Packages.gz: the Packages index is larger than its bound of {}",
            commstack_http::bytes(gz.len() as u64)
        )) && err.contains(&format!("but the signed {}", server.url(INRELEASE)))
            && err.contains(&format!("lists {} bytes", gz.len())),
        "{err}"
    );
    let sent = server.body_bytes_sent(PACKAGES_GZ);
    assert!(sent < 64 << 20, "the server sent {sent} bytes");

    // The right bytes, one every 100 ms: cut at the time its size allows.
    server.route(
        PACKAGES_GZ,
        Route::ok(gz).behavior(Behavior::Slow {
            chunk: 1,
            delay: Duration::from_millis(100),
        }),
    );
    let mut req = request(&server, &key, at(now));
    req.bounds.packages_time = Duration::from_secs(1);
    req.bounds.packages_rate = 1 << 30;
    let (result, took) = lock_within(req, Duration::from_secs(30));
    let err = format!("{:#}", result.unwrap_err());
    assert!(
        err.contains("Packages.gz: the Packages index did not arrive within its bound of 1 s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn the_default_bounds_are_the_documented_ones() {
    // docs/bounds.md states these; a change here must change it too.
    let b = IndexBounds::default();
    assert_eq!(
        b.inrelease,
        Bound {
            max_bytes: 4 << 20,
            time: Duration::from_secs(120)
        }
    );
    // bookworm's main/binary-amd64/Packages.gz is about 8.9 MB: 60 s + 136 s.
    assert_eq!(b.packages(8_900_000).time.as_secs(), 60 + 135);
    assert_eq!(b.packages(8_900_000).max_bytes, 8_900_000);
    assert_eq!(commstack_debian::freshness::MAX_SKEW.as_secs(), 300);
}
