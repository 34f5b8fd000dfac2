//! A built image as the image step leaves it, for the attestation tests: the repository's
//! real stack.toml and stack.lock, an image step directory in a store (image.json,
//! config.json, an SPDX SBOM written by the image crate from the lock's packages,
//! provenance.json, `.step.json`), the run's summary.json naming it, and the same image
//! as an OCI layout (its config is the step's config.json) to push.
// Each test file is its own crate and uses a part of this.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use commstack_image::sbom::{Component, ComponentKind, SbomDocument, spdx_json};
use commstack_image::{Image, ImageSpec, write_layer, write_oci_layout};
use commstack_stack::Lock;

pub const EPOCH: u64 = 1_764_547_200;

pub struct Built {
    pub root: PathBuf,
    pub stack: PathBuf,
    pub lock_path: PathBuf,
    pub lock: Lock,
    pub lock_sha256: String,
    pub home: PathBuf,
    pub image: Image,
    pub summary: PathBuf,
    /// The OCI layout of the image.
    pub layout: PathBuf,
    pub manifest_digest: String,
}

/// The workspace root: the nearest directory above the test's crate with a stack.lock
/// (this file is shared by crates/attest's tests and xtask's).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("stack.lock").is_file())
        .expect("the workspace's stack.lock")
        .to_path_buf()
}

/// The SBOM the image crate writes for an image of `lock`: each .deb and each wheel
/// installed (the replaced ones left out), and one own build.
pub fn sbom(lock: &Lock, lock_sha256: &str) -> String {
    let mut components: Vec<Component> = lock
        .debs
        .iter()
        .map(|d| Component {
            kind: ComponentKind::Deb {
                architecture: d.architecture.clone(),
            },
            name: d.name.clone(),
            version: d.version.clone(),
            sha256: d.sha256.clone(),
            download: Some(d.url.clone()),
        })
        .collect();
    components.extend(
        lock.packages
            .iter()
            .filter(|w| w.replaced_by.is_none())
            .map(|w| Component {
                kind: ComponentKind::Wheel,
                name: w.name.clone(),
                version: w.version.clone(),
                sha256: w.sha256.clone(),
                download: Some(w.url.clone()),
            }),
    );
    components.push(Component {
        kind: ComponentKind::Own { application: false },
        name: "deep_ep".into(),
        version: "1.2.1".into(),
        sha256: "ab".repeat(32),
        download: None,
    });
    spdx_json(&SbomDocument {
        image: "commstack/debian-12",
        tag: &lock_sha256[..12],
        lock_sha256,
        epoch: EPOCH,
        components,
    })
}

fn write_meta(dir: &Path, step: &str, inputs: serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let meta = serde_json::json!({
        "schema": 1, "step": step, "hash": "00".repeat(32), "inputs": inputs,
        "created": "2026-12-04T20:35:29Z", "build_seconds": 1.0,
    });
    std::fs::write(dir.join(".step.json"), meta.to_string()).unwrap();
}

/// The built image of the repository's stack.lock, under `root`.
pub fn built(root: &Path) -> Built {
    let stack = root.join("stack.toml");
    let lock_path = root.join("stack.lock");
    std::fs::copy(repo().join("stack.toml"), &stack).unwrap();
    std::fs::copy(repo().join("stack.lock"), &lock_path).unwrap();
    let text = std::fs::read_to_string(&lock_path).unwrap();
    let lock = Lock::parse(&lock_path, &text).unwrap();
    let lock_sha256 = commstack_digest::sha256_file(&lock_path).unwrap();

    // The image and its layout.
    let tree = root.join("tree");
    std::fs::create_dir_all(tree.join("opt/commstack")).unwrap();
    std::fs::write(tree.join("opt/commstack/stack.lock"), &text).unwrap();
    let layer = write_layer(&tree, &root.join("layer.tar"), EPOCH).unwrap();
    let spec = ImageSpec {
        tag: "commstack/debian-12:test".into(),
        epoch: EPOCH,
        labels: [
            ("dev.commstack.lock.sha256".to_string(), lock_sha256.clone()),
            (
                "org.opencontainers.image.revision".to_string(),
                "c0ffee".repeat(6) + "c0ff",
            ),
        ]
        .into(),
        ..ImageSpec::default()
    };
    let layout = root.join("oci");
    let oci = write_oci_layout(&spec, std::slice::from_ref(&layer), &layout).unwrap();
    let config_hex = oci.config_digest.trim_start_matches("sha256:");

    // The image step's directory in the home's store.
    let home = root.join("home");
    let steps = home.join("store/steps");
    let dir = steps.join(format!("image-{}", "1a".repeat(16)));
    write_meta(
        &dir,
        "image",
        serde_json::json!({"lock_sha256": lock_sha256}),
    );
    std::fs::copy(
        layout.join("blobs/sha256").join(config_hex),
        dir.join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.join("sbom.spdx.json"), sbom(&lock, &lock_sha256)).unwrap();
    std::fs::write(
        dir.join("provenance.json"),
        r#"{"schema":1,"layers":[],"files":[],"shadowed":[]}"#,
    )
    .unwrap();
    let manifest = serde_json::json!({
        "schema": 1, "id": oci.config_digest, "tag": spec.tag, "lock_sha256": lock_sha256,
        "spec": spec,
        "layers": [{"holds": "commstack's files", "kind": {"kind": "own"}, "diff_id": layer.diff_id, "size": layer.size, "file": root.join("layer.tar")}],
    });
    std::fs::write(dir.join("image.json"), manifest.to_string()).unwrap();
    let image = Image::open(&dir).unwrap();

    // The run that made it: two keyed steps, the image's output its directory.
    write_meta(
        &steps.join("pipeline-nvshmem-2b2b"),
        "pipeline-nvshmem",
        serde_json::json!({"recipe": "nvshmem-7"}),
    );
    write_meta(
        &steps.join("pipeline-image-3c3c"),
        "pipeline-image",
        serde_json::json!({"lock_sha256": lock_sha256}),
    );
    // Where `cargo xtask build` writes it for this stack file.
    let id =
        commstack_digest::sha256_hex(stack.canonicalize().unwrap().to_string_lossy().as_bytes());
    let summary = home.join("pipeline").join(&id[..16]).join("summary.json");
    std::fs::create_dir_all(summary.parent().unwrap()).unwrap();
    let rows = serde_json::json!({
        "stack": "stack.toml", "lock": "stack.lock", "ok": true, "seconds": 4593.3,
        "started": "2026-12-04T20:35:29Z",
        "steps": [
            {"step": "lock", "outcome": "reused", "seconds": 0.0, "output": null, "key": null},
            {"step": "nvshmem", "outcome": "built", "seconds": 3747.9, "output": steps.join("nvshmem-x"), "key": "pipeline-nvshmem-2b2b"},
            {"step": "image", "outcome": "built", "seconds": 60.0, "output": dir, "key": "pipeline-image-3c3c"},
        ],
    });
    std::fs::write(&summary, rows.to_string()).unwrap();
    Built {
        root: root.to_path_buf(),
        stack,
        lock_path,
        lock,
        lock_sha256,
        home,
        image,
        summary,
        layout,
        manifest_digest: oci.manifest_digest,
    }
}
