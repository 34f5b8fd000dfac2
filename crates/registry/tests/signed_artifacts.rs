//! Signed artifacts against a real registry (testkit's docker-registry with TLS and
//! htpasswd auth): a file pushed as an OCI artifact and signed with an ed25519 key made by
//! openssl; the signature fetched back verifies under that key only; an unsigned artifact
//! and one signed by another key are refused. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it.

mod common;

use std::path::Path;

use common::options_for;
use commstack_registry::artifact::{Artifact, write_artifact_layout};
use commstack_registry::sign::read_signing_key;
use commstack_registry::{push_layout, push_signed, verify_signed};
use commstack_testkit::registry::ed25519_key;
use commstack_testkit::{TestRegistry, skip_registry_tests};

/// An artifact of one file (`content`) in `root/<name>`, tagged `name`.
fn artifact(root: &Path, name: &str, content: &str) -> std::path::PathBuf {
    let file = root.join(format!("{name}.bin"));
    std::fs::write(&file, content).unwrap();
    let dir = root.join(name);
    write_artifact_layout(
        &Artifact {
            artifact_type: "application/vnd.dev.commstack.test.v1".into(),
            config_media_type: "application/vnd.dev.commstack.test.config.v1+json".into(),
            config: format!(r#"{{"name":"{name}"}}"#).into_bytes(),
            layers: vec![("application/octet-stream".into(), file)],
            annotations: [("dev.commstack.test".to_string(), name.to_string())].into(),
            subject: None,
        },
        &dir,
    )
    .unwrap();
    dir
}

#[test]
fn signed_artifacts_verify_under_the_trusted_key_only() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let ours = read_signing_key(&ed25519_key(work.path(), "ours")).unwrap();
    let theirs = read_signing_key(&ed25519_key(work.path(), "theirs")).unwrap();
    let mut options = options_for(&registry.host(), &registry, "commstack/cache");

    options.tag = Some("signed".into());
    let signed = push_signed(&artifact(work.path(), "a", "output a"), &ours, &options).unwrap();
    let digest = &signed.pushed.manifest_digest;
    assert!(signed.signature.ends_with(&format!(
        ":sha256-{}.sig",
        digest.strip_prefix("sha256:").unwrap()
    )));
    let signer = verify_signed(&options, digest, &[ours.verifying_key()]).unwrap();
    assert_eq!(signer, ours.verifying_key());
    let err = verify_signed(&options, digest, &[theirs.verifying_key()]).unwrap_err();
    assert!(format!("{err:#}").contains("not a trusted key"), "{err:#}");

    // Unsigned: refused, saying so.
    options.tag = Some("unsigned".into());
    let unsigned = push_layout(&artifact(work.path(), "b", "output b"), &options).unwrap();
    let err =
        verify_signed(&options, &unsigned.manifest_digest, &[ours.verifying_key()]).unwrap_err();
    assert!(format!("{err:#}").contains("is not signed"), "{err:#}");

    // Signed by another key than the one trusted.
    options.tag = Some("other".into());
    let other = push_signed(&artifact(work.path(), "c", "output c"), &theirs, &options).unwrap();
    let err = verify_signed(
        &options,
        &other.pushed.manifest_digest,
        &[ours.verifying_key()],
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("not a trusted key"), "{err:#}");
}
