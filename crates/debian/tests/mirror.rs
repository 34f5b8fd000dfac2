//! The archive client against a fixture mirror on 127.0.0.1 (commstack-testkit's HTTP
//! server): a tiny Packages index and an InRelease signed by a throwaway key
//! (tests/fixtures/make.sh says how they were made). Signatures are checked by the real
//! gpgv.

use std::io::Write;
use std::path::{Path, PathBuf};

use commstack_debian::freshness::Freshness;
use commstack_debian::mirror::IndexBounds;
use commstack_debian::{BaseRequest, lock_base};
use commstack_testkit::{Route, TestServer};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

/// A mirror at `/debian` serving the fixture suite, with the given InRelease and
/// Packages.gz bytes.
fn mirror(inrelease: Vec<u8>, packages_gz: Vec<u8>) -> TestServer {
    let server = TestServer::start();
    server.route("/debian/dists/bookworm/InRelease", Route::ok(inrelease));
    server.route(
        "/debian/dists/bookworm/main/binary-amd64/Packages.gz",
        Route::ok(packages_gz),
    );
    server
}

fn request(server: &TestServer, include: &[&str]) -> BaseRequest {
    // The fixture index is dated 2026-12-01 and never changes: judged a day later, so
    // these tests do not age (tests/freshness_and_bounds.rs judges dates).
    let mut freshness = Freshness::now(730);
    freshness.now = "2026-12-02T00:00:00Z".parse().unwrap();
    BaseRequest {
        mirror: server.url("/debian"),
        suite: "bookworm".into(),
        architecture: "amd64".into(),
        keyring: fixture("keyring.gpg"),
        include: include.iter().map(|s| s.to_string()).collect(),
        freshness,
        bounds: IndexBounds::default(),
    }
}

fn lock(req: &BaseRequest) -> anyhow::Result<commstack_debian::LockedBase> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(lock_base(req))
}

#[test]
fn closure_follows_alternatives_virtuals_and_versions() {
    let server = mirror(read("InRelease"), read("Packages.gz"));
    let base = lock(&request(&server, &["app"])).unwrap();
    let names: Vec<(&str, String)> = base
        .packages
        .iter()
        .map(|p| (p.name.as_str(), p.version.to_string()))
        .collect();
    let expected = [
        // Included; its `gawk | mawk` takes mawk, already chosen for base-files' `awk`.
        ("app", "1.0-1"),
        // Essential (the arm64 essential package is another architecture's).
        ("base-files", "12.4"),
        ("dash", "0.5.12-2"),
        // mail-transport-agent: exim4 is the provider of the highest Priority (standard).
        ("exim4", "4.96-15"),
        ("libc6", "2.36-9+deb12u13"),
        // libfoo-abi-1: its only provider.
        ("libfoo1", "1.2-1"),
        // libssl (<< 3): only libssl1.1's versioned Provides fits; libssl3's is 3.0.17.
        ("libssl1.1", "1.1.1w-0+deb11u1"),
        // awk (base-files' Pre-Depends): mawk (required) over gawk (optional).
        ("mawk", "1.3.4.20200120-3.1"),
        // python3:any (>= 3.11~), and its exact Pre-Depends.
        ("python3", "3.11.2-1+b1"),
        ("python3-minimal", "3.11.2-1+b1"),
    ];
    let expected: Vec<(&str, String)> = expected.iter().map(|(n, v)| (*n, v.to_string())).collect();
    assert_eq!(names, expected);
    assert_eq!(base.release_date.to_string(), "2026-12-01T00:00:00Z");
    let gz_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(read("Packages.gz")))
    };
    assert_eq!(base.packages_sha256, gz_sha);
    let exim = base.packages.iter().find(|p| p.name == "exim4").unwrap();
    assert_eq!(exim.filename, "pool/main/e/exim4/exim4_4.96-15_all.deb");
    assert_eq!(exim.size, 8000);
    assert_eq!(exim.sha256, "7".repeat(64));
    assert_eq!(
        commstack_debian::LockedBase::url(&server.url("/debian/"), exim),
        server.url("/debian/pool/main/e/exim4/exim4_4.96-15_all.deb")
    );
    // No include: the essential set only.
    let essential = lock(&request(&server, &[])).unwrap();
    let names: Vec<&str> = essential.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["base-files", "dash", "libc6", "mawk"]);
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn a_packages_index_other_than_the_signed_one_is_refused() {
    // The same packages, one sha256 changed: what a mirror serving an altered index does.
    let text = String::from_utf8(read("Packages")).unwrap();
    let tampered = text.replace(&"7".repeat(64), &"8".repeat(64));
    let server = mirror(read("InRelease"), gzip(tampered.as_bytes()));
    let err = format!("{:#}", lock(&request(&server, &["app"])).unwrap_err());
    assert!(
        err.contains("Packages.gz")
            && err.contains("but the signed")
            && err.contains("InRelease lists"),
        "{err}"
    );
}

#[test]
fn a_bad_signature_is_refused() {
    // One byte of the signed text changed (the date), signature kept.
    let signed = String::from_utf8(read("InRelease")).unwrap();
    let altered = signed.replace("Date: Tue, 01 Dec 2026", "Date: Wed, 02 Dec 2026");
    assert_ne!(altered, signed);
    let server = mirror(altered.into_bytes(), read("Packages.gz"));
    let err = format!("{:#}", lock(&request(&server, &["app"])).unwrap_err());
    assert!(err.contains("the signature does not verify"), "{err}");
    assert!(
        err.contains("BAD signature"),
        "gpgv's own words are passed on: {err}"
    );
    // The index is never read when the release does not verify.
    assert_eq!(
        server.hits("/debian/dists/bookworm/main/binary-amd64/Packages.gz"),
        0
    );

    // The signed release with text around it (a second signed block appended, or
    // unsigned lines in front): gpgv still reports a good signature for the first block,
    // but the file is not one clearsigned message, as apt requires.
    let signed_bytes = read("InRelease");
    let mut appended = signed_bytes.clone();
    appended.extend_from_slice(&signed_bytes);
    let mut prepended = b"Suite: evil\n\n".to_vec();
    prepended.extend_from_slice(&signed_bytes);
    for bytes in [appended, prepended] {
        let server = mirror(bytes, read("Packages.gz"));
        let err = format!("{:#}", lock(&request(&server, &["app"])).unwrap_err());
        assert!(err.contains("the signature does not verify"), "{err}");
    }

    // A release signed by a key the keyring does not hold.
    let server = mirror(read("InRelease"), read("Packages.gz"));
    let other = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(other.path(), b"").unwrap();
    let mut req = request(&server, &["app"]);
    req.keyring = other.path().to_path_buf();
    let err = format!("{:#}", lock(&req).unwrap_err());
    assert!(err.contains("the signature does not verify"), "{err}");

    // A keyring that does not exist is named, with the package that brings it.
    req.keyring = PathBuf::from("/nonexistent/archive-keyring.gpg");
    let err = format!("{:#}", lock(&req).unwrap_err());
    assert!(
        err.contains("/nonexistent/archive-keyring.gpg does not exist")
            && err.contains("apt-get install gpgv debian-archive-keyring"),
        "{err}"
    );
}

#[test]
fn unsatisfiable_dependencies_and_unknown_includes_are_named() {
    let server = mirror(read("InRelease"), read("Packages.gz"));
    let err = format!("{:#}", lock(&request(&server, &["broken"])).unwrap_err());
    assert!(
        err.contains("broken 1.0 depends on `nothere (>= 1) | alsonot`"),
        "{err}"
    );
    let err = format!("{:#}", lock(&request(&server, &["python4"])).unwrap_err());
    assert!(
        err.contains("image.include names \"python4\", which is not a package of the index"),
        "{err}"
    );
}

#[test]
fn a_release_for_another_suite_is_refused() {
    // The fixture's InRelease served as "trixie": signed, but for bookworm.
    let server = TestServer::start();
    server.route(
        "/debian/dists/trixie/InRelease",
        Route::ok(read("InRelease")),
    );
    let mut req = request(&server, &[]);
    req.suite = "trixie".into();
    let err = format!("{:#}", lock(&req).unwrap_err());
    assert!(
        err.contains("is signed for suite \"stable\" (codename \"bookworm\"), not \"trixie\""),
        "{err}"
    );
}
