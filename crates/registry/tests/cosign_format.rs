//! Signatures in cosign's format, checked by verifiers that are not commstack's: the
//! sigstore crate (sigstore-rs, cosign's verification in Rust) and the real cosign binary
//! (`cosign verify --key cosign.pub`), against the registries the tests run:
//!
//! - docker-registry 2.8 (testkit's, TLS and htpasswd), which has no referrers API: the
//!   signature goes under cosign's tag `sha256-<hex>.sig`;
//! - testkit's referrers registry (go-containerregistry's, the OCI 1.1 referrers API): the
//!   signature is a referrer of the image (`subject`, cosign's artifact type), untagged.
//!
//! On each, an image and a step-like artifact are signed by commstack and verified by
//! sigstore-rs, by cosign and by commstack's own pull; a payload, a signature and a
//! subject tampered with are refused by sigstore-rs, cosign and commstack; an old signature in
//! commstack's own format is refused saying how to sign again.
//! COMMSTACK_SKIP_REGISTRY_TESTS=1 skips them; cosign and the referrers registry come from
//! `bash ci/cosign-tools.sh` (a test fails, saying so, without them).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::options_for;
use commstack_registry::artifact::{Artifact, write_artifact_layout};
use commstack_registry::pull::Puller;
use commstack_registry::referrer::push_referrer;
use commstack_registry::sign::{
    CosignSignature, SIGNATURE_ARTIFACT_TYPE, public_key_pem, read_signing_key,
};
use commstack_registry::signed::signature_layout;
use commstack_registry::{
    FoundThrough, PushOptions, SigningKey, Target, push_signed, verify_signed,
};
use commstack_testkit::cosign::{ReferrersRegistry, cosign};
use commstack_testkit::registry::ed25519_key_pair;
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry, skip_registry_tests};
use sigstore::cosign::verification_constraint::{PublicKeyVerifier, VerificationConstraintVec};
use sigstore::cosign::{ClientBuilder, CosignCapabilities, SignatureLayer, verify_constraints};
use sigstore::registry::{Auth, Certificate, CertificateEncoding, ClientConfig, ClientProtocol};

/// An OCI artifact of one file: an image-like one (an OCI image config, a layer tar)
/// or a step output's (commstack's step artifact type).
fn artifact(root: &Path, name: &str, step: bool) -> PathBuf {
    let file = root.join(format!("{name}.tar"));
    std::fs::write(
        &file,
        format!("the output {name} {:?}", std::time::SystemTime::now()),
    )
    .unwrap();
    let dir = root.join(name);
    let (artifact_type, config_media_type) = match step {
        true => (
            "application/vnd.dev.commstack.step.v1",
            "application/vnd.dev.commstack.step.config.v1+json",
        ),
        false => (
            "application/vnd.oci.image.config.v1+json",
            "application/vnd.oci.image.config.v1+json",
        ),
    };
    write_artifact_layout(
        &Artifact {
            artifact_type: artifact_type.into(),
            config_media_type: config_media_type.into(),
            config: format!(r#"{{"name":"{name}"}}"#).into_bytes(),
            layers: vec![("application/vnd.oci.image.layer.v1.tar".into(), file)],
            annotations: Default::default(),
            subject: None,
        },
        &dir,
    )
    .unwrap();
    dir
}

/// The signing key (openssl) and its public key as cosign reads it (`openssl pkey
/// -pubout`, the command docs/registry.md gives).
fn keys(dir: &Path, name: &str) -> (SigningKey, PathBuf) {
    let (pem, public) = ed25519_key_pair(dir, name);
    let key = read_signing_key(&pem).unwrap();
    // commstack writes the same PEM as openssl: `cargo xtask` can print it.
    assert_eq!(
        std::fs::read_to_string(&public).unwrap(),
        public_key_pem(&key.verifying_key())
    );
    (key, public)
}

/// Where the tests push: its registry options, and how sigstore-rs and cosign reach it.
struct Site {
    options: PushOptions,
    /// The CA and credentials of docker-registry; None for the plain-HTTP referrers one.
    tls: Option<(PathBuf, String, String)>,
}

impl Site {
    fn reference(&self, digest: &str) -> String {
        format!("{}@{digest}", self.options.target.name())
    }

    /// sigstore-rs's verification of the signatures of `digest` under `public`: its
    /// client finds them (the tag scheme; through referrers it reads only sigstore
    /// bundles, so there the layers of the signature referrer, read with oci-client, are
    /// given to its constraint check as its client would give a tag's), then its public
    /// key constraint. Ok when one layer verifies.
    fn sigstore_verify(&self, digest: &str, public: &Path) -> Result<(), String> {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let mut config = ClientConfig::default();
            let auth = match &self.tls {
                Some((ca, user, password)) => {
                    config.extra_root_certificates = vec![Certificate {
                        encoding: CertificateEncoding::Pem,
                        data: std::fs::read(ca).unwrap(),
                    }];
                    Auth::Basic(user.clone(), password.clone())
                }
                None => {
                    config.protocol = ClientProtocol::Http;
                    Auth::Anonymous
                }
            };
            let mut client = ClientBuilder::default()
                .with_oci_client_config(config)
                .build()
                .map_err(|e| e.to_string())?;
            let image = self.reference(digest).parse().map_err(|e| format!("{e}"))?;
            let mut layers = client
                .trusted_signature_layers(&auth, &image)
                .await
                .map_err(|e| format!("sigstore: {e}"))?;
            if self.tls.is_none() {
                layers.extend(referrer_layers(&self.options.target, digest).await?);
            }
            let pem = std::fs::read(public).unwrap();
            let constraints: VerificationConstraintVec = vec![Box::new(
                PublicKeyVerifier::try_from(&pem).map_err(|e| e.to_string())?,
            )];
            verify_constraints(&layers, constraints.iter())
                .map_err(|e| format!("sigstore refused it: {e:?}"))
        })
    }

    /// `cosign verify --key PUBLIC --insecure-ignore-tlog=true HOST/REPO@DIGEST` (and
    /// `--experimental-oci11` for a signature stored as a referrer): its status and output.
    fn cosign_verify(&self, digest: &str, public: &Path, oci11: bool) -> (bool, String) {
        let mut command = Command::new(cosign());
        command
            .args(["verify", "--key"])
            .arg(public)
            .arg("--insecure-ignore-tlog=true");
        match &self.tls {
            Some((ca, user, password)) => {
                command.arg("--registry-cacert").arg(ca).args([
                    "--registry-username",
                    user,
                    "--registry-password",
                    password,
                ]);
            }
            None => {
                command.arg("--allow-http-registry");
            }
        }
        if oci11 {
            command.arg("--experimental-oci11");
        }
        let out = command
            .arg(self.reference(digest))
            // No TUF fetch from the network: keys given, the log ignored.
            .env("HOME", std::env::temp_dir())
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

/// The simple-signing layers of the signature referrers of `digest`, as sigstore's
/// `SignatureLayer`s (read with oci-client: sigstore-rs's referrers path takes only
/// sigstore bundles). Its payload's digest checked as its client checks a tag's.
async fn referrer_layers(target: &Target, digest: &str) -> Result<Vec<SignatureLayer>, String> {
    let client = oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    });
    let auth = oci_client::secrets::RegistryAuth::Anonymous;
    let subject = oci_client::Reference::with_digest(
        target.registry.clone(),
        target.repository.clone(),
        digest.to_string(),
    );
    let index = client
        .pull_referrers(&subject, Some(SIGNATURE_ARTIFACT_TYPE))
        .await
        .map_err(|e| e.to_string())?;
    let mut layers = Vec::new();
    for entry in index.manifests {
        let reference = oci_client::Reference::with_digest(
            target.registry.clone(),
            target.repository.clone(),
            entry.digest.clone(),
        );
        let (manifest, _) = client
            .pull_image_manifest(&reference, &auth)
            .await
            .map_err(|e| e.to_string())?;
        let data = client
            .pull(
                &reference,
                &auth,
                vec!["application/vnd.dev.cosign.simplesigning.v1+json"],
            )
            .await
            .map_err(|e| e.to_string())?;
        for (descriptor, layer) in manifest.layers.iter().zip(&data.layers) {
            let simple_signing: sigstore::cosign::simple_signing::SimpleSigning =
                serde_json::from_slice(&layer.data).map_err(|e| e.to_string())?;
            if !simple_signing.satisfies_manifest_digest(digest) {
                continue;
            }
            let annotations = descriptor.annotations.clone().unwrap_or_default();
            layers.push(SignatureLayer {
                simple_signing,
                oci_digest: descriptor.digest.clone(),
                certificate_signature: None,
                bundle: None,
                signature: annotations
                    .get("dev.cosignproject.cosign/signature")
                    .cloned(),
                raw_data: layer.data.to_vec(),
            });
        }
    }
    Ok(layers)
}

/// A forged signature of `subject` (its payload and signature as given), pushed where
/// commstack puts signatures on this registry; returns where.
fn push_forged(site: &Site, subject: (&str, u64), forged: &CosignSignature, work: &Path) {
    let dir = tempfile::tempdir_in(work).unwrap();
    let layout = signature_layout(forged, subject, dir.path()).unwrap();
    push_referrer(&layout, subject.0, "sig", &site.options).unwrap();
}

/// Signs an image and a step artifact, and checks what every verifier says of them and
/// of tampered signatures. `through`: where this registry keeps signatures.
fn signatures_verify_and_tampering_is_refused(site: &Site, through: FoundThrough) {
    let work = tempfile::tempdir().unwrap();
    let (key, public) = keys(work.path(), "cosign");
    let (_, other_public) = keys(work.path(), "other");
    let trusted = [key.verifying_key()];
    let oci11 = through == FoundThrough::Referrers;

    let mut signed = Vec::new();
    for (name, step) in [("image", false), ("step", true)] {
        let mut options = site.options.clone();
        options.tag = Some(format!("{name}-1"));
        let dir = artifact(work.path(), name, step);
        let pushed = push_signed(&dir, &key, &options).unwrap();
        let digest = pushed.pushed.manifest_digest.clone();
        assert_eq!(pushed.signature_found_through, through, "{name}");
        let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
        let tagged = Puller::new(&site.options).unwrap().find_tag(&tag).unwrap();
        match through {
            FoundThrough::Tag => assert!(pushed.signature.ends_with(&format!(":{tag}"))),
            // A referrer is not tagged: found through the API alone.
            FoundThrough::Referrers => assert!(tagged.is_none(), "{name}: tagged {tag}"),
        }

        // sigstore-rs, cosign and commstack each verify it under the key.
        site.sigstore_verify(&digest, &public)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let (ok, said) = site.cosign_verify(&digest, &public, oci11);
        assert!(ok, "cosign verify of the {name}: {said}");
        assert!(
            said.contains("The signatures were verified against the specified public key")
                && said.contains(&digest),
            "{said}"
        );
        assert_eq!(
            verify_signed(&site.options, &digest, &trusted).unwrap(),
            key.verifying_key()
        );
        // Under another key: refused by each.
        assert!(site.sigstore_verify(&digest, &other_public).is_err());
        assert!(!site.cosign_verify(&digest, &other_public, oci11).0);
        let err = verify_signed(&site.options, &digest, &[]).unwrap_err();
        assert!(format!("{err:#}").contains("not a trusted key"), "{err:#}");
        signed.push((
            digest,
            commstack_registry::attach::manifest_size(&dir).unwrap(),
        ));
    }

    // Another artifact attached to the image the same way (an attestation: `att`), found
    // again where its readers look.
    let statement = work.path().join("statement.json");
    std::fs::write(&statement, r#"{"_type":"https://in-toto.io/Statement/v1"}"#).unwrap();
    let attestation = work.path().join("attestation-oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: "application/vnd.dev.commstack.test.attestation.v1".into(),
            config_media_type: commstack_registry::artifact::EMPTY_CONFIG_MEDIA_TYPE.into(),
            config: b"{}".to_vec(),
            layers: vec![("application/vnd.in-toto+json".into(), statement)],
            annotations: Default::default(),
            subject: Some((signed[0].0.clone(), signed[0].1)),
        },
        &attestation,
    )
    .unwrap();
    let attached = push_referrer(&attestation, &signed[0].0, "att", &site.options).unwrap();
    assert_eq!(attached.through, through);
    let found = commstack_registry::referrer::find_attached(
        &Puller::new(&site.options).unwrap(),
        &signed[0].0,
        "application/vnd.dev.commstack.test.attestation.v1",
        "att",
        4,
    )
    .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].digest, attached.manifest_digest);
    assert_eq!(found[0].through, through);
    let signed: Vec<String> = signed.into_iter().map(|(digest, _)| digest).collect();

    // Tampering, each on an artifact of its own signed by the trusted key first.
    let genuine = |name: &str| {
        let mut options = site.options.clone();
        options.tag = Some(name.to_string());
        let dir = artifact(work.path(), name, true);
        // Pushed unsigned, then only the forged signature goes up.
        let digest = commstack_registry::push_layout(&dir, &options)
            .unwrap()
            .manifest_digest;
        (
            digest,
            commstack_registry::attach::manifest_size(&dir).unwrap(),
        )
    };
    let good =
        |digest: &str| commstack_registry::sign::sign(&key, &site.options.target.name(), digest);

    // The payload altered (its identity), the signature kept.
    let (digest, size) = genuine("payload");
    let mut forged = good(&digest);
    forged.payload = String::from_utf8(forged.payload)
        .unwrap()
        .replace(
            "\"docker-reference\":\"",
            "\"docker-reference\":\"evil.example.com/",
        )
        .into_bytes();
    push_forged(site, (&digest, size), &forged, work.path());
    assert!(site.sigstore_verify(&digest, &public).is_err(), "payload");
    assert!(!site.cosign_verify(&digest, &public, oci11).0, "payload");
    let err = verify_signed(&site.options, &digest, &trusted).unwrap_err();
    assert!(format!("{err:#}").contains("does not verify"), "{err:#}");

    // The signature altered (one bit), the payload kept.
    let (digest, size) = genuine("signature");
    let mut forged = good(&digest);
    let mut bytes = base64_decode(&forged.signature);
    bytes[10] ^= 1;
    forged.signature = base64_encode(&bytes);
    push_forged(site, (&digest, size), &forged, work.path());
    assert!(site.sigstore_verify(&digest, &public).is_err(), "signature");
    assert!(!site.cosign_verify(&digest, &public, oci11).0, "signature");
    let err = verify_signed(&site.options, &digest, &trusted).unwrap_err();
    assert!(format!("{err:#}").contains("does not verify"), "{err:#}");

    // The subject: the image's genuine signature made the signature of another manifest.
    let (digest, size) = genuine("subject");
    push_forged(site, (&digest, size), &good(&signed[0]), work.path());
    assert!(site.sigstore_verify(&digest, &public).is_err(), "subject");
    assert!(!site.cosign_verify(&digest, &public, oci11).0, "subject");
    let err = verify_signed(&site.options, &digest, &trusted).unwrap_err();
    assert!(
        format!("{err:#}").contains(&format!("is for {}, not for {digest}", signed[0])),
        "{err:#}"
    );

    // Unsigned: refused, saying where it looked.
    let (digest, _) = genuine("unsigned");
    assert!(site.sigstore_verify(&digest, &public).is_err(), "unsigned");
    assert!(!site.cosign_verify(&digest, &public, oci11).0, "unsigned");
    let err = verify_signed(&site.options, &digest, &trusted).unwrap_err();
    assert!(format!("{err:#}").contains("is not signed"), "{err:#}");

    // A signature in commstack's own format from before: refused, saying how to re-sign.
    let (digest, size) = genuine("legacy");
    let doc = work.path().join("legacy.json");
    std::fs::write(
        &doc,
        format!(r#"{{"digest":"{digest}","key":"ed25519:x","signature":"x"}}"#),
    )
    .unwrap();
    let legacy = work.path().join("legacy-oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: "application/vnd.dev.commstack.signature.v1".into(),
            config_media_type: commstack_registry::artifact::EMPTY_CONFIG_MEDIA_TYPE.into(),
            config: b"{}".to_vec(),
            layers: vec![(
                commstack_registry::sign::LEGACY_SIGNATURE_MEDIA_TYPE.into(),
                doc,
            )],
            annotations: Default::default(),
            subject: Some((digest.clone(), size)),
        },
        &legacy,
    )
    .unwrap();
    let mut options = site.options.clone();
    options.tag = Some(format!(
        "sha256-{}.sig",
        digest.trim_start_matches("sha256:")
    ));
    commstack_registry::push_layout(&legacy, &options).unwrap();
    let err = verify_signed(&site.options, &digest, &trusted).unwrap_err();
    assert!(
        format!("{err:#}").contains("commstack's own format")
            && format!("{err:#}")
                .contains("cargo xtask cache push --registry HOST/REPO --key KEY.pem"),
        "{err:#}"
    );
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn on_a_registry_without_referrers_signatures_go_under_the_tag_and_verify_with_sigstore_and_cosign()
{
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let options = options_for(&registry.host(), &registry, "commstack/signed");
    assert!(
        !commstack_registry::referrer::has_referrers_api(
            &options,
            &format!("sha256:{}", "0".repeat(64))
        )
        .unwrap(),
        "docker-registry 2.8 answered the referrers API"
    );
    let site = Site {
        options,
        tls: Some((
            registry.ca(),
            REGISTRY_USER.to_string(),
            REGISTRY_PASSWORD.to_string(),
        )),
    };
    signatures_verify_and_tampering_is_refused(&site, FoundThrough::Tag);
}

#[test]
fn on_a_registry_with_referrers_signatures_are_referrers_and_verify_with_sigstore_and_cosign() {
    if skip_registry_tests() {
        return;
    }
    let registry = ReferrersRegistry::start();
    let mut options = PushOptions::new(
        Target::parse(&format!("http://{}/commstack/signed", registry.host())).unwrap(),
    );
    options.progress = false;
    let site = Site { options, tls: None };
    signatures_verify_and_tampering_is_refused(&site, FoundThrough::Referrers);

    // A signature cosign put under the tag on this registry (its default mode) is found
    // too: the tag is where a puller looks when no referrer signs the manifest.
    let work = tempfile::tempdir().unwrap();
    let (key, _) = keys(work.path(), "tagged");
    let mut options = site.options.clone();
    options.tag = Some("by-tag".into());
    let dir = artifact(work.path(), "by-tag", true);
    let digest = commstack_registry::push_layout(&dir, &options)
        .unwrap()
        .manifest_digest;
    let sig = commstack_registry::sign::sign(&key, &options.target.name(), &digest);
    // As cosign's default mode writes it: no subject, so no referrer of the image.
    let payload = work.path().join("payload.json");
    std::fs::write(&payload, &sig.payload).unwrap();
    let layout = work.path().join("by-tag-sig");
    commstack_registry::artifact::write_artifact_layout_annotated(
        &Artifact {
            artifact_type: SIGNATURE_ARTIFACT_TYPE.into(),
            config_media_type: commstack_registry::artifact::EMPTY_CONFIG_MEDIA_TYPE.into(),
            config: b"{}".to_vec(),
            layers: vec![(
                "application/vnd.dev.cosign.simplesigning.v1+json".into(),
                payload,
            )],
            annotations: Default::default(),
            subject: None,
        },
        &[[(
            "dev.cosignproject.cosign/signature".to_string(),
            sig.signature.clone(),
        )]
        .into()],
        &layout,
    )
    .unwrap();
    options.tag = Some(format!(
        "sha256-{}.sig",
        digest.trim_start_matches("sha256:")
    ));
    commstack_registry::push_layout(&layout, &options).unwrap();
    let found = commstack_registry::fetch_signatures(&site.options, &digest).unwrap();
    assert!(found.place().ends_with(".sig"), "{found:?}");
    verify_signed(&site.options, &digest, &[key.verifying_key()]).unwrap();

    // Asked to (`--signature-tag`), a referrer is tagged too: cosign's default mode and
    // verifiers that read only the tag scheme find it; commstack finds the referrer.
    let (key, public) = keys(work.path(), "both");
    let mut options = site.options.clone();
    options.tag_referrers = true;
    options.tag = Some("both".into());
    let pushed = push_signed(&artifact(work.path(), "both", false), &key, &options).unwrap();
    assert_eq!(pushed.signature_found_through, FoundThrough::Referrers);
    let digest = pushed.pushed.manifest_digest;
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    assert!(
        Puller::new(&site.options)
            .unwrap()
            .find_tag(&tag)
            .unwrap()
            .is_some()
    );
    let (ok, said) = site.cosign_verify(&digest, &public, false);
    assert!(ok, "cosign verify without --experimental-oci11: {said}");
    let found = commstack_registry::fetch_signatures(&site.options, &digest).unwrap();
    assert!(found.place().contains('@'), "{found:?}");
    verify_signed(&site.options, &digest, &[key.verifying_key()]).unwrap();
}

/// Whether a registry has the referrers API is read from its answer to the endpoint
/// (testkit's HTTP server answering as registries do): 404 and 405 mean none (the tag
/// scheme), an index means one, its entries filtered here by artifact type whatever the
/// registry did with the filter; a server error is an error, not "no API".
#[test]
fn the_referrers_endpoints_answer_decides_whether_the_api_is_there() {
    use commstack_testkit::{Route, TestServer};
    let server = TestServer::start();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let referrers = |repo: &str| format!("/v2/t/{repo}/referrers/{digest}");
    server.route("/v2/", Route::ok(b"{}".to_vec()));
    server.route(&referrers("none"), Route::status(404));
    server.route(&referrers("refused"), Route::status(405));
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 10,
             "digest": format!("sha256:{}", "cd".repeat(32)), "artifactType": SIGNATURE_ARTIFACT_TYPE},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "size": 10,
             "digest": format!("sha256:{}", "ef".repeat(32)), "artifactType": "application/vnd.example"},
        ],
    });
    server.route(
        &referrers("api"),
        Route::ok(serde_json::to_vec(&index).unwrap())
            .header("Content-Type", "application/vnd.oci.image.index.v1+json"),
    );
    server.route(&referrers("broken"), Route::status(500));
    let puller = |repo: &str| {
        let target = Target::parse(&format!("http://{}/t/{repo}", server.addr())).unwrap();
        let mut options = PushOptions::new(target);
        options.progress = false;
        options.credentials = Some(commstack_registry::Credentials {
            auth: commstack_registry::RegistryAuth::Anonymous,
            source: "the test".into(),
        });
        options.retry.attempts = 1;
        Puller::new(&options).unwrap()
    };
    assert_eq!(puller("none").referrers(&digest, None).unwrap(), None);
    assert_eq!(puller("refused").referrers(&digest, None).unwrap(), None);
    let listed = puller("api")
        .referrers(&digest, Some(SIGNATURE_ARTIFACT_TYPE))
        .unwrap()
        .expect("the API is there");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].digest, format!("sha256:{}", "cd".repeat(32)));
    assert_eq!(
        puller("api")
            .referrers(&digest, None)
            .unwrap()
            .map(|l| l.len()),
        Some(2)
    );
    let err = puller("broken").referrers(&digest, None).unwrap_err();
    assert!(format!("{err:#}").contains("500"), "{err:#}");
}
