//! The image's attestations end to end against the real registry the tests run (testkit's
//! docker-registry with TLS and htpasswd auth): `cargo xtask push --key` attaches the SBOM
//! and the SLSA provenance; the real cosign (an independent implementation: Debian sid's
//! cosign 3, which ci/cosign-tools.sh puts in .tools/bin) verifies both, and so does
//! `cargo xtask verify attestations` against the lock; a payload, a signature or a subject
//! altered in the registry is refused by both, and commstack's verify refuses the
//! attestations of another lock. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it; a missing
//! docker-registry or cosign fails it.

#[path = "../../crates/attest/tests/support/mod.rs"]
mod support;

mod common;
use common::text;

use std::path::Path;
use std::process::{Command, Output};

use base64::Engine as _;
use commstack_registry::attestations::{Attestation, fetch_attestations, push_attestations};
use commstack_registry::{Credentials, PushOptions, RegistryAuth, Target};
use commstack_testkit::cosign::cosign;
use commstack_testkit::registry::ed25519_key_pair;
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry, skip_registry_tests};

const SPDX: &str = "https://spdx.dev/Document";
const SLSA: &str = "https://slsa.dev/provenance/v1";

/// `cosign verify-attestation` of `reference` for predicate `kind` (spdxjson,
/// slsaprovenance1) under `key`: whether it passed, and what it said.
fn cosign_verify(
    registry: &TestRegistry,
    key: &Path,
    kind: &str,
    reference: &str,
) -> (bool, String) {
    let out = Command::new(cosign())
        .args(["verify-attestation", "--key"])
        .arg(key)
        .args([
            "--type",
            kind,
            "--insecure-ignore-tlog=true",
            "--registry-cacert",
        ])
        .arg(registry.ca())
        .args([
            "--registry-username",
            REGISTRY_USER,
            "--registry-password",
            REGISTRY_PASSWORD,
        ])
        .arg(reference)
        .env(
            "DOCKER_CONFIG",
            key.parent().unwrap().join("no-docker-config"),
        )
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn xtask(home: &Path, stack: &Path, args: &[&str]) -> Output {
    common::registry_command(home, true)
        .arg("--stack")
        .arg(stack)
        .args(args)
        .output()
        .unwrap()
}

fn options(registry: &TestRegistry, repo: &str) -> PushOptions {
    let mut options =
        PushOptions::new(Target::parse(&format!("{}/{repo}", registry.host())).unwrap());
    options.ca_file = Some(registry.ca());
    options.progress = false;
    options.credentials = Some(Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
        source: "the test".into(),
    });
    options
}

/// The envelope of `predicate` among `fetched`, as JSON.
fn envelope(fetched: &[Attestation], predicate: &str) -> serde_json::Value {
    let a = fetched
        .iter()
        .find(|a| a.predicate_type == predicate)
        .unwrap();
    serde_json::from_slice(&a.envelope).unwrap()
}

fn with(
    fetched: &[Attestation],
    predicate: &str,
    envelope: &serde_json::Value,
) -> Vec<Attestation> {
    fetched
        .iter()
        .map(|a| match a.predicate_type == predicate {
            true => Attestation {
                predicate_type: a.predicate_type.clone(),
                envelope: serde_json::to_vec(envelope).unwrap(),
            },
            false => a.clone(),
        })
        .collect()
}

#[test]
fn cosign_and_verify_check_the_pushed_attestations_and_refuse_them_altered() {
    if skip_registry_tests() {
        return;
    }
    let cosign_found = cosign();
    assert!(!cosign_found.as_os_str().is_empty());
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let b = support::built(work.path());
    let (key, public) = ed25519_key_pair(work.path(), "key");
    let repo = format!("{}/commstack/debian-12", registry.host());
    let ca = registry.ca();

    let out = xtask(
        &b.home,
        &b.stack,
        &[
            "push",
            "--registry",
            &repo,
            "--oci",
            b.layout.to_str().unwrap(),
            "--ca-file",
            ca.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let reference = format!("{repo}@{}", b.manifest_digest);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().last(),
        Some(reference.as_str())
    );
    assert!(text(&out).contains(&format!(
        "attestations attached (signed in-toto statements, cosign's format): {repo}:sha256-{}.att ({SPDX}, {SLSA})",
        b.manifest_digest.trim_start_matches("sha256:")
    )), "{}", text(&out));

    // The real cosign verifies both, each its statement about this digest.
    cosign_verifies_both(&registry, &public, &reference, &b);
    // Under another key cosign refuses them.
    let (_, other) = ed25519_key_pair(work.path(), "other");
    let (ok, said) = cosign_verify(&registry, &other, "spdxjson", &reference);
    assert!(!ok, "cosign took another key's: {said}");

    // commstack's own verify, against the lock.
    let verify = |keys: &[&Path]| {
        let mut args = vec![
            "verify",
            "attestations",
            "--image",
            &reference,
            "--ca-file",
            ca.to_str().unwrap(),
        ];
        for k in keys {
            args.extend(["--key", k.to_str().unwrap()]);
        }
        xtask(&b.home, &b.stack, &args)
    };
    let out = verify(&[&public]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("attestations verified"),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!(
            "ok   {SLSA} lock: made from the lock with sha256 {}",
            b.lock_sha256
        )),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("ok   {SPDX} packages: lists the")),
        "{}",
        text(&out)
    );
    // Without --key: stack.toml's [cache] trusted-keys.
    let stack_text = std::fs::read_to_string(&b.stack).unwrap();
    let trusted =
        commstack_attest::dsse::key_text(&commstack_attest::read_public_key(&public).unwrap());
    std::fs::write(
        &b.stack,
        format!("{stack_text}\n[cache]\ntrusted-keys = [\"{trusted}\"]\n"),
    )
    .unwrap();
    let out = verify(&[]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::write(&b.stack, &stack_text).unwrap();
    let out = verify(&[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("no key to trust: give the signer's public key with --key FILE"),
        "{}",
        text(&out)
    );
    let out = verify(&[&work.path().join("other.pub")]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("does not verify under a trusted key"),
        "{}",
        text(&out)
    );

    // Another lock: the stack's lock changed since (a comment, so it still parses): the
    // attestations are of another lock, and verify says so.
    let original = std::fs::read_to_string(&b.lock_path).unwrap();
    std::fs::write(&b.lock_path, format!("{original}# changed\n")).unwrap();
    let out = verify(&[&public]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "FAIL {SLSA} lock: made from the lock with sha256 \"{}\", not this lock",
            b.lock_sha256
        )),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains(&format!("FAIL {SPDX} lock:"))
            && text(&out).contains("an SBOM of another lock"),
        "{}",
        text(&out)
    );
    std::fs::write(&b.lock_path, &original).unwrap();

    // Tampered in the registry: each a new sha256-<hex>.att replacing the good one.
    let opts = options(&registry, "commstack/debian-12");
    let good: Vec<Attestation> = fetch_attestations(&opts, &b.manifest_digest)
        .unwrap()
        .unwrap()
        .into_iter()
        .map(|f| Attestation {
            predicate_type: f.predicate_type,
            envelope: f.envelope,
        })
        .collect();
    assert_eq!(good.len(), 2);
    let size = commstack_registry::attach::manifest_size(&b.layout).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let refused = |attestations: Vec<Attestation>, kind: &str, predicate: &str, ours: &str| {
        push_attestations((&b.manifest_digest, size), &attestations, &opts).unwrap();
        let (ok, said) = cosign_verify(&registry, &public, kind, &reference);
        assert!(!ok, "cosign took the altered {predicate}: {said}");
        let out = verify(&[&public]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains(&format!("FAIL {predicate} {ours}")),
            "{}",
            text(&out)
        );
    };
    // The payload: the provenance made to name another lock, the signature kept.
    let mut e = envelope(&good, SLSA);
    let mut statement: serde_json::Value =
        serde_json::from_slice(&b64.decode(e["payload"].as_str().unwrap()).unwrap()).unwrap();
    statement["predicate"]["buildDefinition"]["externalParameters"]["lock"]["sha256"] =
        "ee".repeat(32).into();
    e["payload"] = b64.encode(serde_json::to_vec(&statement).unwrap()).into();
    refused(with(&good, SLSA, &e), "slsaprovenance1", SLSA, "signature");
    // The signature: one bit of the SBOM's.
    let mut e = envelope(&good, SPDX);
    let mut sig = b64
        .decode(e["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    sig[10] ^= 1;
    e["signatures"][0]["sig"] = b64.encode(sig).into();
    refused(with(&good, SPDX, &e), "spdxjson", SPDX, "signature");
    // The subject: another image's attestations (validly signed, about its digest) put
    // under this image's tag.
    let other = push_another_image(work.path(), &opts);
    let signing = commstack_registry::sign::read_signing_key(&key).unwrap();
    let moved = about(&good, &other, &signing);
    refused(moved, "spdxjson", SPDX, "subject");
    let (ok, said) = cosign_verify(&registry, &public, "slsaprovenance1", &reference);
    assert!(!ok && said.contains("no matching subject digest"), "{said}");
    // The other image has none of its own: verify says where it looked and how to attach.
    let out = xtask(
        &b.home,
        &b.stack,
        &[
            "verify",
            "attestations",
            "--image",
            &format!("{repo}@{other}"),
            "--ca-file",
            ca.to_str().unwrap(),
            "--key",
            public.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains(&format!(
        "no attestations are attached (none among its referrers, no {repo}:sha256-{}.att): push the image with `cargo xtask push --registry {repo} --key KEY.pem`",
        other.trim_start_matches("sha256:")
    )), "{}", text(&out));

    // The good ones back: both verify again.
    push_attestations((&b.manifest_digest, size), &good, &opts).unwrap();
    assert!(cosign_verify(&registry, &public, "spdxjson", &reference).0);
    assert!(verify(&[&public]).status.success());
}

/// Another image pushed to the repository (tagged `other`): its manifest digest.
fn push_another_image(work: &Path, opts: &PushOptions) -> String {
    let tree = work.join("tree2");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("other"), "another image\n").unwrap();
    let layer =
        commstack_image::write_layer(&tree, &work.join("layer2.tar"), support::EPOCH).unwrap();
    let spec = commstack_image::ImageSpec {
        tag: "other:test".into(),
        ..Default::default()
    };
    let other = commstack_image::write_oci_layout(&spec, &[layer], &work.join("oci2")).unwrap();
    let mut opts = opts.clone();
    opts.tag = Some("other".into());
    commstack_registry::push_layout(&work.join("oci2"), &opts).unwrap();
    other.manifest_digest
}

/// `attestations`' statements made about the manifest `digest` instead, signed again
/// with `key`: valid envelopes about another image.
fn about(
    attestations: &[Attestation],
    digest: &str,
    key: &commstack_registry::SigningKey,
) -> Vec<Attestation> {
    let b64 = base64::engine::general_purpose::STANDARD;
    attestations
        .iter()
        .map(|a| {
            let e: serde_json::Value = serde_json::from_slice(&a.envelope).unwrap();
            let payload = b64.decode(e["payload"].as_str().unwrap()).unwrap();
            let mut s: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            s["subject"][0]["digest"]["sha256"] = digest.trim_start_matches("sha256:").into();
            let statement: commstack_attest::Statement = serde_json::from_value(s).unwrap();
            Attestation {
                predicate_type: a.predicate_type.clone(),
                envelope: commstack_attest::envelope_bytes(&statement, key),
            }
        })
        .collect()
}

/// The real cosign verifies both attestations of `reference`, each a statement about its
/// digest, the provenance made from what the build recorded.
fn cosign_verifies_both(
    registry: &TestRegistry,
    public: &Path,
    reference: &str,
    b: &support::Built,
) {
    let repo = reference.split('@').next().unwrap();
    for (kind, predicate) in [("spdxjson", SPDX), ("slsaprovenance1", SLSA)] {
        let (ok, said) = cosign_verify(registry, public, kind, reference);
        assert!(ok, "cosign {kind}: {said}");
        let line = said.lines().find(|l| l.starts_with('{')).unwrap();
        let envelope: serde_json::Value = serde_json::from_str(line).unwrap();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(envelope["payload"].as_str().unwrap())
            .unwrap();
        let statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(statement["predicateType"], predicate);
        assert_eq!(
            statement["subject"][0]["digest"]["sha256"],
            b.manifest_digest.trim_start_matches("sha256:")
        );
        assert_eq!(statement["subject"][0]["name"], repo);
        if predicate == SLSA {
            // Made from what the build recorded: the run's summary.json and each step's
            // record in the store, the lock.
            let p = &statement["predicate"];
            let steps = &p["buildDefinition"]["internalParameters"]["steps"];
            assert_eq!(steps[0]["key"], "pipeline-nvshmem-2b2b", "{p}");
            assert_eq!(steps[0]["inputs"]["recipe"], "nvshmem-7", "{p}");
            assert_eq!(
                p["runDetails"]["metadata"]["startedOn"],
                "2026-12-04T20:35:29Z"
            );
            assert_eq!(
                p["buildDefinition"]["externalParameters"]["lock"]["sha256"],
                b.lock_sha256
            );
        }
    }
}

/// On a registry with the OCI 1.1 referrers API (go-containerregistry's, testkit's
/// `ReferrersRegistry`), the attestations are a referrer of the image, found through that
/// API by commstack's verify, and tagged as well, where `cosign verify-attestation` reads
/// them without a flag.
#[test]
fn on_a_registry_with_referrers_the_attestations_are_referrers_cosign_and_verify_find() {
    let registry = commstack_testkit::cosign::ReferrersRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let b = support::built(work.path());
    let (key, public) = ed25519_key_pair(work.path(), "key");
    let repo = format!("{}/commstack/debian-12", registry.host());
    let out = xtask(
        &b.home,
        &b.stack,
        &[
            "push",
            "--registry",
            &format!("http://{repo}"),
            "--oci",
            b.layout.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let hex = b.manifest_digest.trim_start_matches("sha256:");
    assert!(
        text(&out).contains(&format!(
            "(a referrer of the image) and {repo}:sha256-{hex}.att ({SPDX}, {SLSA})"
        )),
        "{}",
        text(&out)
    );

    // Listed by the referrers API, with cosign's attestation artifactType.
    let mut options = PushOptions::new(Target::parse(&format!("http://{repo}")).unwrap());
    options.progress = false;
    let puller = commstack_registry::pull::Puller::new(&options).unwrap();
    let found = commstack_registry::referrer::find_attached(
        &puller,
        &b.manifest_digest,
        commstack_registry::attestations::ATTESTATION_ARTIFACT_TYPE,
        "att",
        16,
    )
    .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].through,
        commstack_registry::referrer::FoundThrough::Referrers
    );

    // The real cosign verifies both (through the tag), and commstack's verify (through
    // the referrers API) passes them against the lock.
    let reference = format!("{repo}@{}", b.manifest_digest);
    for kind in ["spdxjson", "slsaprovenance1"] {
        let out = Command::new(cosign())
            .args(["verify-attestation", "--key"])
            .arg(&public)
            .args([
                "--type",
                kind,
                "--insecure-ignore-tlog=true",
                "--allow-http-registry",
            ])
            .arg(&reference)
            .env("DOCKER_CONFIG", work.path().join("no-docker-config"))
            .output()
            .unwrap();
        assert!(out.status.success(), "cosign {kind}: {}", text(&out));
    }
    let out = xtask(
        &b.home,
        &b.stack,
        &[
            "verify",
            "attestations",
            "--image",
            &format!("http://{reference}"),
            "--key",
            public.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("ok   {SPDX} present: 1 attached")),
        "{}",
        text(&out)
    );
}
