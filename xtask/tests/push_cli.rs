//! `cargo xtask push` end to end against a real registry (testkit's docker-registry on
//! 127.0.0.1 with TLS and htpasswd auth): credentials from the environment and from
//! Docker's config file, the CA from the flag and from the environment, the reference on
//! the last line, a signed push whose signature verifies, the image's verify report
//! attached beside it (signed too), and a clear error when no credentials are found.
//! COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it; a missing docker-registry fails it.

use std::path::Path;
use std::process::Output;

use base64::Engine as _;
use commstack_image::{ImageSpec, write_layer, write_oci_layout};
use commstack_registry::sign::{public_key_text, read_signing_key};
use commstack_registry::{Credentials, PushOptions, RegistryAuth, Target, verify_signed};
use commstack_testkit::registry::ed25519_key_pair;
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry, skip_registry_tests};

mod common;

const LOCK: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// xtask with no registry credentials or Docker config but what `env` sets.
fn xtask(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = common::registry_command(home, false);
    command.args(args).envs(env.iter().copied());
    command.output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn push_prints_the_digest_reference_and_reads_credentials_and_ca_from_where_users_keep_them() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("opt")).unwrap();
    std::fs::write(tree.join("opt/file"), "commstack\n").unwrap();
    let layer = write_layer(&tree, &work.path().join("layer.tar"), 1_764_547_200).unwrap();
    let spec = ImageSpec {
        tag: "commstack-push-cli:test".into(),
        epoch: 1_764_547_200,
        labels: [("dev.commstack.lock.sha256".to_string(), LOCK.to_string())].into(),
        ..ImageSpec::default()
    };
    let layout = work.path().join("oci");
    let oci = write_oci_layout(&spec, &[layer], &layout).unwrap();
    let home = work.path().join("home");
    let target = format!("{}/ci/image", registry.host());
    let ca = registry.ca();
    let (layout, ca) = (layout.to_str().unwrap(), ca.to_str().unwrap());

    // Credentials from the environment, the CA from --ca-file.
    let out = xtask(
        &home,
        &[
            ("COMMSTACK_REGISTRY_USER", REGISTRY_USER),
            ("COMMSTACK_REGISTRY_PASSWORD", REGISTRY_PASSWORD),
        ],
        &[
            "push",
            "--registry",
            &target,
            "--oci",
            layout,
            "--ca-file",
            ca,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        text.lines().last(),
        Some(format!("{target}@{}", oci.manifest_digest).as_str()),
        "{text}"
    );
    assert!(text.contains(&format!("tags: lock-{LOCK}, test")), "{text}");
    assert!(text.contains("blobs: 2 uploaded"), "{text}");
    // This home never verified the image: pushed without a report, and said.
    let said = stderr(&out);
    assert!(
        said.contains("no verify report attached: no verify report of image")
            && said.contains("cargo xtask build"),
        "{said}"
    );

    // Credentials from Docker's config file (what `docker login` writes), the CA from
    // the environment; everything is there already.
    let docker_config = work.path().join("docker");
    std::fs::create_dir_all(&docker_config).unwrap();
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
    std::fs::write(
        docker_config.join("config.json"),
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{auth}"}}}}}}"#,
            registry.host()
        ),
    )
    .unwrap();
    let out = xtask(
        &home,
        &[
            ("DOCKER_CONFIG", docker_config.to_str().unwrap()),
            ("COMMSTACK_REGISTRY_CA", ca),
        ],
        &[
            "push",
            "--registry",
            &target,
            "--oci",
            layout,
            "--json",
            "--tag",
            "nightly",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(pushed["manifest_digest"], oci.manifest_digest.as_str());
    assert_eq!(pushed["uploaded"], serde_json::json!([]));
    assert_eq!(
        pushed["tags"],
        serde_json::json!([format!("lock-{LOCK}"), "nightly"])
    );

    // The report `build`'s verify step writes for this image, in this home: it goes
    // with the signed push below.
    let report_dir = home.join("reports").join(format!(
        "image-{}",
        &oci.config_digest.trim_start_matches("sha256:")[..12]
    ));
    std::fs::create_dir_all(&report_dir).unwrap();
    let report = br#"{"levels":[{"level":"static","status":"passed"}]}"#;
    std::fs::write(report_dir.join("verify-static.json"), report).unwrap();
    std::fs::write(
        report_dir.join("import-torch.txt"),
        "{\"torch\": \"2.11.0\"}\n",
    )
    .unwrap();

    // Signed: the signature beside it verifies under the key's public half.
    let (key, cosign_pub) = ed25519_key_pair(work.path(), "key");
    let out = xtask(
        &home,
        &[
            ("COMMSTACK_REGISTRY_USER", REGISTRY_USER),
            ("COMMSTACK_REGISTRY_PASSWORD", REGISTRY_PASSWORD),
        ],
        &[
            "push",
            "--registry",
            &target,
            "--oci",
            layout,
            "--ca-file",
            ca,
            "--key",
            key.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let signing = read_signing_key(&key).unwrap();
    assert!(
        text.contains(&format!(
            "signed by {}",
            public_key_text(&signing.verifying_key())
        )),
        "{text}"
    );
    let mut options = PushOptions::new(Target::parse(&target).unwrap());
    options.ca_file = Some(registry.ca());
    options.credentials = Some(Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
        source: "the test".into(),
    });
    verify_signed(&options, &oci.manifest_digest, &[signing.verifying_key()]).unwrap();
    // The real cosign verifies the image's signature with the key's PEM public half.
    let (verified, said) = commstack_testkit::cosign::cosign_verify(
        &registry,
        &cosign_pub,
        &format!("{target}@{}", oci.manifest_digest),
    );
    assert!(verified, "cosign verify of the pushed image: {said}");

    // The verify report beside it: its subject is the image's manifest, its layers the
    // report's bytes, its config names the image and the builder; signed by the same key.
    let hex = oci.manifest_digest.trim_start_matches("sha256:");
    let report_tag = format!("sha256-{hex}.verify");
    assert!(
        text.contains(&format!(
            "verify report attached: {target}:{report_tag} (signed: "
        )),
        "{text}"
    );
    let found = commstack_registry::pull::find_tag(&options, &report_tag)
        .unwrap()
        .expect("the report is in the registry under its tag");
    let manifest: serde_json::Value = serde_json::from_slice(&found.manifest).unwrap();
    assert_eq!(
        manifest["artifactType"],
        "application/vnd.dev.commstack.verify-report.v1"
    );
    assert_eq!(manifest["subject"]["digest"], oci.manifest_digest.as_str());
    assert_eq!(
        manifest["layers"][0]["digest"],
        format!("sha256:{}", commstack_digest::sha256_hex(report)).as_str()
    );
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 2);
    let config = commstack_registry::pull::pull_document(
        &options,
        manifest["config"]["digest"].as_str().unwrap(),
        manifest["config"]["size"].as_u64().unwrap(),
        commstack_registry::Document::Config,
    )
    .unwrap();
    let config: serde_json::Value = serde_json::from_slice(&config).unwrap();
    assert_eq!(config["image"], oci.config_digest.as_str());
    assert_eq!(
        config["files"],
        serde_json::json!(["verify-static.json", "import-torch.txt"])
    );
    assert_eq!(config["builder"]["commstack"], env!("CARGO_PKG_VERSION"));
    verify_signed(&options, &found.digest, &[signing.verifying_key()]).unwrap();
    let (verified, said) = commstack_testkit::cosign::cosign_verify(
        &registry,
        &cosign_pub,
        &format!("{target}@{}", found.digest),
    );
    assert!(verified, "cosign verify of the verify report: {said}");

    // No credentials anywhere: refused, saying where credentials come from.
    let out = xtask(
        &home,
        &[],
        &[
            "push",
            "--registry",
            &target,
            "--oci",
            layout,
            "--ca-file",
            ca,
        ],
    );
    assert!(!out.status.success());
    let text = stderr(&out);
    for needed in [registry.host().as_str(), "ci/image", "401", "docker login"] {
        assert!(text.contains(needed), "{needed:?} not in: {text}");
    }
}

/// Without --oci, push runs the graph until the image with build's flags: the fetch flags
/// (`--mirror`, `--accept-tree-match`, `--offline`), the build settings and the binary
/// cache's (`--substitute`) parse and reach the graph. No registry is needed: `--dry-run`
/// plans and pushes nothing, and the refusals come before anything is pushed.
#[test]
fn push_without_a_layout_takes_builds_graph_and_fetch_flags() {
    let work = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = work.path().join("stack");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["stack.toml", "stack.lock", "requirements.lock"] {
        std::fs::copy(root.join(file), dir.join(file)).unwrap();
    }
    let stack = dir.join("stack.toml");
    let home = work.path().join("home");
    let mirror = work.path().join("mirror");
    std::fs::create_dir_all(&mirror).unwrap();
    let push = |extra: &[&str]| {
        let mut args = vec![
            "--stack",
            stack.to_str().unwrap(),
            "push",
            "--registry",
            "127.0.0.1:9/ci/image",
        ];
        args.extend_from_slice(extra);
        let out = xtask(&home, &[], &args);
        let text = format!("{}{}", stdout(&out), stderr(&out));
        (out.status.success(), text)
    };

    // The plan until the image, with the fetch flags and a build setting taken.
    let (ok, text) = push(&[
        "--dry-run",
        "--locked",
        "--mirror",
        mirror.to_str().unwrap(),
        "--accept-tree-match",
        "--offline",
        "--jobs",
        "2",
        "--upload-jobs",
        "3",
    ]);
    assert!(ok, "{text}");
    for step in ["fetch", "base", "image"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(step)),
            "no row for {step}: {text}"
        );
    }
    assert!(
        !text.lines().any(|l| l.starts_with("load ")),
        "the plan stops at the image: {text}"
    );

    // --mirror reaches fetch: an empty one is refused there, named.
    let (ok, text) = push(&["--dry-run", "--locked", "--mirror", ""]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("--mirror") && text.contains("empty"),
        "{text}"
    );

    // The binary cache's flags reach the graph: a cache nobody is trusted for is refused
    // before anything runs (the same without --dry-run: nothing is built or pushed).
    for dry in [true, false] {
        let mut args = vec!["--locked", "--substitute", "127.0.0.1:9/cache/steps"];
        if dry {
            args.push("--dry-run");
        }
        let (ok, text) = push(&args);
        assert!(!ok, "{text}");
        assert!(
            text.contains("trusts no key") && text.contains("127.0.0.1:9"),
            "{text}"
        );
    }

    // --dry-run plans the graph: not with a layout given.
    let (ok, text) = push(&["--dry-run", "--oci", "/nonexistent"]);
    assert!(!ok && text.contains("--oci"), "{text}");
}
