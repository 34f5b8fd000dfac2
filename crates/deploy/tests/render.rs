//! `deploy render` as the CLI runs it (`commstack_deploy::run`): files written, a tag
//! refused, a failing environment refused with its place in stack.toml and nothing
//! written, the locked NVSHMEM source found in a real download cache.

use std::path::{Path, PathBuf};

use commstack_deploy::{ImageSource, RenderRequest, Target, check, render, run};
use commstack_stack::{Lock, Stack};

mod common;
use common as golden;

const DIGEST: &str = "390fb29b8501aa6f0e8ef8d0c2b9d0f6a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1";

/// The two-node fixture as stack.toml, with `extra_env` first in its [deploy.env].
fn stack_file(dir: &Path, extra_env: &str) -> PathBuf {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-node.toml"),
    )
    .unwrap();
    let path = dir.join("stack.toml");
    std::fs::write(
        &path,
        text.replace("[deploy.env]\n", &format!("[deploy.env]\n{extra_env}")),
    )
    .unwrap();
    golden::fresh_lock(&path);
    path
}

fn request(
    dir: &Path,
    stack: PathBuf,
    image: ImageSource,
    nvshmem: Option<PathBuf>,
) -> RenderRequest {
    RenderRequest {
        lock_path: stack.with_extension("lock"),
        stack_path: stack,
        cache_dir: dir.join("home/cache"),
        target: Target::K8s,
        image,
        out: None,
        nvshmem_source: nvshmem,
        stack_flag: String::new(),
    }
}

#[test]
fn writes_the_files_beside_the_stack_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = golden::nvshmem_source(dir.path());
    let stack = stack_file(dir.path(), "");
    let pushed = dir.path().join("pushed.txt");
    std::fs::write(
        &pushed,
        format!("tags: lock-x\nregistry.example.com:5000/commstack/debian-12@sha256:{DIGEST}\n"),
    )
    .unwrap();
    let report = run(&request(
        dir.path(),
        stack,
        ImageSource::PushOutput(pushed),
        Some(src),
    ))
    .unwrap();
    assert_eq!(report.out_dir, dir.path().join("deploy/k8s"));
    let names: Vec<String> = report
        .written
        .iter()
        .map(|p| {
            p.strip_prefix(&report.out_dir)
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "gate/jobset.yaml",
            "gate/kustomization.yaml",
            "serve/leaderworkerset.yaml",
            "serve/kustomization.yaml",
            "rollout.sh"
        ]
    );
    let golden = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden/two-node/k8s/serve/leaderworkerset.yaml"),
    )
    .unwrap();
    let written =
        std::fs::read_to_string(report.out_dir.join("serve/leaderworkerset.yaml")).unwrap();
    // The same render as the golden one but for the header's file name.
    assert_eq!(
        written.replace("from stack.toml", "from two-node.toml"),
        golden
    );
    let mode = std::fs::metadata(report.out_dir.join("rollout.sh")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o755
    );
}

#[test]
fn a_tag_is_refused_naming_push_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = golden::nvshmem_source(dir.path());
    let stack = stack_file(dir.path(), "");
    let err = run(&request(
        dir.path(),
        stack,
        ImageSource::Reference("registry.example.com:5000/commstack/debian-12:latest".into()),
        Some(src),
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("has no digest") && err.contains("`cargo xtask push --registry HOST/REPO`"),
        "{err}"
    );
    assert!(!dir.path().join("deploy").exists());
}

/// A misspelled NVSHMEM variable in [deploy.env] refuses the render at its line, with the
/// nearest known name; nothing is written.
#[test]
fn a_failing_environment_is_refused_at_its_line_in_stack_toml() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = golden::nvshmem_source(dir.path());
    let stack = stack_file(
        dir.path(),
        "NVSHMEM_DISABLED_GDRCOPY = \"true\"\nNVSHMEM_IBGDA_SUPPORT = 1\n",
    );
    assert!(
        std::fs::read_to_string(&stack)
            .unwrap()
            .contains("[deploy.env]\nNVSHMEM_DISABLED_GDRCOPY")
    );
    let err = run(&request(
        dir.path(),
        stack.clone(),
        ImageSource::Reference(format!("registry.example.com/x@sha256:{DIGEST}")),
        Some(src),
    ))
    .unwrap_err()
    .to_string();
    let text = std::fs::read_to_string(&stack).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("NVSHMEM_DISABLED_GDRCOPY"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!(
            "stack.toml:{line}:1: unknown: NVSHMEM_DISABLED_GDRCOPY"
        )),
        "{err}"
    );
    assert!(
        err.contains("did you mean NVSHMEM_DISABLE_GDRCOPY?"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "stack.toml:{}:1: build-time: NVSHMEM_IBGDA_SUPPORT",
            line + 1
        )),
        "{err}"
    );
    assert!(err.contains("2 problem(s), nothing was written"), "{err}");
    assert!(!dir.path().join("deploy").exists());
}

/// The stack's own render passes envlint (every target, both fixtures), and privileges
/// for IBGDA are refused for a stack built without it.
#[test]
fn the_stacks_own_environment_passes_and_ibgda_access_needs_ibgda() {
    let image = golden::image();
    let tables = golden::tables();
    for name in ["one-node.toml", "two-node.toml"] {
        let stack = golden::fixture(name);
        for target in [Target::K8s, Target::Slurm] {
            let env = golden::image_env(&stack);
            let r = render(target, &stack, &image, &env, &tables).unwrap();
            let shape = commstack_deploy::Shape {
                stack: &stack,
                deploy: stack.deploy.as_ref().unwrap(),
                image: &image,
                image_env: &env,
            };
            assert_eq!(
                check::findings(&shape, &tables, &r).unwrap(),
                [],
                "{name} {target:?}"
            );
        }
    }
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-node.toml"),
    )
    .unwrap()
    .replace("ibgda = true", "ibgda = false")
    .replace(
        "NVSHMEM_IB_ENABLE_IBGDA = 1\nNVSHMEM_IBGDA_NUM_RC_PER_PE = 4\n",
        "",
    );
    let stack = Stack::parse(Path::new("stack.toml"), &text).unwrap();
    let err = render(
        Target::K8s,
        &stack,
        &image,
        &golden::image_env(&stack),
        &tables,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("deploy.ibgda-access = \"sys-rawio\" grants privileges for IBGDA"),
        "{err}"
    );
    assert!(err.contains("stack.toml:"), "{err}");
}

/// The shipped lock's NVSHMEM source, as `fetch --accept-tree-match` leaves it in a cache
/// (another archive with the same tree, recorded for the locked sha256), is what render
/// reads; an empty cache names the fetch command.
#[test]
fn the_locked_source_is_found_in_the_download_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (_, archive) = golden::nvshmem_source(dir.path());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock_path = root.join("stack.lock");
    let lock = Lock::parse(&lock_path, &std::fs::read_to_string(&lock_path).unwrap()).unwrap();
    let src = lock.sources.iter().find(|s| s.name == "nvshmem").unwrap();
    let cache_dir = dir.path().join("cache");
    let err = commstack_deploy::locate::locked_nvshmem_archive(&lock, &lock_path, &cache_dir)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is not in the download cache")
            && err.contains("cargo xtask fetch --only sources"),
        "{err}"
    );

    let cache = commstack_fetch::Cache::new(&cache_dir);
    let actual = commstack_digest::sha256_file(&archive).unwrap();
    cache.commit(&archive, &actual, &src.filename).unwrap();
    cache
        .record_tree_match(&commstack_fetch::TreeMatchRecord {
            locked_sha256: src.sha256.clone().unwrap(),
            actual_sha256: actual.clone(),
            filename: src.filename.clone(),
            tree_sha256: src.tree.clone().unwrap(),
        })
        .unwrap();
    let found =
        commstack_deploy::locate::locked_nvshmem_archive(&lock, &lock_path, &cache_dir).unwrap();
    assert_eq!(found, cache.entry_path(&actual, &src.filename));
    let tables = commstack_envlint::source::read(&found).unwrap();
    assert!(tables.env.iter().any(|d| d.name == "NVSHMEM_IB_GID_INDEX"));
}

/// The image's environment comes from the lock, through the function the image step
/// writes its config with: the shipped V2 stack and lock render a Slurm job whose payload
/// sets V2's CUDA_HOME and JIT cache; the shipped V1 pair's has neither. Without its lock
/// the render is refused, naming `cargo xtask lock`.
#[test]
fn the_payloads_environment_is_the_locked_images() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let (src, _) = golden::nvshmem_source(dir.path());
    let job = |stack: &str, lock: &str| {
        let mut req = request(
            dir.path(),
            root.join(stack),
            ImageSource::Reference(format!("registry.example.com/x@sha256:{DIGEST}")),
            Some(src.clone()),
        );
        req.lock_path = root.join(lock);
        req.target = Target::Slurm;
        req.out = Some(dir.path().join(stack));
        let report = run(&req).map_err(|e| format!("{e:#}"))?;
        Ok::<_, String>(std::fs::read_to_string(report.out_dir.join("job.sbatch")).unwrap())
    };
    let v2 = job("stacks/v2.toml", "stacks/v2.lock").unwrap();
    let lock = Lock::parse(
        &root.join("stacks/v2.lock"),
        &std::fs::read_to_string(root.join("stacks/v2.lock")).unwrap(),
    )
    .unwrap();
    for var in commstack_image::locked_image_env(&lock).unwrap() {
        assert!(v2.contains(&format!("\nexport {var}\n")), "{var}:\n{v2}");
    }
    assert!(
        v2.contains("\nexport CUDA_HOME=/opt/commstack/cuda/nvidia/cu13\n"),
        "{v2}"
    );
    assert!(
        v2.contains("\nexport EP_JIT_CACHE_DIR=/var/cache/deep_ep\n"),
        "{v2}"
    );
    let v1 = job("stack.toml", "stack.lock").unwrap();
    assert!(
        v1.contains("\nexport VIRTUAL_ENV=/opt/commstack/venv\n"),
        "{v1}"
    );
    assert!(
        !v1.contains("export CUDA_HOME") && !v1.contains("export EP_JIT_CACHE_DIR"),
        "{v1}"
    );

    let err = job("stacks/v2.toml", "stacks/missing.lock").unwrap_err();
    assert!(
        err.contains("cannot read the lock") && err.contains("cargo xtask lock"),
        "{err}"
    );
}
