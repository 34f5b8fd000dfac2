//! Blob downloads against a real registry (testkit's docker-registry with TLS and
//! htpasswd auth) through testkit's [`CutProxy`], which cuts every connection once a
//! given number of bytes has come back from the registry and refuses new ones until
//! healed: the registry gone in the middle of a blob. The partial file is kept, and the
//! rerun asks for the rest only (a range request); a partial file with wrong bytes never
//! becomes a wrong blob.
//!
//! docker-registry, openssl and htpasswd (apache2-utils) are required: a missing one fails
//! the test. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips them instead.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{noise, options_for};
use commstack_registry::artifact::{Artifact, write_artifact_layout};
use commstack_registry::pull::{Puller, Wanted, pull_blob};
use commstack_registry::{Layout, PushOptions, push_layout};
use commstack_testkit::{CutProxy, Direction, TestRegistry, skip_registry_tests};

const REPO: &str = "commstack/pull";
/// The blob's size: the cut lands at half of it.
const BIG: u64 = 32 << 20;

/// A registry holding one [`BIG`] blob (pushed directly, not through the proxy), the
/// proxy in front of it, the blob's bytes and digest.
struct Setup {
    registry: TestRegistry,
    proxy: CutProxy,
    bytes: Vec<u8>,
    digest: String,
    work: tempfile::TempDir,
}

/// An OCI layout in `root/oci` of a test artifact whose config names `name`, one layer per
/// file.
fn test_artifact(root: &Path, name: &str, files: Vec<PathBuf>) -> PathBuf {
    let dir = root.join("oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: "application/vnd.dev.commstack.test.v1".into(),
            config_media_type: "application/vnd.dev.commstack.test.config.v1+json".into(),
            config: format!(r#"{{"name":"{name}"}}"#).into_bytes(),
            layers: files
                .into_iter()
                .map(|f| ("application/octet-stream".to_string(), f))
                .collect(),
            annotations: Default::default(),
            subject: None,
        },
        &dir,
    )
    .unwrap();
    dir
}

fn setup() -> Setup {
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let bytes = noise(BIG as usize, 0x9e37_79b9_7f4a_7c15);
    let file = work.path().join("big.bin");
    std::fs::write(&file, &bytes).unwrap();
    let dir = test_artifact(work.path(), "pull", vec![file]);
    push_layout(&dir, &options_for(&registry.host(), &registry, REPO)).unwrap();
    let digest = Layout::open(&dir).unwrap().blobs[1].digest.clone();
    let proxy = CutProxy::start(&registry.host());
    Setup {
        registry,
        proxy,
        bytes,
        digest,
        work,
    }
}

impl Setup {
    fn through_proxy(&self) -> PushOptions {
        options_for(&self.proxy.host(), &self.registry, REPO)
    }

    fn part(&self) -> PathBuf {
        self.work.path().join("blob.part")
    }

    /// A pull through the proxy cut after half the blob came back: it fails, naming the
    /// blob and the registry and saying a rerun resumes, and keeps a prefix of the blob.
    /// Returns the prefix's length.
    fn cut_pull(&self) -> u64 {
        self.proxy.cut_after(Direction::ToClient, BIG / 2);
        let started = Instant::now();
        let err = pull_blob(&self.through_proxy(), &self.digest, BIG, &self.part()).unwrap_err();
        let text = format!("{err:#}");
        eprintln!(
            "cut pull failed in {:.2} s: {text}",
            started.elapsed().as_secs_f64()
        );
        assert!(
            self.proxy.is_cut(),
            "the pull failed before the cut: {text}"
        );
        for needed in [
            self.proxy.host().as_str(),
            REPO,
            self.digest.as_str(),
            "rerun resumes",
        ] {
            assert!(text.contains(needed), "{needed:?} not in: {text}");
        }
        let kept = std::fs::read(self.part()).unwrap();
        let have = kept.len() as u64;
        assert!(0 < have && have < BIG, "{have} bytes kept of {BIG}");
        assert!(
            kept == self.bytes[..kept.len()],
            "the kept bytes are a prefix"
        );
        have
    }

    /// Heals the proxy and pulls again into the same file; returns the bytes that came
    /// back through the proxy.
    fn healed_pull(&self) -> u64 {
        self.proxy.heal();
        let before = self.proxy.moved(Direction::ToClient);
        let started = Instant::now();
        pull_blob(&self.through_proxy(), &self.digest, BIG, &self.part()).unwrap();
        let received = self.proxy.moved(Direction::ToClient) - before;
        eprintln!(
            "rerun: {:.2} s, {received} bytes received",
            started.elapsed().as_secs_f64()
        );
        received
    }

    /// The file is the blob: its bytes, and so its digest.
    fn assert_whole(&self, path: &Path) {
        let hex = commstack_digest::sha256_file(path).unwrap();
        assert_eq!(format!("sha256:{hex}"), self.digest);
        assert!(std::fs::read(path).unwrap() == self.bytes);
    }
}

/// Requests, headers and TLS records that come back besides the blob's bytes.
const OVERHEAD: u64 = 256 << 10;

#[test]
fn a_pull_cut_mid_blob_keeps_its_bytes_and_the_rerun_fetches_only_the_rest() {
    if skip_registry_tests() {
        return;
    }
    let s = setup();
    let have = s.cut_pull();
    let received = s.healed_pull();
    s.assert_whole(&s.part());
    // A range request from the kept length: the rest of the blob came back, not all of it.
    let rest = BIG - have;
    assert!(
        (rest..rest + OVERHEAD).contains(&received),
        "{received} bytes came back for the {rest} missing"
    );
}

#[test]
fn a_partial_download_with_wrong_bytes_is_dropped_and_fetched_whole() {
    if skip_registry_tests() {
        return;
    }
    let s = setup();
    let have = s.cut_pull();
    // One byte of the kept prefix damaged (a disk, another run's file): resumed, the
    // whole does not hash to the digest, and the pull starts over from the first byte.
    let mut kept = std::fs::read(s.part()).unwrap();
    kept[(have / 2) as usize] ^= 0x01;
    std::fs::write(s.part(), &kept).unwrap();
    let received = s.healed_pull();
    s.assert_whole(&s.part());
    let rest = BIG - have;
    assert!(
        (rest + BIG..rest + BIG + OVERHEAD).contains(&received),
        "{received} bytes came back: the rest ({rest}), then the whole blob ({BIG})"
    );
}

/// One session for a whole substitution: against a bearer-token registry, the look-up of a
/// tag, a config and several blobs downloaded several at a time ask the token service
/// once, not once per request (a token service is often another host, and rate-limits).
#[test]
fn a_pulling_session_asks_the_token_service_once() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start_with(commstack_testkit::RegistryAuthMode::Token);
    let work = tempfile::tempdir().unwrap();
    let files: Vec<PathBuf> = (0..4u64)
        .map(|i| {
            let file = work.path().join(format!("layer-{i}.bin"));
            std::fs::write(&file, noise((1 << 20) + i as usize, i + 7)).unwrap();
            file
        })
        .collect();
    let dir = test_artifact(work.path(), "tokens", files);
    let mut options = options_for(&registry.host(), &registry, REPO);
    options.tag = Some("tokens".into());
    push_layout(&dir, &options).unwrap();
    let layout = Layout::open(&dir).unwrap();
    let before = registry.token_requests().len();

    let puller = Puller::new(&options).unwrap();
    let found = puller
        .find_tag("tokens")
        .unwrap()
        .expect("the tag is there");
    assert_eq!(found.digest, layout.manifest_digest);
    let config = &layout.blobs[0];
    assert_eq!(
        puller
            .pull_document(
                &config.digest,
                config.size,
                commstack_registry::Document::Config
            )
            .unwrap(),
        br#"{"name":"tokens"}"#
    );
    assert!(matches!(
        puller.fetch_signatures(&found.digest).unwrap(),
        commstack_registry::Signatures::Unsigned { .. }
    ));
    let wanted: Vec<Wanted> = layout.blobs[1..]
        .iter()
        .map(|b| Wanted {
            digest: b.digest.clone(),
            size: b.size,
            part: work.path().join(format!("{}.part", &b.digest[7..19])),
            name: b.role.clone(),
        })
        .collect();
    // Each blob is announced once, when its file is whole: what an early docker load
    // reads at that moment is the blob.
    let landed = std::sync::Mutex::new(Vec::new());
    puller
        .pull_blobs(&wanted, 3, &|w: &Wanted| {
            let bytes = std::fs::read(&w.part).unwrap();
            assert_eq!(
                format!("sha256:{}", commstack_digest::sha256_hex(&bytes)),
                w.digest,
                "{} announced before it was whole",
                w.name
            );
            landed.lock().unwrap().push(w.digest.clone());
        })
        .unwrap();
    let mut landed = landed.into_inner().unwrap();
    landed.sort();
    let mut all: Vec<String> = wanted.iter().map(|w| w.digest.clone()).collect();
    all.sort();
    assert_eq!(landed, all);
    for (w, b) in wanted.iter().zip(&layout.blobs[1..]) {
        assert_eq!(
            std::fs::read(&w.part).unwrap(),
            std::fs::read(&b.path).unwrap()
        );
    }
    let asked: Vec<_> = registry.token_requests()[before..].to_vec();
    assert_eq!(asked.len(), 1, "token requests of the session: {asked:?}");
    assert!(
        asked[0].1.contains(&format!("repository:{REPO}:pull")) && asked[0].2,
        "{asked:?}"
    );
}

/// A token that has expired (a pull that outlived it): the session asks the token service
/// again, once, and goes on (the client keeps each token's expiry and the credentials of
/// the session's log-in).
#[test]
fn an_expired_token_is_asked_for_again() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start_with(commstack_testkit::RegistryAuthMode::Token);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("layer.bin");
    std::fs::write(&file, noise(1 << 20, 11)).unwrap();
    let dir = test_artifact(work.path(), "expired", vec![file.clone()]);
    let mut options = options_for(&registry.host(), &registry, REPO);
    options.tag = Some("expired".into());
    push_layout(&dir, &options).unwrap();
    let layout = Layout::open(&dir).unwrap();
    let before = registry.token_requests().len();

    registry.expire_next_token();
    let puller = Puller::new(&options).unwrap();
    let found = puller.find_tag("expired").unwrap();
    assert_eq!(
        found.map(|f| f.digest),
        Some(layout.manifest_digest.clone())
    );
    let part = work.path().join("layer.part");
    puller
        .pull_blob(&layout.blobs[1].digest, layout.blobs[1].size, &part)
        .unwrap();
    assert_eq!(std::fs::read(&part).unwrap(), std::fs::read(&file).unwrap());
    let asked = registry.token_requests()[before..].to_vec();
    assert_eq!(
        asked.len(),
        2,
        "the expired token, then one new one: {asked:?}"
    );
}
