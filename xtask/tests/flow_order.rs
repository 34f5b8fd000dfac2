//! Tidy: the crates' dependency graph follows the flow
//! (manifest -> lock -> fetch -> build -> image -> verify) with no back-edge.
//!
//! Every workspace crate has a layer in [`LAYERS`]; a crate may depend (normal, build or
//! dev) only on commstack crates of a strictly lower layer. A new crate fails this test
//! until it is given its layer, so the order is decided once, here, in review.

use std::collections::BTreeMap;
use std::path::Path;

/// The flow, bottom first. Crates of one layer do not depend on each other.
const LAYERS: &[(u32, &[&str])] = &[
    // Naming bytes, and real parts for tests: below everything.
    (0, &["commstack-digest", "commstack-testkit"]),
    // Formats and the store: archives, ELF, the step store, the log knowledge base; the one
    // HTTP client builder (bounded reads, retries) of the index, the mirror and fetch;
    // running external programs (a failed one as one typed error).
    (
        1,
        &[
            "commstack-http",
            "commstack-archive",
            "commstack-elf",
            "commstack-store",
            "commstack-logscan",
            "commstack-exec",
        ],
    ),
    // The manifest and lock model; wheels (read, written, installed through archives);
    // the build graph engine (steps keyed through the store; it knows no stack); a build's
    // timings page (reads a summary.json and ninja logs, nothing of the stack).
    (
        2,
        &[
            "commstack-stack",
            "commstack-wheel",
            "commstack-graph",
            "commstack-timings",
        ],
    ),
    // The environment a deployment sets, checked against the stack's NVSHMEM source,
    // NCCL's and DeepEP's tables (reads the manifest's switches, nothing later).
    // Locking: the indexes (PyPI, Debian), the resolver, manifest -> lock.
    (
        3,
        &["commstack-pypi", "commstack-debian", "commstack-envlint"],
    ),
    (4, &["commstack-resolve"]),
    (5, &["commstack-lock"]),
    // Fetching the locked artifacts.
    (6, &["commstack-fetch"]),
    // Building: the toolchain, NVSHMEM, then what is built against it.
    (7, &["commstack-toolchain"]),
    // Our own tools (self-test, verify tool) built reproducibly with the toolchain.
    (
        8,
        &[
            "commstack-nvshmem",
            "commstack-nccl",
            "commstack-base",
            "commstack-tools",
        ],
    ),
    (9, &["commstack-deepep", "commstack-kernels"]),
    // Images and shipping them; the self-test's bandwidth plot (reads its reports).
    (10, &["commstack-image", "commstack-plot"]),
    (11, &["commstack-registry"]),
    // Proof at every level, and what consumes it.
    (12, &["commstack-verify", "commstack-doctor"]),
    // What consumes the pushed image: adopt, and deploy's manifests (after registry and
    // verify; never the build graph).
    (13, &["commstack-adopt", "commstack-deploy"]),
    // The stack's steps on the graph; the binary cache of their outputs; the commands
    // that run them.
    (14, &["commstack-steps"]),
    // The image's attestations (its SBOM and provenance, read from the steps' records),
    // made and checked by the commands.
    (15, &["commstack-binary-cache", "commstack-attest"]),
    (16, &["commstack-pipeline"]),
    // The benchmarks `cargo xtask bench` runs (they run the pipeline's commands).
    (17, &["commstack-bench"]),
    // The CLI on top.
    (18, &["xtask"]),
];

fn layer_of(name: &str) -> Option<u32> {
    LAYERS
        .iter()
        .find(|(_, crates)| crates.contains(&name))
        .map(|(layer, _)| *layer)
}

/// One crate's name and the commstack crates it depends on, with the table they come from.
struct Manifest {
    path: String,
    name: String,
    deps: Vec<(String, &'static str)>,
}

fn parse_manifest(path: &str, text: &str) -> Manifest {
    let doc: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("{path} is not TOML: {e}"));
    let name = doc["package"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{path}: no package.name"))
        .to_string();
    let mut deps = Vec::new();
    for table in ["dependencies", "build-dependencies", "dev-dependencies"] {
        if let Some(t) = doc.get(table).and_then(|t| t.as_table()) {
            for dep in t.keys().filter(|k| k.starts_with("commstack-")) {
                deps.push((dep.clone(), table));
            }
        }
    }
    Manifest {
        path: path.to_string(),
        name,
        deps,
    }
}

/// Every violation of the flow order, one line each, naming the manifest and the edge.
fn flow_violations(manifests: &[Manifest]) -> Vec<String> {
    let mut out = Vec::new();
    for m in manifests {
        let Some(own) = layer_of(&m.name) else {
            out.push(format!(
                "{}: crate {} has no layer in the flow table: add it to LAYERS in xtask/tests/flow_order.rs",
                m.path, m.name
            ));
            continue;
        };
        for (dep, table) in &m.deps {
            match layer_of(dep) {
                None => out.push(format!(
                    "{}: [{table}] {dep} has no layer in the flow table",
                    m.path
                )),
                Some(l) if l >= own => out.push(format!(
                    "{}: [{table}] {} (layer {own}) depends on {dep} (layer {l}): a back-edge against the flow; move the shared code down into a lower crate",
                    m.path, m.name
                )),
                Some(_) => {}
            }
        }
    }
    out
}

fn workspace_manifests() -> Vec<Manifest> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut paths = vec![
        root.join("xtask/Cargo.toml"),
        root.join("kernels/Cargo.toml"),
    ];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let manifest = entry.unwrap().path().join("Cargo.toml");
        if manifest.is_file() {
            paths.push(manifest);
        }
    }
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let shown = p.strip_prefix(&root).unwrap_or(p).display().to_string();
            parse_manifest(&shown, &text)
        })
        .collect()
}

#[test]
fn the_dependency_graph_follows_the_flow() {
    let manifests = workspace_manifests();
    assert!(
        manifests.len() >= 15,
        "found only {} manifests",
        manifests.len()
    );
    let bad = flow_violations(&manifests);
    assert!(
        bad.is_empty(),
        "the flow has back-edges:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_layer_names_a_crate_twice() {
    let mut seen = BTreeMap::new();
    for (layer, crates) in LAYERS {
        for c in *crates {
            assert!(seen.insert(*c, *layer).is_none(), "{c} is in two layers");
        }
    }
}

/// The negative control: a deliberate back-edge (stack -> verify, the kind the stack ->
/// store and builds -> verify edges were) is reported, naming the manifest and both crates.
#[test]
fn a_deliberate_back_edge_is_reported() {
    let fixture = parse_manifest(
        "crates/stack/Cargo.toml",
        r#"
[package]
name = "commstack-stack"
[dependencies]
serde = "1"
commstack-digest = { path = "../digest" }
[dev-dependencies]
commstack-verify = { path = "../verify" }
"#,
    );
    let bad = flow_violations(&[fixture]);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].contains("crates/stack/Cargo.toml")
            && bad[0].contains("[dev-dependencies] commstack-stack (layer 2) depends on commstack-verify (layer 12)"),
        "{}",
        bad[0]
    );
    let unknown = parse_manifest(
        "crates/new/Cargo.toml",
        "[package]\nname = \"commstack-new\"\n",
    );
    let bad = flow_violations(&[unknown]);
    assert!(bad[0].contains("has no layer"), "{bad:?}");
}

/// A same-layer edge is a back-edge too: crates of one layer are peers.
#[test]
fn a_same_layer_edge_is_reported() {
    let fixture = parse_manifest(
        "crates/deepep/Cargo.toml",
        "[package]\nname = \"commstack-deepep\"\n[build-dependencies]\ncommstack-kernels = \"*\"\n",
    );
    assert_eq!(flow_violations(&[fixture]).len(), 1);
}
