//! `cargo xtask cache push` against a real registry (testkit's docker-registry with TLS
//! and htpasswd auth), from a store holding graph steps as the graph writes them: a
//! single-file output (a wheel), a directory output with a symlink, and a step that ships
//! nothing. Each shipped output arrives as a signed artifact under `<step>-<key>` whose
//! signature verifies under the key that pushed it; a store output damaged after it was
//! recorded is refused before anything is sent. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use commstack_registry::sign::read_signing_key;
use commstack_registry::{Credentials, PushOptions, RegistryAuth, RetryPolicy, Target};
use commstack_steps::graph::{Shipped, StepResult, StoredResult};
use commstack_store::{StepKey, Store};
use commstack_testkit::registry::{ed25519_key_pair, run_tool};
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry, skip_registry_tests};
use serde_json::json;

mod common;

/// A graph step in `store` whose output `make` writes into a crate's own store step
/// (`<name>-out`, as NVSHMEM's build writes `nvshmem-<hash>`); `ships` names what it ships
/// (relative to that directory), as the graph records it. Returns the graph step's key
/// and the crate step's directory.
fn step(
    store: &Store,
    name: &str,
    ships: Option<&str>,
    make: impl FnOnce(&Path),
) -> (StepKey, std::path::PathBuf) {
    let inputs = json!({ "test": name });
    let crate_key = StepKey::new(&format!("{name}-out"), &inputs);
    let made = store
        .run(&crate_key, &inputs, false, |dir| {
            make(&dir.out);
            Ok(())
        })
        .unwrap();
    let out = made.path().to_path_buf();
    let key = StepKey::new(&format!("pipeline-{name}"), &inputs);
    store
        .run(&key, &inputs, false, |dir| {
            let shipped = ships.map(|rel| Shipped {
                files: commstack_digest::manifest::manifest(&out.join(rel), &|_| false).unwrap(),
                root: out.join(rel),
            });
            let stored = StoredResult {
                result: StepResult {
                    output: ships.map(|rel| out.join(rel)),
                    facts: json!({ "made_by": "the test" }),
                },
                shipped,
            };
            std::fs::write(
                dir.out.join("result.json"),
                serde_json::to_string(&stored).unwrap(),
            )?;
            Ok(())
        })
        .unwrap();
    (key, out)
}

fn xtask(home: &Path, args: &[&str]) -> Output {
    common::registry_command(home, true)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn cache_push_sends_each_shipped_output_signed_and_refuses_a_damaged_one() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let store = Store::open(home.join("store")).unwrap();
    let (dropin, dropin_dir) = step(
        &store,
        "dropin",
        Some("nvshmem-3.4.5-py3-none-any.whl"),
        |out| {
            std::fs::write(out.join("nvshmem-3.4.5-py3-none-any.whl"), "a wheel").unwrap();
        },
    );
    let (nvshmem, _) = step(&store, "nvshmem", Some("nvshmem"), |out| {
        let lib = out.join("nvshmem/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvshmem_host.so.3"), "ELF, nearly").unwrap();
        std::os::unix::fs::symlink("libnvshmem_host.so.3", lib.join("libnvshmem_host.so")).unwrap();
        std::fs::write(out.join("build-report.json"), "{}").unwrap();
    });
    step(&store, "toolchain", None, |out| {
        std::fs::write(out.join("nvcc"), "not shipped").unwrap();
    });
    let (key, cosign_pub) = ed25519_key_pair(work.path(), "key");
    let target = format!("{}/commstack/cache", registry.host());
    let ca = registry.ca();
    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "cache",
            "push",
            "--registry",
            &target,
            "--key",
            key.to_str().unwrap(),
            "--ca-file",
            ca.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let run = |extra: &[&'static str]| {
        let args = args(extra);
        xtask(&home, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };

    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pushed = pushed.as_array().unwrap();
    let steps: Vec<&str> = pushed.iter().map(|p| p["step"].as_str().unwrap()).collect();
    assert_eq!(steps, ["dropin", "nvshmem"], "toolchain ships nothing");

    let mut options = PushOptions::new(Target::parse(&target).unwrap());
    options.ca_file = Some(ca.clone());
    options.progress = false;
    options.credentials = Some(Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
        source: "the test".into(),
    });
    options.retry = RetryPolicy {
        attempts: 1,
        backoff: Duration::ZERO,
        max_backoff: Duration::ZERO,
    };
    let public = read_signing_key(&key).unwrap().verifying_key();
    for (p, key) in pushed.iter().zip([&dropin, &nvshmem]) {
        let digest = p["manifest_digest"].as_str().unwrap();
        commstack_registry::verify_signed(&options, digest, &[public]).unwrap();
        // The real cosign verifies the step artifact's signature with the PEM public key.
        let (verified, said) = commstack_testkit::cosign::cosign_verify(
            &registry,
            &cosign_pub,
            &format!("{target}@{digest}"),
        );
        assert!(verified, "cosign verify of {digest}: {said}");
        // Found by its step key; the manifest is an artifact naming the key.
        let tag = key.dir_name().trim_start_matches("pipeline-").to_string();
        let raw = run_tool(
            work.path(),
            "skopeo",
            &[
                "inspect",
                "--raw",
                "--cert-dir",
                registry.cert_dir().to_str().unwrap(),
                "--creds",
                &format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"),
                &format!("docker://{target}:{tag}"),
            ],
        );
        assert_eq!(
            format!("sha256:{}", commstack_digest::sha256_hex(&raw.stdout)),
            digest
        );
        let manifest: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
        assert_eq!(
            manifest["artifactType"],
            "application/vnd.dev.commstack.step.v1"
        );
        assert_eq!(
            manifest["annotations"]["dev.commstack.step.key"],
            key.dir_name()
        );
    }
    assert_eq!(
        pushed[1]["files"], 2,
        "the library and its link; not the report"
    );

    // To a registry with the referrers API, with --signature-tag: each signature a referrer
    // and under cosign's tag too, so cosign finds it either way.
    let referrers = commstack_testkit::cosign::ReferrersRegistry::start();
    let plain = format!("http://{}/commstack/cache", referrers.host());
    let out = xtask(
        &home,
        &[
            "cache",
            "push",
            "--registry",
            &plain,
            "--key",
            key.to_str().unwrap(),
            "--step",
            "nvshmem",
            "--signature-tag",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        pushed[0]["signature_found_through"], "referrers",
        "{pushed}"
    );
    let digest = pushed[0]["manifest_digest"].as_str().unwrap();
    let name = plain.trim_start_matches("http://");
    for oci11 in [true, false] {
        let (verified, said) = commstack_testkit::cosign::cosign_verify_http(
            &cosign_pub,
            &format!("{name}@{digest}"),
            oci11,
        );
        assert!(
            verified,
            "cosign verify (--experimental-oci11: {oci11}): {said}"
        );
    }

    // A shipped file changed after the step recorded it: refused, nothing sent.
    let wheel = dropin_dir.join("nvshmem-3.4.5-py3-none-any.whl");
    std::fs::write(&wheel, "another wheel").unwrap();
    let before = registry.blob_files();
    let out = run(&["--step", "dropin"]);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(text.contains("not what the step recorded"), "{text}");
    assert!(text.contains("nvshmem-3.4.5-py3-none-any.whl"), "{text}");
    assert_eq!(registry.blob_files(), before, "nothing was sent");
}
