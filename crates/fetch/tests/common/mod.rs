//! Helpers shared by the fetch tests: artifacts served by a real loopback server, fast
//! retry settings, and the cache invariant every test ends by checking.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use commstack_digest::sha256_file;
use commstack_fetch::{Artifact, FetchOptions};
use commstack_testkit::{Route, TestServer};
use sha2::{Digest, Sha256};

/// Deterministic, non-repeating-looking bytes.
pub fn bytes(n: usize, seed: u8) -> Vec<u8> {
    let mut state = 0x9e3779b97f4a7c15u64 ^ u64::from(seed);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

pub fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// An artifact whose only URL is `path` on `server`, locked to `data`.
pub fn artifact(server: &TestServer, name: &str, path: &str, data: &[u8]) -> Artifact {
    Artifact::new(name, &server.url(path), &sha256(data))
        .unwrap()
        .with_size(data.len() as u64)
}

/// Serves `data` normally at `path` and returns its artifact.
pub fn serve(server: &TestServer, name: &str, path: &str, data: &[u8]) -> Artifact {
    server.route(path, Route::ok(data.to_vec()));
    artifact(server, name, path, data)
}

/// Options for tests: fast backoff, short timeouts, no progress bars.
pub fn options(cache: &Path) -> FetchOptions {
    let mut options = FetchOptions::new(cache);
    options.retries = 3;
    options.backoff = Duration::from_millis(10);
    options.max_backoff = Duration::from_millis(50);
    options.max_retry_after = Duration::from_secs(2);
    options.connect_timeout = Duration::from_secs(5);
    options.read_timeout = Duration::from_secs(5);
    options.progress = false;
    options
}

/// The invariant: every file under `sha256/` hashes to its directory name, and the
/// cached (sha256, filename) pairs are exactly `expected`. Nothing partial is visible.
pub fn assert_cache_holds(cache: &Path, expected: &[(&str, &str)]) {
    let mut seen = Vec::new();
    if let Ok(digests) = std::fs::read_dir(cache.join("sha256")) {
        for digest in digests {
            let digest = digest.unwrap();
            for file in std::fs::read_dir(digest.path()).unwrap() {
                let file = file.unwrap();
                let sha = digest.file_name().to_string_lossy().into_owned();
                assert_eq!(
                    sha256_file(&file.path()).unwrap(),
                    sha,
                    "{} holds other bytes",
                    file.path().display()
                );
                seen.push((sha, file.file_name().to_string_lossy().into_owned()));
            }
        }
    }
    seen.sort();
    let mut expected: Vec<(String, String)> = expected
        .iter()
        .map(|(s, f)| (s.to_string(), f.to_string()))
        .collect();
    expected.sort();
    assert_eq!(seen, expected, "cache contents");
}

pub fn partial_len(cache: &Path, sha256: &str) -> Option<u64> {
    std::fs::metadata(cache.join("tmp").join(format!("{sha256}.part")))
        .ok()
        .map(|m| m.len())
}

/// The locked sha256 of an artifact pinned by one.
pub fn sha(artifact: &commstack_fetch::Artifact) -> &str {
    artifact.sha256.as_deref().expect("pinned by sha256")
}
