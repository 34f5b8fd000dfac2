//! A real commstack image under a real Slurm. A commstack image takes 20+ minutes to build
//! cold, too long for CI, so this test is opt-in and needs one already in Docker:
//!
//! ```text
//! COMMSTACK_TEST_IMAGE=<docker image id or tag> \
//!   cargo test -p xtask --test slurm_real_image -- --ignored
//! ```
//!
//! Without COMMSTACK_TEST_IMAGE it fails. The image must have been made from a lock of
//! this checkout (its `dev.commstack.lock.sha256` label). It is pushed by `docker push` to
//! a real registry on loopback, the Slurm job rendered for it by digest by `cargo xtask
//! deploy render` (the image's environment from that lock: checked equal to the image's
//! own Config.Env first), and run by slurmctld/slurmd (testkit's cluster, the one
//! crates/deploy/tests/slurm_job.rs runs its fixture image on): the script's bundle step
//! (skopeo + umoci), the image's preflight on a recorded healthy node (mounted read-only
//! by the runtime: the GPU-less machine has no driver to check), then the payload: the
//! image's own verify tool's static level with the expectations the build's static level
//! uses (commstack-steps' `image_expectations`), and `import torch` through verify's import
//! check, both in the environment the job sets again. Needs what the fixture test needs
//! (slurm-wlm, munge, runc, skopeo, umoci, docker-registry, openssl, apache2-utils), Docker,
//! and free disk of about twice the image's size (gzip'd in the registry and the bundle
//! step's layout, then unpacked).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use commstack_testkit::TestRegistry;
use commstack_testkit::slurm::{CertsD, Cluster, NODE_MOUNT};

mod common;
use common::{repo_root, text};

const RUN: &str = "COMMSTACK_TEST_IMAGE=<docker image id or tag> cargo test -p xtask --test slurm_real_image -- --ignored";

fn ok(program: &str, args: &[&str], dir: &Path) -> String {
    commstack_testkit::command::run_ok(program, args, dir, "Docker, skopeo and umoci (see .ci/run)")
}

/// `docker image inspect` of `image`: its config's Env, its labels and tags.
fn docker_inspect(image: &str) -> serde_json::Value {
    let out = ok("docker", &["image", "inspect", image], Path::new("/"));
    let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0].take()
}

/// The lock in this checkout whose sha256 the image's `dev.commstack.lock.sha256` label
/// names, and the stack beside it (`stack.lock`, `stacks/*.lock`).
fn lock_of(inspect: &serde_json::Value) -> (PathBuf, PathBuf) {
    let label = inspect["Config"]["Labels"]["dev.commstack.lock.sha256"]
        .as_str()
        .expect("the image has no dev.commstack.lock.sha256 label: is it a commstack image?");
    let root = repo_root();
    let mut locks = vec![root.join("stack.lock")];
    for entry in std::fs::read_dir(root.join("stacks")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "lock")
            && !path.to_string_lossy().ends_with(".requirements.lock")
        {
            locks.push(path);
        }
    }
    let found = locks
        .iter()
        .find(|l| commstack_digest::sha256_file(l).unwrap() == label)
        .unwrap_or_else(|| {
            panic!(
                "the image was made from a lock with sha256 {label}, which none of {locks:?} is: build the image from this checkout's lock"
            )
        });
    (found.with_extension("toml"), found.clone())
}

/// The registry, the bundle step's layout and the unpacked bundle each hold about the
/// image (compressed twice, then whole): refused up front rather than failing mid-job.
fn assert_disk_for(image: &str, inspect: &serde_json::Value, work: &Path) {
    let size = inspect["Size"].as_u64().unwrap_or(0);
    let free: u64 = ok(
        "df",
        &["--output=avail", "-B1", work.to_str().unwrap()],
        work,
    )
    .lines()
    .last()
    .and_then(|l| l.trim().parse().ok())
    .unwrap_or(0);
    assert!(
        free >= size * 2,
        "{image} is {} GB; {} has {} GB free, and the test needs about twice that (the registry, the bundle's layout, the unpacked bundle): free some disk or set TMPDIR to a larger disk",
        size / 1_000_000_000,
        work.display(),
        free / 1_000_000_000
    );
}

/// The image pushed to `registry` by `docker push` (a tag of the test's own, untagged
/// after when the image has another): `HOST/REPO@sha256:...`.
fn docker_push(
    image: &str,
    inspect: &serde_json::Value,
    registry: &TestRegistry,
    work: &Path,
) -> String {
    // docker treats 127.0.0.0/8 as an insecure registry (TLS unverified); credentials
    // from a Docker config of the test's own.
    let config = work.join("docker-config");
    std::fs::create_dir_all(&config).unwrap();
    registry.write_auths(&config.join("config.json"));
    let repo = format!("{}/commstack/real", registry.host());
    let tag = format!("{repo}:slurm-test");
    ok("docker", &["tag", image, &tag], work);
    let out = Command::new("docker")
        .args(["push", &tag])
        .env("DOCKER_CONFIG", &config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let tagged = inspect["RepoTags"]
        .as_array()
        .is_some_and(|tags| !tags.is_empty());
    if tagged {
        ok("docker", &["rmi", &tag], work);
    }
    assert!(
        out.status.success(),
        "docker push: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `slurm-test: digest: sha256:<hex> size: N`
    let digest = said
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .unwrap_or_else(|| panic!("docker push named no digest: {said}"));
    format!("{repo}@{digest}")
}

/// The job's payload for the stack at `stack_path` (`sh -c PAYLOAD payload
/// IMPORT_CHECK_PY EXPECT...`): verify's static level with the expectations the build's
/// static level uses (resolved as the build resolves them, with a home under `home`),
/// then `import torch` through verify's import check.
fn payload(stack_path: &Path, home: &Path) -> Vec<String> {
    let ctx = commstack_steps::ctx::Ctx::new(commstack_steps::options::GlobalOptions {
        stack: Some(stack_path.to_path_buf()),
        home: Some(home.to_path_buf()),
        quiet: true,
    })
    .unwrap();
    let settings = commstack_steps::settings::Settings::resolve(
        &ctx,
        &commstack_steps::options::BuildOptions::default(),
    )
    .unwrap();
    let (major, minor) = settings.stack.target.python;
    let site =
        commstack_steps::flow::verify_report::image_site_packages(&format!("{major}.{minor}"));
    let expect =
        commstack_steps::flow::verify_report::image_expectations(&settings, &site).unwrap();
    let mut command: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        PAYLOAD.into(),
        "payload".into(),
        commstack_verify::runtime::IMPORT_CHECK_PY.into(),
    ];
    command.extend(commstack_verify::cli::expect_args(&expect));
    command
}

/// The job script for `pushed`, rendered by `cargo xtask deploy render --target slurm`
/// from a copy under `work` of the stack at `stack_path` (and its lock), its `[deploy]`
/// replaced by one node of this machine running `command`, bundles under `work/bundles`.
fn render_job(stack_path: &Path, pushed: &str, command: &[String], work: &Path) -> String {
    let text_of_stack = std::fs::read_to_string(stack_path).unwrap();
    let head = &text_of_stack[..text_of_stack
        .find("\n[deploy]")
        .map_or(text_of_stack.len(), |i| i + 1)];
    let deploy = format!(
        "[deploy]\nname = \"slurm-test\"\nnodes = 1\ngpus-per-node = 1\nnetwork = \"none\"\n\
         command = {}\nshm-size = \"1Gi\"\n\n[deploy.slurm]\ncontainer = \"oci\"\nbundle-dir = \"{}\"\n",
        serde_json::to_string(command).unwrap(),
        work.join("bundles").display()
    );
    let test_stack = work.join(stack_path.file_name().unwrap());
    std::fs::write(&test_stack, format!("{head}{deploy}")).unwrap();
    std::fs::copy(
        stack_path.with_extension("lock"),
        test_stack.with_extension("lock"),
    )
    .unwrap();
    let source = commstack_testkit::nvshmem::source_tree(work);
    let out = common::command(&work.join("home"))
        .arg("--stack")
        .arg(&test_stack)
        .args(["deploy", "render", "--target", "slurm", "--image", pushed])
        .arg("--nvshmem-source")
        .arg(&source)
        .arg("--out")
        .arg(work.join("deploy"))
        .output()
        .unwrap();
    assert!(out.status.success(), "deploy render:\n{}", text(&out));
    std::fs::read_to_string(work.join("deploy/job.sbatch")).unwrap()
}

#[test]
#[ignore = "needs a real commstack image in Docker: COMMSTACK_TEST_IMAGE=<id or tag> cargo test -p xtask --test slurm_real_image -- --ignored"]
fn a_real_image_passes_verify_static_and_imports_torch_under_slurm() {
    let image = std::env::var("COMMSTACK_TEST_IMAGE").unwrap_or_else(|_| {
        panic!(
            "COMMSTACK_TEST_IMAGE is not set: name a real commstack image in Docker (`docker images`), e.g. {RUN}"
        )
    });
    let started = Instant::now();
    let inspect = docker_inspect(&image);
    let (stack_path, lock_path) = lock_of(&inspect);
    let lock =
        commstack_stack::Lock::parse(&lock_path, &std::fs::read_to_string(&lock_path).unwrap())
            .unwrap();
    let env: Vec<String> = inspect["Config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    // What the render sets again is the image's own environment.
    assert_eq!(commstack_image::locked_image_env(&lock).unwrap(), env);

    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    assert_disk_for(&image, &inspect, w);
    let registry = TestRegistry::start();
    let pushed = docker_push(&image, &inspect, &registry, w);
    eprintln!("pushed {image} as {pushed} after {:?}", started.elapsed());

    let script = render_job(
        &stack_path,
        &pushed,
        &payload(&stack_path, &w.join("home")),
        w,
    );
    for var in &env {
        assert!(
            script.contains(&format!("\nexport {var}\n")),
            "{var}:\n{script}"
        );
    }

    // skopeo in the job's bundle step: the registry's CA in certs.d, its credentials
    // through REGISTRY_AUTH_FILE.
    let _ca = CertsD::install(&registry.host(), &registry.ca());
    registry.write_auths(&w.join("auth.json"));
    let node = repo_root().join("crates/doctor/tests/fixtures/hgx-h100-8gpu");
    let cluster = Cluster::start_with_node(&w.join("slurm"), Some(&node.canonicalize().unwrap()));
    let job_env = vec![
        (
            "REGISTRY_AUTH_FILE",
            w.join("auth.json").display().to_string(),
        ),
        ("COMMSTACK_PREFLIGHT_ROOT", format!("{NODE_MOUNT}/root")),
        (
            "COMMSTACK_PREFLIGHT_NVIDIA_SMI_DIR",
            format!("{NODE_MOUNT}/nvidia-smi"),
        ),
    ];
    let (completed, output) = cluster.sbatch(w, &script, &job_env);
    eprintln!("job done after {:?}:\n{output}", started.elapsed());
    assert!(completed, "the job failed:\n{output}\n{}", cluster.logs());
    assert!(output.contains("\"verdict\": \"pass\""), "{output}");
    // The image's environment as the job set it again.
    for name in ["PATH", "CUDA_HOME", "EP_JIT_CACHE_DIR"] {
        if let Some(var) = env.iter().find(|e| e.starts_with(&format!("{name}="))) {
            assert!(
                output.contains(&format!("payload env: {var}\n")),
                "{var}:\n{output}"
            );
        }
    }
    let names = assert_verify_static_passed(&output);
    let import = assert_torch_imported(&output);
    eprintln!(
        "{image}: verify static passed ({} checks: {names:?}), import torch {} (CUDA {}) clean, in {:?}",
        names.len(),
        import["torch"]["version"],
        import["torch"]["cuda"],
        started.elapsed()
    );
}

/// What of the real-image test needs no image, on every run: the payload for this
/// checkout's stack.toml (the build's expectations, as verify's arguments), rendered by
/// `cargo xtask deploy render` into a job that sets the lock's image environment again
/// and runs the payload in Slurm's OCI container from the bundle of the image by digest.
#[test]
fn the_real_image_job_renders_for_this_checkouts_stack() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let stack_path = repo_root().join("stack.toml");
    let lock_path = stack_path.with_extension("lock");
    let lock =
        commstack_stack::Lock::parse(&lock_path, &std::fs::read_to_string(&lock_path).unwrap())
            .unwrap();
    let command = payload(&stack_path, &w.join("home"));
    assert_eq!(command[..4], ["/bin/sh", "-c", PAYLOAD, "payload"]);
    // The build's static level expects the lock's NCCL and NVSHMEM.
    for flag in ["--expect-nccl", "--expect-nvshmem"] {
        assert!(
            command.iter().any(|a| a == flag),
            "no {flag} in {command:?}"
        );
    }
    let digest = format!("sha256:{}", "ab".repeat(32));
    let script = render_job(
        &stack_path,
        &format!("127.0.0.1:5000/commstack/real@{digest}"),
        &command,
        w,
    );
    for var in commstack_image::locked_image_env(&lock).unwrap() {
        assert!(
            script.contains(&format!("\nexport {var}\n")),
            "{var}:\n{script}"
        );
    }
    assert!(script.contains("--container=\"$BUNDLE\""), "{script}");
    assert!(
        script.contains("#SBATCH --output=slurm-test-%j.out"),
        "{script}"
    );
    assert!(script.contains(&digest), "{script}");
    assert!(script.contains("@@verify-static-exit="), "{script}");
}

/// The text of the job's `output` between `from` and the next `to`.
fn between(output: &str, from: &str, to: &str) -> String {
    let start = output
        .find(from)
        .unwrap_or_else(|| panic!("no {from:?}:\n{output}"))
        + from.len();
    let end = start
        + output[start..]
            .find(to)
            .unwrap_or_else(|| panic!("no {to:?}:\n{output}"));
    output[start..end].to_string()
}

/// verify's report in the job's output: every level listed, only static asked for, and
/// it passed, each check (among them the stack's one NCCL, NVSHMEM without NCCL, DeepEP
/// linked to both); verify exited 0. The static checks' names.
fn assert_verify_static_passed(output: &str) -> Vec<String> {
    // The JSON report, whatever else the tool said around it.
    let section = between(output, "@@verify-static@@\n", "@@verify-static-exit=");
    let json = &section[section.find('{').unwrap_or(0)..=section.rfind('}').unwrap_or(0)];
    let verify: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("verify's report: {e}\n{output}"));
    let levels = verify["levels"].as_array().unwrap();
    let level = |name: &str| {
        levels
            .iter()
            .find(|l| l["level"] == name)
            .unwrap_or_else(|| panic!("no level {name}: {verify:#}"))
    };
    assert_eq!(level("static")["status"], "passed", "{verify:#}");
    let checks = level("static")["checks"].as_array().unwrap();
    let names: Vec<String> = checks
        .iter()
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect();
    for c in checks {
        assert_eq!(c["status"], "passed", "{c:#}");
    }
    for name in [
        "static.nccl.one",
        "static.nvshmem-host.no-libnccl",
        "static.deepep.links",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    for other in ["runtime", "selftest"] {
        assert_eq!(level(other)["status"], "not-run", "{verify:#}");
    }
    assert_eq!(
        between(output, "@@verify-static-exit=", "\n"),
        "0",
        "{output}"
    );
    names
}

/// verify's import check of torch in the job's output: imported, no warnings, exit 0. Its
/// line.
fn assert_torch_imported(output: &str) -> serde_json::Value {
    let section = between(output, "@@import-torch@@\n", "@@import-torch-exit=");
    let line = section
        .lines()
        .find(|l| l.starts_with("{\"import\""))
        .unwrap_or_else(|| panic!("no import check line:\n{output}"));
    let import: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(import["import"]["status"], "ok", "{import:#}");
    assert_eq!(
        import["import"]["warnings"],
        serde_json::json!([]),
        "{import:#}"
    );
    assert_eq!(
        between(output, "@@import-torch-exit=", "\n"),
        "0",
        "{output}"
    );
    import
}

/// The payload (`sh -c PAYLOAD payload IMPORT_CHECK_PY EXPECT...`): the image's
/// environment as the job set it, verify's static level (its JSON report between markers,
/// then its exit status), `import torch` through verify's import check (the same), exit 0
/// only when both passed.
const PAYLOAD: &str = r#"check=$1; shift
for name in PATH CUDA_HOME EP_JIT_CACHE_DIR; do
  eval "value=\${$name-}"; [ -z "$value" ] || echo "payload env: $name=$value"
done
echo "@@verify-static@@"
commstack-verify --python "$VIRTUAL_ENV/bin/python" --level static --json --quiet --report /tmp/commstack-verify "$@"
static=$?
echo "@@verify-static-exit=$static"
echo "@@import-torch@@"
python -c "$check" torch
import=$?
echo "@@import-torch-exit=$import"
[ "$static" -eq 0 ] && [ "$import" -eq 0 ]
"#;
