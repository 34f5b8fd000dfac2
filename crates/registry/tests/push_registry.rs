//! Pushes against a real registry (testkit's [`TestRegistry`]: Debian's docker-registry on
//! 127.0.0.1 with TLS from a CA made for the test and htpasswd auth). The image is written
//! by the image crate (layer tars, OCI layout, docker-archive). skopeo and Docker read
//! what was pushed. A registry gone in the middle of a blob is testkit's [`CutProxy`]
//! cutting the connections after a byte count.
//!
//! docker-registry, openssl, htpasswd (apache2-utils), skopeo and Docker are required: a
//! missing one fails the test. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips them instead.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::noise;
use commstack_testkit::registry::run_tool;
use commstack_testkit::{
    CutProxy, Direction, REGISTRY_PASSWORD, REGISTRY_USER, RegistryAuthMode, TestRegistry,
    skip_registry_tests,
};

use commstack_image::{ImageSpec, OciImage, write_docker_archive, write_layer, write_oci_layout};
use commstack_registry::RegistryAuth;
use commstack_registry::artifact::{Artifact, write_artifact_layout};
use commstack_registry::{
    Credentials, Layout, PushOptions, Pushed, RetryPolicy, Target, push_layout,
};

const EPOCH: u64 = 1_764_547_200; // 2025-12-01T00:00:00Z
const REPO: &str = "commstack/test";
const LOCK: &str = "5f0e6b1c2d3a4958b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4";

fn run(program: &str, args: &[&str]) -> std::process::Output {
    run_tool(Path::new("."), program, args)
}

fn options(registry: &TestRegistry, auth: RegistryAuth) -> PushOptions {
    let target = Target::parse(&format!("{}/{REPO}", registry.host())).unwrap();
    let mut options = PushOptions::new(target);
    options.ca_file = Some(registry.ca());
    options.progress = false;
    options.credentials = Some(Credentials {
        auth,
        source: "the test".to_string(),
    });
    // A refused request is not retried; keep a transient one short.
    options.retry = RetryPolicy {
        attempts: 2,
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(100),
    };
    options
}

fn good(registry: &TestRegistry) -> PushOptions {
    options(
        registry,
        RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
    )
}

/// A two-layer image (a few files, one of 2 MiB of noise) as an OCI layout in
/// `root/oci` and a docker-archive in `root/image.tar`; `run_label` makes its ID unique
/// to this run.
fn fixture(root: &Path, run_label: &str) -> (OciImage, PathBuf) {
    let bin = root.join("tree-bin");
    let data = root.join("tree-data");
    std::fs::create_dir_all(bin.join("opt/commstack/bin")).unwrap();
    std::fs::create_dir_all(data.join("opt/commstack/share")).unwrap();
    std::fs::write(bin.join("opt/commstack/bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    let mut noise = Vec::with_capacity(2 << 20);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while noise.len() < 2 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(data.join("opt/commstack/share/noise.bin"), &noise).unwrap();
    std::fs::write(data.join("opt/commstack/share/run"), run_label).unwrap();
    let layers = vec![
        write_layer(&bin, &root.join("bin.tar"), EPOCH).unwrap(),
        write_layer(&data, &root.join("data.tar"), EPOCH).unwrap(),
    ];
    let labels = [
        ("dev.commstack.lock.sha256", LOCK),
        ("dev.commstack.torch", "2.11.0+cu130"),
        ("dev.commstack.cuda", "13.0"),
        ("dev.commstack.nvshmem", "3.4.5"),
        ("dev.commstack.deepep", "567632d"),
        ("dev.commstack.test.run", run_label),
    ];
    let spec = ImageSpec {
        tag: format!("commstack-registry-test:{}", &LOCK[..12]),
        env: vec!["PATH=/opt/commstack/bin:/bin".into()],
        cmd: vec!["/opt/commstack/bin/tool".into()],
        epoch: EPOCH,
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..ImageSpec::default()
    };
    let archive = root.join("image.tar");
    let docker = write_docker_archive(&spec, &layers, &archive).unwrap();
    let oci = write_oci_layout(&spec, &layers, &root.join("oci")).unwrap();
    assert_eq!(oci.config_digest, docker.image_id);
    (oci, archive)
}

fn run_label() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}-{nanos}", std::process::id())
}

fn skopeo_raw(registry: &TestRegistry, reference: &str) -> Vec<u8> {
    let out = skopeo_inspect(registry, reference);
    assert!(
        out.status.success(),
        "skopeo inspect {reference}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `skopeo inspect --raw` of `reference` with the registry's CA and credentials.
fn skopeo_inspect(registry: &TestRegistry, reference: &str) -> std::process::Output {
    Command::new("skopeo")
        .args([
            "inspect",
            "--raw",
            "--cert-dir",
            registry.cert_dir().to_str().unwrap(),
            "--creds",
            &format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"),
            &format!("docker://{reference}"),
        ])
        .output()
        .expect("skopeo is needed for this test (Debian: skopeo)")
}

fn manifest_bytes(layout: &Path, oci: &OciImage) -> Vec<u8> {
    let hex = oci.manifest_digest.strip_prefix("sha256:").unwrap();
    std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()
}

#[test]
fn pushes_by_digest_with_tags_and_a_second_push_uploads_nothing() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let (oci, _) = fixture(work.path(), &run_label());
    let layout = work.path().join("oci");

    let started = Instant::now();
    let first: Pushed = push_layout(&layout, &good(&registry)).unwrap();
    eprintln!("first push: {:.2} s", started.elapsed().as_secs_f64());
    assert_eq!(
        first.reference,
        format!("{}/{REPO}@{}", registry.host(), oci.manifest_digest)
    );
    assert_eq!(first.config_digest, oci.config_digest);
    assert_eq!(first.uploaded.len(), 3, "config and two layers: {first:?}");
    assert!(first.present.is_empty());
    let lock_tag = format!("lock-{LOCK}");
    assert_eq!(
        first.tags,
        vec![
            lock_tag.clone(),
            "torch2.11.0-cu130-cuda13.0-nvshmem3.4.5-deepep567632d".to_string()
        ]
    );

    // What the registry serves, by digest and under each tag, is the layout's manifest.
    let manifest = manifest_bytes(&layout, &oci);
    assert_eq!(skopeo_raw(&registry, &first.reference), manifest);
    for tag in &first.tags {
        let by_tag = skopeo_raw(&registry, &format!("{}/{REPO}:{tag}", registry.host()));
        assert_eq!(by_tag, manifest, "tag {tag}");
    }
    let blobs_before = registry.blob_files();
    for digest in &first.uploaded {
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert!(
            blobs_before.iter().any(|(h, ..)| h == hex),
            "{digest} is not in the registry's storage"
        );
    }

    let second = push_layout(&layout, &good(&registry)).unwrap();
    assert_eq!(second.reference, first.reference);
    assert!(second.uploaded.is_empty(), "{second:?}");
    assert_eq!(second.present.len(), 3);
    assert_eq!(second.bytes_uploaded, 0);
    // The registry's own record agrees: no blob file was written again.
    assert_eq!(registry.blob_files(), blobs_before);

    // Another image sharing the bottom layer: only its config and top layer move.
    let other = tempfile::tempdir().unwrap();
    let (oci2, _) = fixture(other.path(), &run_label());
    assert_eq!(oci2.layer_digests[0], oci.layer_digests[0]);
    let third = push_layout(&other.path().join("oci"), &good(&registry)).unwrap();
    assert_eq!(
        third.uploaded,
        vec![oci2.config_digest.clone(), oci2.layer_digests[1].clone()]
    );
    assert_eq!(third.present, vec![oci.layer_digests[0].clone()]);
}

/// A registry that is not up yet (connection refused) is reached by retrying with backoff.
#[test]
fn a_registry_that_comes_up_late_is_reached_by_retrying() {
    if skip_registry_tests() {
        return;
    }
    let mut registry = TestRegistry::prepare();
    let work = tempfile::tempdir().unwrap();
    let (oci, _) = fixture(work.path(), &run_label());
    let mut options = good(&registry);
    // 0.25 + 0.5 + 1 + 1 + 1 + 1 s of waiting in all: the registry is up after about 1 s.
    options.retry = RetryPolicy {
        attempts: 7,
        backoff: Duration::from_millis(250),
        max_backoff: Duration::from_secs(1),
    };
    let layout = work.path().join("oci");
    let pushing = std::thread::spawn(move || push_layout(&layout, &options));
    std::thread::sleep(Duration::from_millis(800));
    assert!(!pushing.is_finished(), "the push waits for the registry");
    registry.serve();
    let pushed = pushing.join().unwrap().unwrap();
    assert_eq!(pushed.manifest_digest, oci.manifest_digest);
    assert_eq!(pushed.uploaded.len(), 3);
}

/// A registry with token auth: oci-client takes the user and password to the token
/// service and the token to the registry; a wrong password is refused by the service.
#[test]
fn a_bearer_token_registry_is_pushed_to_through_its_token_service() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start_with(RegistryAuthMode::Token);
    let work = tempfile::tempdir().unwrap();
    let (oci, _) = fixture(work.path(), &run_label());
    let layout = work.path().join("oci");
    let pushed = push_layout(&layout, &good(&registry)).unwrap();
    assert_eq!(pushed.manifest_digest, oci.manifest_digest);
    assert_eq!(
        skopeo_raw(&registry, &pushed.reference),
        manifest_bytes(&layout, &oci)
    );
    let requests = registry.token_requests();
    assert!(
        requests
            .iter()
            .any(|(user, scope, granted)| user == REGISTRY_USER
                && scope.contains(&format!("repository:{REPO}:pull,push"))
                && *granted),
        "a push token was asked for: {requests:?}"
    );

    let wrong = options(
        &registry,
        RegistryAuth::Basic(REGISTRY_USER.into(), "wrong".into()),
    );
    let err = push_layout(&layout, &wrong).unwrap_err();
    let text = format!("{err:#}");
    eprintln!("{text}");
    assert!(text.contains("token service refused"), "{text}");
    assert!(text.contains(&registry.host()), "{text}");
    assert!(
        registry
            .token_requests()
            .iter()
            .any(|(_, _, granted)| !granted)
    );
}

#[test]
fn wrong_or_missing_credentials_are_refused_with_a_clear_error() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    fixture(work.path(), &run_label());
    let layout = work.path().join("oci");
    for auth in [
        RegistryAuth::Basic(REGISTRY_USER.into(), "wrong".into()),
        RegistryAuth::Anonymous,
    ] {
        let err = push_layout(&layout, &options(&registry, auth.clone())).unwrap_err();
        let text = format!("{err:#}");
        eprintln!("{auth:?}: {text}");
        for needed in [
            registry.host().as_str(),
            REPO,
            "401",
            "credentials",
            "docker login",
        ] {
            assert!(text.contains(needed), "{auth:?}: {needed:?} not in: {text}");
        }
    }
    assert!(registry.blob_files().is_empty(), "nothing was stored");
}

#[test]
fn a_tampered_blob_is_refused_before_anything_is_uploaded() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let (oci, _) = fixture(work.path(), &run_label());
    let layout = work.path().join("oci");
    let layer = &oci.layer_digests[1];
    let path = layout
        .join("blobs/sha256")
        .join(layer.strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let err = push_layout(&layout, &good(&registry)).unwrap_err();
    let text = format!("{err:#}");
    eprintln!("{text}");
    assert!(text.contains("damaged"), "{text}");
    assert!(text.contains(layer.as_str()), "{text}");
    assert!(text.contains("layer 2 of 2"), "{text}");
    assert!(registry.blob_files().is_empty(), "nothing was uploaded");
}

#[test]
fn an_unknown_ca_is_refused_and_the_error_says_to_give_one() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    fixture(work.path(), &run_label());
    let mut options = good(&registry);
    options.ca_file = None;
    let started = Instant::now();
    let err = push_layout(&work.path().join("oci"), &options).unwrap_err();
    let text = format!("{err:#}");
    eprintln!("{text}");
    assert!(text.contains("--ca-file"), "{text}");
    assert!(text.contains(&registry.host()), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a TLS failure is not retried"
    );
}

/// Removes a directory made under /etc/docker/certs.d for the test, and certs.d itself
/// when that leaves it empty.
struct RemoveDir(PathBuf);
impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// `docker pull` of the pushed reference gives the image ID `docker load` of the same
/// image gives: the config's digest.
#[test]
fn docker_pulls_the_pushed_digest_as_the_loaded_image_id() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let (oci, archive) = fixture(work.path(), &run_label());
    let pushed = push_layout(&work.path().join("oci"), &good(&registry)).unwrap();

    let loaded = run("docker", &["load", "-q", "-i", archive.to_str().unwrap()]);
    let loaded = String::from_utf8_lossy(&loaded.stdout).to_string();
    let id = run(
        "docker",
        &[
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            &format!("commstack-registry-test:{}", &LOCK[..12]),
        ],
    );
    let loaded_id = String::from_utf8_lossy(&id.stdout).trim().to_string();
    assert_eq!(loaded_id, oci.config_digest, "docker load: {loaded}");
    // Gone again, so that the pull below fetches it.
    run("docker", &["rmi", "-f", &loaded_id]);

    let certs = PathBuf::from("/etc/docker/certs.d").join(registry.host());
    std::fs::create_dir_all(&certs).expect("writing /etc/docker/certs.d needs root");
    let _cleanup = RemoveDir(certs.clone());
    std::fs::copy(registry.ca(), certs.join("ca.crt")).unwrap();
    let config = work.path().join("docker-config");
    let config = config.to_str().unwrap();
    let mut login = Command::new("docker")
        .args([
            "--config",
            config,
            "login",
            "-u",
            REGISTRY_USER,
            "--password-stdin",
            &registry.host(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("docker");
    use std::io::Write;
    login
        .stdin
        .take()
        .unwrap()
        .write_all(REGISTRY_PASSWORD.as_bytes())
        .unwrap();
    let out = login.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "docker login: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    run(
        "docker",
        &["--config", config, "pull", "-q", &pushed.reference],
    );
    let id = run(
        "docker",
        &["image", "inspect", "--format", "{{.Id}}", &pushed.reference],
    );
    let pulled_id = String::from_utf8_lossy(&id.stdout).trim().to_string();
    run("docker", &["rmi", "-f", &pulled_id]);
    assert_eq!(pulled_id, loaded_id, "docker pull gives the docker load ID");
}

/// The big layer's size: large enough that a cut at half of it lands well inside its
/// upload, whatever the requests before it cost.
const BIG: u64 = 32 << 20;

/// An OCI layout (an artifact: config, two small layers, then a [`BIG`] one) in
/// `root/oci`, uploaded in that order with one job, so that the small ones are stored
/// before the big one starts.
fn three_layers(root: &Path) -> Layout {
    let layers = [
        ("small-1", noise(4 << 10, 1)),
        ("small-2", noise(8 << 10, 2)),
    ]
    .into_iter()
    .chain([("big", noise(BIG as usize, 3))])
    .map(|(name, bytes)| {
        let path = root.join(format!("{name}.bin"));
        std::fs::write(&path, bytes).unwrap();
        ("application/octet-stream".to_string(), path)
    })
    .collect();
    let dir = root.join("oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: "application/vnd.dev.commstack.test.v1".into(),
            config_media_type: "application/vnd.dev.commstack.test.config.v1+json".into(),
            config: br#"{"name":"cut"}"#.to_vec(),
            layers,
            annotations: Default::default(),
            subject: None,
        },
        &dir,
    )
    .unwrap();
    Layout::open(&dir).unwrap()
}

/// skopeo finds no manifest at `reference` (it fails, saying the manifest is unknown).
fn assert_no_manifest(registry: &TestRegistry, reference: &str) {
    let out = skopeo_inspect(registry, reference);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{reference} exists after a failed push"
    );
    assert!(stderr.contains("manifest unknown"), "{reference}: {stderr}");
}

/// The stored blob files of `digests` (inode and mtime: equal later means not rewritten).
fn stored(registry: &TestRegistry, digests: &[String]) -> Vec<(String, u64, i64, i64)> {
    let hexes: Vec<&str> = digests
        .iter()
        .map(|d| d.strip_prefix("sha256:").unwrap())
        .collect();
    registry
        .blob_files()
        .into_iter()
        .filter(|(hex, ..)| hexes.contains(&hex.as_str()))
        .collect()
}

/// The registry gone in the middle of a blob's upload (a proxy cuts every connection
/// after half the big blob, and refuses new ones, so the retries fail too): the push
/// fails naming the blob, the registry and what a rerun does, and leaves no manifest or
/// tag behind, only the whole blobs sent before. Healed, the rerun sends the big blob
/// alone (the HEADs find the others) and the manifest reads back.
#[test]
fn a_push_cut_mid_blob_fails_clearly_and_the_rerun_sends_only_what_is_missing() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let proxy = CutProxy::start(&registry.host());
    let work = tempfile::tempdir().unwrap();
    let layout = three_layers(work.path());
    let (big, before_big) = layout.blobs.split_last().unwrap();
    assert_eq!(big.size, BIG);
    let before_big: Vec<String> = before_big.iter().map(|b| b.digest.clone()).collect();
    let mut options = good(&registry);
    options.target = Target::parse(&format!("{}/{REPO}", proxy.host())).unwrap();
    options.tag = Some("cut".into());
    // In layout order: the cut lands in the big blob, after the small ones are stored.
    options.jobs = 1;
    let by_tag = format!("{}/{REPO}:cut", registry.host());
    let by_digest = format!("{}/{REPO}@{}", registry.host(), layout.manifest_digest);

    proxy.cut_after(Direction::ToServer, BIG / 2);
    let started = Instant::now();
    let err = push_layout(&layout.dir, &options).unwrap_err();
    let text = format!("{err:#}");
    eprintln!(
        "cut push failed in {:.2} s: {text}",
        started.elapsed().as_secs_f64()
    );
    assert!(proxy.is_cut(), "the push failed before the cut: {text}");
    for needed in [
        proxy.host().as_str(),
        REPO,
        big.digest.as_str(),
        "layer 3 of 3",
        "rerun",
    ] {
        assert!(text.contains(needed), "{needed:?} not in: {text}");
    }
    // Nothing half-written: the blobs sent before the cut are stored whole, the big one
    // is not a blob, and neither the manifest nor the tag exists.
    let kept = stored(&registry, &before_big);
    assert_eq!(kept.len(), before_big.len(), "stored: {kept:?}");
    assert!(stored(&registry, std::slice::from_ref(&big.digest)).is_empty());
    assert_no_manifest(&registry, &by_digest);
    assert_no_manifest(&registry, &by_tag);

    proxy.heal();
    let sent_before = proxy.moved(Direction::ToServer);
    let started = Instant::now();
    let pushed = push_layout(&layout.dir, &options).unwrap();
    let sent = proxy.moved(Direction::ToServer) - sent_before;
    eprintln!(
        "rerun: {:.2} s, {sent} bytes sent",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(pushed.uploaded, vec![big.digest.clone()], "{pushed:?}");
    assert_eq!(pushed.present, before_big);
    assert_eq!(pushed.bytes_uploaded, BIG);
    // The proxy's count agrees: the big blob once, plus requests and TLS (< 1 MiB).
    assert!(
        (BIG..BIG + (1 << 20)).contains(&sent),
        "{sent} bytes sent for a {BIG} byte blob"
    );
    assert_eq!(stored(&registry, &before_big), kept, "rewritten");
    let big_stored = registry.blob_data(&big.digest);
    assert_eq!(
        format!(
            "sha256:{}",
            commstack_digest::sha256_file(&big_stored).unwrap()
        ),
        big.digest
    );
    assert_eq!(skopeo_raw(&registry, &by_digest), layout.manifest);
    assert_eq!(skopeo_raw(&registry, &by_tag), layout.manifest);
}
