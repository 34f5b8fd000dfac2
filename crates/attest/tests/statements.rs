//! The statements made from a built image's record (the repository's real stack.lock, an
//! image step as the image crate leaves it, the run's summary.json), signed and checked
//! against the lock: what passes, and each failure named.

mod support;

use commstack_attest::check::{Check, Expected, Fetched, check_all};
use commstack_attest::make::BUILD_TYPE;
use commstack_attest::statement::Provenance;
use commstack_attest::{
    BuildRecord, SLSA_PREDICATE, SPDX_PREDICATE, Statement, envelope_bytes, provenance_statement,
    sbom_statement,
};
use ed25519_dalek::SigningKey;

const NAME: &str = "127.0.0.1:5000/commstack/debian-12";

fn record(b: &support::Built) -> BuildRecord {
    BuildRecord::read(
        &b.stack,
        &b.lock_path,
        b.image.clone(),
        &b.summary,
        &b.home.join("store"),
    )
    .unwrap()
}

fn fetched(statement: &Statement, key: &SigningKey) -> Fetched {
    Fetched {
        predicate_type: statement.predicate_type.clone(),
        layer: "sha256:test".into(),
        envelope: envelope_bytes(statement, key),
    }
}

fn failed(checks: &[Check]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| format!("{} {}: {}", c.attestation, c.check, c.detail))
        .collect()
}

#[test]
fn the_provenance_names_the_lock_its_inputs_the_steps_and_the_run() {
    let work = tempfile::tempdir().unwrap();
    let b = support::built(work.path());
    let r = record(&b);
    let s = provenance_statement(&r, NAME, &b.manifest_digest).unwrap();
    assert_eq!(s.type_, "https://in-toto.io/Statement/v1");
    assert_eq!(s.predicate_type, SLSA_PREDICATE);
    assert_eq!(s.subject[0].name, NAME);
    assert_eq!(
        s.subject[0].digest["sha256"],
        b.manifest_digest.trim_start_matches("sha256:")
    );
    let p: Provenance = serde_json::from_value(s.predicate.clone()).unwrap();
    let d = &p.build_definition;
    assert_eq!(d.build_type, BUILD_TYPE);
    assert_eq!(d.external_parameters["lock"]["sha256"], b.lock_sha256);
    assert_eq!(d.external_parameters["lock"]["file"], "stack.lock");
    assert_eq!(d.external_parameters["stack"]["file"], "stack.toml");
    // Every locked input, by URL and digest: the NVSHMEM tarball by sha256, DeepEP's git
    // archive by its commit's tree hash.
    assert_eq!(d.resolved_dependencies.len(), b.lock.artifacts().len());
    let nvshmem = d
        .resolved_dependencies
        .iter()
        .find(|x| x.name.as_deref() == Some("nvshmem_src_cuda12-all-all-3.4.5.tar.gz"))
        .unwrap();
    assert_eq!(
        nvshmem.digest["sha256"],
        "40c1d4c255dd7395e04df41b181c4afdf2e0724c06b6fabde58bf2f8f532b0e5"
    );
    let deepep = d
        .resolved_dependencies
        .iter()
        .find(|x| x.annotations["package"] == "deepep")
        .unwrap();
    assert!(
        deepep.digest.contains_key("commstackTreeSha256"),
        "{deepep:?}"
    );
    // The steps as the store records them, from the run's summary.
    let steps = d.internal_parameters["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0]["key"], "pipeline-nvshmem-2b2b");
    assert_eq!(steps[0]["outcome"], "built");
    assert_eq!(steps[0]["inputs"]["recipe"], "nvshmem-7");
    assert_eq!(d.internal_parameters["image"]["id"], b.image.id());
    let run = &p.run_details;
    assert_eq!(run.builder.version["commit"], "c0ffee".repeat(6) + "c0ff");
    assert_eq!(run.builder.version["commstack"], env!("CARGO_PKG_VERSION"));
    let meta = run.metadata.as_ref().unwrap();
    assert_eq!(meta.started_on.as_deref(), Some("2026-12-04T20:35:29Z"));
    assert_eq!(meta.finished_on.as_deref(), Some("2026-12-04T21:52:02Z"));
    assert!(
        run.byproducts
            .iter()
            .any(|x| x.name.as_deref() == Some("sbom.spdx.json"))
    );

    // A summary of another build (its image row names another output): the image step's
    // own record only, and no times.
    let text = std::fs::read_to_string(&b.summary).unwrap();
    let other = text.replace(b.image.dir.to_str().unwrap(), "/elsewhere");
    std::fs::write(&b.summary, other).unwrap();
    let p: Provenance = serde_json::from_value(
        provenance_statement(&record(&b), NAME, &b.manifest_digest)
            .unwrap()
            .predicate,
    )
    .unwrap();
    let steps = p.build_definition.internal_parameters["steps"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["outcome"], "in-store");
    assert!(p.run_details.metadata.is_none());
}

#[test]
fn signed_statements_pass_against_their_lock_and_each_failure_is_named() {
    let work = tempfile::tempdir().unwrap();
    let b = support::built(work.path());
    let r = record(&b);
    let key = SigningKey::from_bytes(&[11u8; 32]);
    let sbom = sbom_statement(&r, NAME, &b.manifest_digest).unwrap();
    assert_eq!(sbom.predicate_type, SPDX_PREDICATE);
    assert_eq!(sbom.predicate["spdxVersion"], "SPDX-2.3");
    let prov = provenance_statement(&r, NAME, &b.manifest_digest).unwrap();
    let trusted = [key.verifying_key()];
    let expected = Expected {
        digest: &b.manifest_digest,
        lock: &b.lock,
        lock_sha256: &b.lock_sha256,
        trusted: &trusted,
    };
    let good = [fetched(&sbom, &key), fetched(&prov, &key)];
    let checks = check_all(&good, &expected);
    assert!(failed(&checks).is_empty(), "{:#?}", failed(&checks));
    for check in [
        "present",
        "signature",
        "statement",
        "subject",
        "lock",
        "packages",
        "inputs",
        "build-type",
    ] {
        assert!(checks.iter().any(|c| c.check == check), "{check}");
    }

    // Missing one.
    let f = failed(&check_all(&good[..1], &expected));
    assert!(
        f.iter()
            .any(|x| x.contains(SLSA_PREDICATE) && x.contains("present")),
        "{f:?}"
    );

    // Another lock: the same statements checked against another lock's sha256 and
    // packages (one wheel's hash changed).
    let mut other_lock = b.lock.clone();
    other_lock.packages[0].sha256 = "00".repeat(32);
    let other = Expected {
        lock: &other_lock,
        lock_sha256: &"ee".repeat(32),
        ..expected
    };
    let f = failed(&check_all(&good, &other));
    assert!(
        f.iter()
            .any(|x| x.contains("another lock") && x.contains(SLSA_PREDICATE)),
        "{f:?}"
    );
    assert!(
        f.iter().any(|x| x.contains("an SBOM of another lock")),
        "{f:?}"
    );
    assert!(
        f.iter()
            .any(|x| x.contains("packages") && x.contains(&other_lock.packages[0].name)),
        "{f:?}"
    );
    assert!(
        f.iter()
            .any(|x| x.contains("inputs") && x.contains(&other_lock.packages[0].filename)),
        "{f:?}"
    );

    // Another image's digest.
    let elsewhere = format!("sha256:{}", "cd".repeat(32));
    let f = failed(&check_all(
        &good,
        &Expected {
            digest: &elsewhere,
            ..expected
        },
    ));
    assert_eq!(
        f.iter()
            .filter(|x| x.contains("subject") && x.contains("not this image's manifest"))
            .count(),
        2,
        "{f:?}"
    );

    // An untrusted key; a payload altered after signing; a signature altered.
    let stranger = SigningKey::from_bytes(&[12u8; 32]);
    let f = failed(&check_all(
        &[fetched(&sbom, &stranger), fetched(&prov, &key)],
        &expected,
    ));
    assert!(
        f.iter()
            .any(|x| x.contains("signature") && x.contains("does not verify")),
        "{f:?}"
    );
    let mut envelope: serde_json::Value = serde_json::from_slice(&good[1].envelope).unwrap();
    let mut altered = prov.clone();
    altered.predicate["buildDefinition"]["externalParameters"]["lock"]["sha256"] =
        b.lock_sha256.clone().into();
    altered.subject[0].name = "attacker/repo".into();
    use base64::Engine as _;
    envelope["payload"] = base64::engine::general_purpose::STANDARD
        .encode(altered.to_bytes())
        .into();
    let tampered = Fetched {
        envelope: serde_json::to_vec(&envelope).unwrap(),
        ..fetched(&prov, &key)
    };
    let f = failed(&check_all(&[good[0].clone(), tampered], &expected));
    assert!(
        f.iter()
            .any(|x| x.contains(SLSA_PREDICATE) && x.contains("signature")),
        "{f:?}"
    );
}
