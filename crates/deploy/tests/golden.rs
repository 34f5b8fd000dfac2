//! Golden renders: a 1-node and a 2-node x 8-GPU deploy (tests/fixtures/*.toml) for
//! Kubernetes and Slurm, compared byte for byte with tests/golden/<case>/<target>/.
//! After an intended change: `COMMSTACK_BLESS=1 cargo test -p commstack-deploy --test
//! golden`, then review the diff. With COMMSTACK_DEPLOY_RENDER_TO=DIR the renders are also
//! written under DIR/<case>/<target>/: ci/test.sh validates them against Kubernetes'
//! schema and the pinned CRDs (ci/validate_deploy.py).

mod common;

use std::path::{Path, PathBuf};

use common::{crate_dir, fixture, image, image_env, tables};
use commstack_deploy::{Rendered, Target, render};

fn compare(case: &str, target: Target, rendered: &Rendered) {
    let dir = crate_dir()
        .join("tests/golden")
        .join(case)
        .join(target.as_str());
    let bless = std::env::var_os("COMMSTACK_BLESS").is_some();
    if let Some(to) = std::env::var_os("COMMSTACK_DEPLOY_RENDER_TO") {
        for (rel, text) in &rendered.files {
            let path = Path::new(&to).join(case).join(target.as_str()).join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        }
    }
    let mut mismatched = Vec::new();
    for (rel, text) in &rendered.files {
        let path = dir.join(rel);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(golden) if &golden == text => {}
            Ok(_) => mismatched.push(format!("{} differs", path.display())),
            Err(e) => mismatched.push(format!("{}: {e}", path.display())),
        }
    }
    // No golden file without a rendered one (a file the render stopped making).
    let rendered_paths: Vec<PathBuf> = rendered.files.iter().map(|(r, _)| dir.join(r)).collect();
    for entry in walk(&dir) {
        if !rendered_paths.contains(&entry) {
            mismatched.push(format!("{} is no longer rendered", entry.display()));
        }
    }
    assert!(
        mismatched.is_empty(),
        "{}\nif intended, rerun with COMMSTACK_BLESS=1 and review the diff",
        mismatched.join("\n")
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn one_node_k8s_and_slurm_match_their_goldens() {
    let stack = fixture("one-node.toml");
    for target in [Target::K8s, Target::Slurm] {
        let r = render(target, &stack, &image(), &image_env(&stack), &tables()).unwrap();
        compare("one-node", target, &r);
    }
}

#[test]
fn two_nodes_k8s_and_slurm_match_their_goldens() {
    let stack = fixture("two-node.toml");
    for target in [Target::K8s, Target::Slurm] {
        let r = render(target, &stack, &image(), &image_env(&stack), &tables()).unwrap();
        compare("two-node", target, &r);
    }
}

/// DeepEP V2 through Slurm's OCI containers: the payload's shell sets the V2 image's own
/// environment again (CUDA_HOME and EP_JIT_CACHE_DIR of its JIT beside V1's).
#[test]
fn one_node_v2_slurm_oci_sets_the_v2_images_environment() {
    let path = crate_dir().join("tests/fixtures/one-node.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("container = \"pyxis\"", "container = \"oci\"");
    let stack = commstack_stack::Stack::parse(Path::new("one-node.toml"), &text).unwrap();
    let env = image_env(&stack);
    assert!(env.contains(&"CUDA_HOME=/opt/commstack/cuda/nvidia/cu13".to_string()));
    let r = render(Target::Slurm, &stack, &image(), &env, &tables()).unwrap();
    let (_, script) = &r.files[0];
    assert!(
        script.contains("\nexport CUDA_HOME=/opt/commstack/cuda/nvidia/cu13\nexport EP_JIT_CACHE_DIR=/var/cache/deep_ep\n"),
        "{script}"
    );
    compare("one-node-oci", Target::Slurm, &r);
}

/// The same inputs give the same bytes (the YAML serialiser keeps field order; maps are
/// sorted).
#[test]
fn renders_are_deterministic() {
    let stack = fixture("two-node.toml");
    let a = render(Target::K8s, &stack, &image(), &image_env(&stack), &tables()).unwrap();
    let b = render(Target::K8s, &stack, &image(), &image_env(&stack), &tables()).unwrap();
    assert_eq!(a, b);
}
