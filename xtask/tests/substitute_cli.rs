//! `cargo xtask build --dry-run --substitute` from the command line, against a real
//! registry (testkit's docker-registry with TLS and htpasswd) that holds nothing yet: a
//! cache nobody is trusted for is refused before any lookup; with stack.toml's `[cache]`
//! (which leaves the lock fresh) the plan looks up each step that would be built and
//! says it is built here; `--no-substitute` looks nothing up. The pull itself is tested in
//! xtask/tests/substitute_registry.rs. COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it.

use std::path::Path;
use std::process::Output;

use commstack_testkit::registry::ed25519_key_pair;
use commstack_testkit::{TestRegistry, skip_registry_tests};

mod common;
use common::text;

fn xtask(home: &Path, args: &[&str]) -> Output {
    common::registry_command(home, true)
        .args(args)
        .output()
        .unwrap()
}

/// The plan's row of `step`.
fn row<'a>(out: &'a str, step: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(step))
        .unwrap_or_else(|| panic!("no row for {step} in:\n{out}"))
}

#[test]
fn dry_run_with_a_binary_cache_names_it_and_refuses_an_untrusted_one() {
    if skip_registry_tests() {
        return;
    }
    let registry = TestRegistry::start();
    let work = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = work.path().join("stack");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["stack.toml", "stack.lock", "requirements.lock"] {
        std::fs::copy(root.join(file), dir.join(file)).unwrap();
    }
    let stack = dir.join("stack.toml");
    let home = work.path().join("home");
    let cache = format!("{}/cache/steps", registry.host());
    let ca = registry.ca();
    let build = |extra: &[&str]| {
        let mut args = vec![
            "--stack",
            stack.to_str().unwrap(),
            "build",
            "--dry-run",
            "--ca-file",
            ca.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        xtask(&home, &args)
    };

    // No [cache] trusted-keys and no --allow-unsigned: refused before anything runs.
    let out = build(&["--substitute", &cache]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("trusts no key") && text(&out).contains("--allow-unsigned"),
        "{}",
        text(&out)
    );

    // --offline opens no connection: a registry given with it is refused, naming both.
    let out = build(&["--substitute", &cache, "--allow-unsigned", "--offline"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("--offline opens no network connection")
            && text(&out).contains(&format!("--substitute {cache}")),
        "{}",
        text(&out)
    );

    // [cache] in stack.toml: the lock stays fresh, and the plan asks the cache.
    let mut toml = std::fs::read_to_string(&stack).unwrap();
    toml.push_str(&format!(
        "\n[cache]\nregistry = \"{cache}\"\ntrusted-keys = [\"ed25519:O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=\"]\n"
    ));
    std::fs::write(&stack, toml).unwrap();
    let out = build(&["--locked"]);
    let plan = text(&out);
    assert!(out.status.success(), "{plan}");
    eprintln!("{plan}");
    for step in [
        "nvshmem",
        "dropin",
        "kernels",
        "deepep",
        "wheelhouse",
        "base",
        "image",
    ] {
        assert!(
            row(&plan, step).contains(&format!("not in the binary cache {cache}: built here")),
            "{step}:\n{plan}"
        );
    }
    // The toolchain is needed by the steps built here; verify and runtime (reports of
    // this run) are never looked up.
    assert!(row(&plan, "toolchain").contains("runs:"), "{plan}");
    for step in ["verify", "runtime"] {
        assert!(!row(&plan, step).contains("binary cache"), "{plan}");
    }

    // --no-substitute: nothing is looked up.
    let out = build(&["--locked", "--no-substitute"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("binary cache"), "{}", text(&out));

    // A trusted key given as the PEM file cosign reads, beside stack.toml: missing, the
    // build names it and how to make it; there, the plan asks the cache.
    let toml = std::fs::read_to_string(&stack).unwrap().replace(
        "\"ed25519:O2onvM62pC1io6jQKm8Nc2UyFXcd4kOmOsBIoYtZ2ik=\"",
        "\"keys/cosign.pub\"",
    );
    std::fs::write(&stack, toml).unwrap();
    let out = build(&["--locked"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("keys/cosign.pub")
            && text(&out).contains("openssl pkey -in KEY.pem -pubout"),
        "{}",
        text(&out)
    );
    let keys = stack.parent().unwrap().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    // keys/cosign.pem and keys/cosign.pub, the one stack.toml names.
    ed25519_key_pair(&keys, "cosign");
    let out = build(&["--locked"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        row(&text(&out), "nvshmem").contains(&format!("not in the binary cache {cache}")),
        "{}",
        text(&out)
    );
}
