//! The image step on a fixture stack, through the real `docker load`, skopeo and umoci:
//! a tiny base (a tree written by write_layer and its base.json), tiny wheels made by
//! WheelBuilder (a "torch" and an "nccl" above the test's size threshold, so they get
//! layers of their own), the real wheelhouse step, fake drop-in and DeepEP wheels, and a
//! static binary as the tool. No network.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use commstack_deepep::LockedWheel;
use commstack_image::assemble::ENV;
use commstack_image::base::BaseManifest;
use commstack_image::provenance::{Origin, Provenance};
use commstack_image::{
    EarlyLoad, Image, assemble_image, docker_load, docker_load_with, export_oci,
};
use commstack_store::Store;
use commstack_wheel::WheelBuilder;

mod support;

use support::*;

fn diff_ids(image: &Image) -> Vec<String> {
    image
        .manifest
        .layers
        .iter()
        .map(|l| l.diff_id.clone())
        .collect()
}

fn rmi(reference: &str) {
    let _ = run("docker", &["rmi", "-f", reference]);
}

/// Removes `images` from Docker, by tag and by ID.
fn forget(images: &[&Image]) {
    for image in images {
        rmi(image.tag());
        rmi(image.id());
    }
}

/// Docker holds `image` under its tag.
fn assert_tagged(image: &Image) {
    assert_eq!(
        ok(
            "docker",
            &["image", "inspect", "--format", "{{.Id}}", image.tag()]
        )
        .trim(),
        image.id()
    );
}

fn not_in_docker(tag: &str) {
    let out = run("docker", &["image", "inspect", tag]);
    assert!(
        !out.status.success(),
        "{tag} is tagged in Docker after a failure"
    );
}

/// (1) The same inputs give the same image ID, layer digests and OCI digests: after the
/// image step's output is removed from the store and the image from Docker, and again
/// from a fresh fixture in another directory and store. A rerun is a no-op.
#[test]
fn the_image_step_is_deterministic_through_docker_load_and_the_oci_layout() {
    let name = format!("commstack-fixture-det-{}", std::process::id());
    let a = fixture(&name, 7);
    let first = assemble_image(&a.store, &a.inputs, false).unwrap();
    assert!(!first.cached);
    let layers: Vec<&str> = first
        .manifest
        .layers
        .iter()
        .map(|l| l.holds.as_str())
        .collect();
    assert_eq!(layers.len(), 8, "{layers:?}");
    assert!(
        layers[1].contains("nvidia-nccl-cu13") && layers[2].contains("torch"),
        "{layers:?}"
    );
    assert!(layers[3].contains("3 more wheels"), "{layers:?}");
    assert!(
        layers[5].contains("drop-in") && layers[6].contains("DeepEP"),
        "{layers:?}"
    );
    rmi(first.tag());
    rmi(first.id());
    let id = docker_load(&first).unwrap().id;
    assert_eq!(id, first.id());
    let inspected = ok(
        "docker",
        &["image", "inspect", "--format", "{{.Id}}", first.tag()],
    );
    assert_eq!(
        inspected.trim(),
        first.id(),
        "Docker's ID is the config digest"
    );
    let oci_a = export_oci(&first, &a._dir.path().join("oci"), None).unwrap();
    assert_eq!(oci_a.config_digest, first.id());

    // A rerun: nothing is built, Docker already has it.
    let again = assemble_image(&a.store, &a.inputs, false).unwrap();
    assert!(again.cached);
    assert_eq!(docker_load(&again).unwrap().id, first.id());

    // The image step's output and the image gone: the same ID and layers.
    std::fs::remove_dir_all(&first.dir).unwrap();
    rmi(first.tag());
    not_in_docker(first.id());
    let second = assemble_image(&a.store, &a.inputs, false).unwrap();
    assert!(!second.cached);
    assert_eq!(docker_load(&second).unwrap().id, first.id());
    assert_eq!(diff_ids(&second), diff_ids(&first));
    let oci_b = export_oci(&second, &a._dir.path().join("oci-2"), None).unwrap();
    assert_eq!(oci_b, oci_a);
    // With the store, each compressed layer becomes a step of its own: the same blobs, and
    // a second layout takes them from there (their files linked, not compressed again).
    let stored = export_oci(&second, &a._dir.path().join("oci-3"), Some(&a.store)).unwrap();
    assert_eq!(stored, oci_a);
    let gz_steps = || -> Vec<std::path::PathBuf> {
        let mut steps: Vec<_> = std::fs::read_dir(a.store.root().join("steps"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{}-", commstack_image::GZIP_STEP))
            })
            .collect();
        steps.sort();
        steps
    };
    let made = gz_steps();
    assert_eq!(made.len(), oci_a.layer_digests.len(), "{made:?}");
    let mtimes: Vec<_> = made
        .iter()
        .map(|p| {
            std::fs::metadata(p.join("layer.tar.gz"))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect();
    let again = export_oci(&second, &a._dir.path().join("oci-4"), Some(&a.store)).unwrap();
    assert_eq!(again, oci_a);
    assert_eq!(gz_steps(), made);
    for (p, m) in made.iter().zip(&mtimes) {
        assert_eq!(
            &std::fs::metadata(p.join("layer.tar.gz"))
                .unwrap()
                .modified()
                .unwrap(),
            m,
            "{} compressed again",
            p.display()
        );
    }
    for digest in &oci_a.layer_digests {
        let blob = a
            ._dir
            .path()
            .join("oci-4/blobs/sha256")
            .join(&digest["sha256:".len()..]);
        assert_eq!(
            commstack_digest::sha256_file(&blob).unwrap(),
            digest["sha256:".len()..],
            "{}",
            blob.display()
        );
    }

    // Everything again from scratch, elsewhere.
    let b = fixture(&name, 7);
    let third = assemble_image(&b.store, &b.inputs, false).unwrap();
    assert_eq!(third.id(), first.id());
    assert_eq!(diff_ids(&third), diff_ids(&first));
    let oci_c = export_oci(&third, &b._dir.path().join("oci"), None).unwrap();
    assert_eq!(oci_c, oci_a);
    assert_eq!(
        std::fs::read(third.dir.join("sbom.spdx.json")).unwrap(),
        std::fs::read(second.dir.join("sbom.spdx.json")).unwrap()
    );

    // Independent readers of the OCI layout: skopeo, and umoci's unpacked root filesystem
    // holds exactly the files provenance.json maps.
    let tag = first.tag().rsplit_once(':').unwrap().1.to_string();
    let layout = a._dir.path().join("oci");
    let raw = ok(
        "skopeo",
        &[
            "inspect",
            "--raw",
            &format!("oci:{}:{tag}", layout.display()),
        ],
    );
    let manifest: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(manifest["config"]["digest"], first.id());
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 8);
    let bundle = a._dir.path().join("bundle");
    ok(
        "umoci",
        &[
            "unpack",
            "--rootless",
            "--image",
            &format!("{}:{tag}", layout.display()),
            bundle.to_str().unwrap(),
        ],
    );
    let rootfs = bundle.join("rootfs");
    let mut unpacked = commstack_image::venv::tree_files(&rootfs).unwrap();
    unpacked.sort();
    let provenance: Provenance =
        serde_json::from_slice(&std::fs::read(first_dir_provenance(&second)).unwrap()).unwrap();
    let mapped: Vec<String> = provenance.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        unpacked, mapped,
        "the image's files are exactly those provenance maps"
    );
    // The image carries its SBOM and provenance, byte for byte the ones beside it.
    assert_eq!(
        std::fs::read(rootfs.join("opt/commstack/sbom.spdx.json")).unwrap(),
        std::fs::read(second.dir.join("sbom.spdx.json")).unwrap()
    );
    rmi(first.tag());
    rmi(first.id());
}

fn first_dir_provenance(image: &Image) -> PathBuf {
    image.dir.join("provenance.json")
}

/// (2) Changing only the DeepEP wheel changes only the DeepEP layer and the top layer; the
/// other layer steps are found, not built.
#[test]
fn a_deepep_change_rebuilds_only_its_layer_and_the_top() {
    let name = format!("commstack-fixture-layers-{}", std::process::id());
    let a = fixture(&name, 7);
    let one = assemble_image(&a.store, &a.inputs, false).unwrap();
    let b = with_other_deepep(&a, &name, 8);
    let steps_before = layer_steps(&a.store);
    let two = assemble_image(&b.store, &b.inputs, false).unwrap();
    let (x, y) = (diff_ids(&one), diff_ids(&two));
    assert_eq!(x.len(), y.len());
    let changed: Vec<&str> = (0..x.len())
        .filter(|&i| x[i] != y[i])
        .map(|i| one.manifest.layers[i].holds.as_str())
        .collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(
        changed[0].starts_with("DeepEP") && changed[1].starts_with("commstack"),
        "{changed:?}"
    );
    assert_eq!(
        layer_steps(&a.store) - steps_before,
        2,
        "two layer steps built"
    );
    assert_ne!(one.id(), two.id());

    // Loaded after the first, the second sends Docker only the layers from DeepEP's up:
    // the chain below is Docker's already (the image's ID is still checked).
    forget(&[&one, &two]);
    // (Other tests' images may share the fixture's base layer: the first load's split
    // depends on them, the second's does not.)
    let first = docker_load(&one).unwrap();
    assert_eq!(first.sent + first.kept, x.len(), "{first:?}");
    let second = docker_load(&two).unwrap();
    let deepep = y.iter().zip(&x).take_while(|(a, b)| a == b).count();
    assert_eq!(second.id, two.id());
    assert_eq!(
        (second.sent, second.kept),
        (x.len() - deepep, deepep),
        "{second:?}"
    );
    assert_tagged(&two);
    forget(&[&one, &two]);
}

/// The load of a pulled image starts while its layers download: layers go in as they
/// land, in any order (the top before DeepEP's here, and one Docker has as a chain), and
/// `finish` sends the rest. A load dropped before `finish` (the pull failed) loads nothing;
/// one Docker refuses (a wrong tar under a diff_id) gives way to the usual load.
#[test]
fn an_early_load_takes_layers_as_they_land_and_one_dropped_loads_nothing() {
    let name = format!("commstack-fixture-early-{}", std::process::id());
    // DeepEP seeds of this test's own: the other tests' images (seed 7 and 8) have the
    // same IDs whatever their name, and they remove theirs by ID while this one runs.
    let a = fixture(&name, 41);
    let one = assemble_image(&a.store, &a.inputs, false).unwrap();
    let b = with_other_deepep(&a, &name, 42);
    let two = assemble_image(&b.store, &b.inputs, false).unwrap();
    forget(&[&one, &two]);
    docker_load(&one).unwrap();
    let layers = two.layers();
    let kept = diff_ids(&one)
        .iter()
        .zip(&layers)
        .take_while(|(a, b)| **a == b.diff_id)
        .count();
    assert_eq!(layers.len() - kept, 2, "DeepEP's layer and the top move");
    let top = layers.last().unwrap();

    let dropped = EarlyLoad::start().unwrap();
    dropped.layer(&top.diff_id, &top.path).unwrap();
    drop(dropped);
    assert!(
        !run("docker", &["image", "inspect", two.id()])
            .status
            .success(),
        "a load dropped before its end registered the image"
    );

    // Other bytes under the top's diff_id: Docker refuses that load, and the image is
    // loaded again the usual way.
    let wrong = EarlyLoad::start().unwrap();
    wrong.layer(&top.diff_id, &layers[kept].path).unwrap();
    let loaded = docker_load_with(&two, Some(wrong)).unwrap();
    assert_eq!(
        (loaded.id.as_str(), loaded.sent, loaded.early),
        (two.id(), 2, 0),
        "{loaded:?}"
    );
    assert!(
        loaded
            .fallback
            .as_deref()
            .is_some_and(|why| why.contains("docker load")),
        "the early load's failure is kept for the step to say: {loaded:?}"
    );
    rmi(two.tag());
    rmi(two.id());

    let early = EarlyLoad::start().unwrap();
    early.layer(&top.diff_id, &top.path).unwrap();
    early.layer(&layers[0].diff_id, &layers[0].path).unwrap();
    let loaded = docker_load_with(&two, Some(early)).unwrap();
    assert_eq!(
        (loaded.id.as_str(), loaded.sent, loaded.kept, loaded.early),
        (two.id(), 2, kept, 1),
        "{loaded:?}"
    );
    assert_eq!(loaded.fallback, None);
    assert_tagged(&two);
    // Docker has it now: an early load given then is ended unused, and the tag stays.
    let unused = EarlyLoad::start().unwrap();
    unused.layer(&top.diff_id, &top.path).unwrap();
    let again = docker_load_with(&two, Some(unused)).unwrap();
    assert_eq!((again.sent, again.early), (0, 0), "{again:?}");
    forget(&[&one, &two]);
}

/// Fixture `a` again with the DeepEP wheel of `seed`, building in `a`'s store: only the
/// new layer steps appear there.
fn with_other_deepep(a: &Fixture, name: &str, seed: u8) -> Fixture {
    let mut b = fixture(name, seed);
    b.store = Store::open(a.store.root()).unwrap();
    b
}

fn layer_steps(store: &Store) -> usize {
    std::fs::read_dir(store.root().join("steps"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("image-layer-")
        })
        .count()
}

/// Assemble and load as `cargo xtask build image` does; on error, nothing may be tagged.
fn build_expecting_error(f: &Fixture) -> String {
    let tag = format!("{}:{}", f.inputs.name, &f.inputs.lock_sha256[..12]);
    let result = assemble_image(&f.store, &f.inputs, false).and_then(|image| docker_load(&image));
    let err = match result {
        Ok(loaded) => panic!("the build succeeded with image {}", loaded.id),
        Err(e) => format!("{e:#}"),
    };
    not_in_docker(&tag);
    err
}

/// (3) Bad input: each a clear error naming the artifact, and no image tagged.
#[test]
fn bad_inputs_fail_naming_the_artifact_and_tag_nothing() {
    let name = format!("commstack-fixture-bad-{}", std::process::id());

    // An epoch in the future: times clamped to it would keep this machine's clock.
    let mut f = fixture(&name, 7);
    f.inputs.lock.base.as_mut().unwrap().epoch = 4_000_000_000;
    let err = build_expecting_error(&f);
    assert!(
        err.contains("in the future") && err.contains("exclude-newer"),
        "{err}"
    );

    // A wheel whose bytes are not the lock's.
    let f = fixture(&name, 7);
    let filelock = f
        .inputs
        .lock
        .packages
        .iter()
        .find(|p| p.name == "filelock")
        .unwrap()
        .clone();
    let other = wheel(
        &f._dir.path().join("other"),
        "filelock",
        "3.20.0",
        &[("filelock/__init__.py", b"# tampered\n".to_vec())],
        None,
    );
    let target = f.wheels_dir.join(&filelock.filename);
    std::fs::remove_file(&target).unwrap();
    std::fs::copy(&other.path, &target).unwrap();
    let err = build_expecting_error(&f);
    for needle in [
        filelock.filename.as_str(),
        filelock.sha256.as_str(),
        other.sha256.as_str(),
        "cargo xtask fetch --verify",
        "cargo xtask build deepep",
    ] {
        assert!(err.contains(needle), "{needle} not in: {err}");
    }

    // The base step without its rootfs.tar.
    let f = fixture(&name, 7);
    std::fs::remove_file(f.inputs.base_dir.join("rootfs.tar")).unwrap();
    let err = build_expecting_error(&f);
    assert!(
        err.contains("rootfs.tar") && err.contains("missing"),
        "{err}"
    );

    // The wheelhouse without one of the lock's wheels.
    let f = fixture(&name, 7);
    let cublas = f
        .inputs
        .lock
        .packages
        .iter()
        .find(|p| p.name == "nvidia-cublas")
        .unwrap()
        .clone();
    std::fs::remove_file(f.wheels_dir.join(&cublas.filename)).unwrap();
    let err = build_expecting_error(&f);
    assert!(
        err.contains(&cublas.filename) && err.contains("cargo xtask build deepep"),
        "{err}"
    );

    // A file of the base that no provenance source claims.
    let f = fixture(&name, 7);
    let json = f.inputs.base_dir.join("base.json");
    let mut base: BaseManifest = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    base.files.remove("etc/hostname");
    std::fs::write(&json, serde_json::to_string(&base).unwrap()).unwrap();
    let err = build_expecting_error(&f);
    assert!(
        err.contains("etc/hostname") && err.contains("no known source"),
        "{err}"
    );
}

/// (4) The loaded image has the plan's user, environment and labels, and a process in it
/// runs as the user with the user's home.
#[test]
fn the_loaded_image_has_the_user_env_and_labels_of_the_plan() {
    let name = format!("commstack-fixture-inspect-{}", std::process::id());
    let f = fixture(&name, 7);
    let image = assemble_image(&f.store, &f.inputs, false).unwrap();
    docker_load(&image).unwrap();
    let inspect = ok("docker", &["image", "inspect", image.tag()]);
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let config = &v[0]["Config"];
    assert_eq!(config["User"], "1000:1000");
    assert_eq!(config["WorkingDir"], "/home/commstack");
    let env: Vec<&str> = config["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(env, ENV);
    // What a deploy sets again from the lock alone (Slurm's OCI job) is this environment.
    assert_eq!(
        commstack_image::locked_image_env(&f.inputs.lock).unwrap(),
        env
    );
    let labels = &config["Labels"];
    assert_eq!(
        labels["dev.commstack.lock.sha256"],
        f.inputs.lock_sha256.as_str()
    );
    assert_eq!(labels["dev.commstack.torch"], "2.11.0");
    assert_eq!(labels["dev.commstack.nccl"], "2.28.9");
    assert_eq!(labels["dev.commstack.nvshmem"], "3.4.5+commstack.g1a2b3c");
    assert_eq!(labels["dev.commstack.deepep"], "1.2.1+commstack.g567632d");
    assert_eq!(labels["dev.commstack.cuda"], "13.0.2");
    assert_eq!(labels["org.opencontainers.image.revision"], "0123abc");
    assert_eq!(
        labels["org.opencontainers.image.created"],
        "2025-12-01T00:00:00Z"
    );
    let said = ok(
        "docker",
        &[
            "run",
            "--rm",
            "--network=none",
            "--entrypoint",
            "/opt/commstack/bin/commstack-verify",
            image.tag(),
        ],
    );
    assert_eq!(
        said.trim(),
        format!(
            "uid=1000 gid=1000 home=/home/commstack path={}",
            &ENV[0]["PATH=".len()..]
        )
    );
    // The home belongs to the user in the layer; the launcher and shadowing are recorded.
    let provenance: Provenance =
        serde_json::from_slice(&std::fs::read(image.dir.join("provenance.json")).unwrap()).unwrap();
    let torchrun = provenance
        .files
        .iter()
        .find(|f| f.path == "opt/commstack/venv/bin/torchrun")
        .unwrap();
    assert!(matches!(&torchrun.origin, Origin::Launcher { wheel, .. } if wheel == "torch"));
    assert!(
        provenance
            .shadowed
            .iter()
            .any(|s| s.path == "etc/passwd" && s.layer == 0)
    );
    assert!(
        provenance
            .shadowed
            .iter()
            .any(|s| s.path == "opt/commstack/venv/lib/python3.11/site-packages/nvidia/__init__.py")
    );
    let ls = ok(
        "docker",
        &[
            "run",
            "--rm",
            "--network=none",
            "--entrypoint",
            "/opt/commstack/bin/commstack-verify",
            "--user",
            "0",
            image.tag(),
        ],
    );
    assert!(ls.starts_with("uid=0"), "{ls}");
    rmi(image.tag());
    rmi(image.id());
}

/// One file of an image as `docker export` shows it: what the Dockerfile must reproduce.
#[derive(Debug, PartialEq, Eq)]
struct Listed {
    kind: char,
    mode: u32,
    uid: u64,
    gid: u64,
    size: u64,
    /// sha256 of a file's bytes (a hard link's target's), or a symlink's target.
    content: String,
}

/// Every path of a container made from `image` (`docker export`), hard links resolved to
/// their target's bytes (docker build copies them as separate files).
fn file_list(image: &str) -> std::collections::BTreeMap<String, Listed> {
    use std::io::Read;
    let id = ok("docker", &["create", image]);
    let id = id.trim();
    let out = run("docker", &["export", id]);
    ok("docker", &["rm", id]);
    assert!(out.status.success());
    let mut list = std::collections::BTreeMap::new();
    let mut hashes = std::collections::HashMap::new();
    let mut archive = tar::Archive::new(&out.stdout[..]);
    for entry in archive.entries().unwrap() {
        let mut e = entry.unwrap();
        let path = e
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        let h = e.header().clone();
        let (kind, size, content) = match h.entry_type() {
            tar::EntryType::Directory => ('d', 0, String::new()),
            tar::EntryType::Symlink => (
                'l',
                0,
                e.link_name()
                    .unwrap()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            ),
            tar::EntryType::Link => {
                let target = e
                    .link_name()
                    .unwrap()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                let (size, sha): &(u64, String) = hashes.get(&target).unwrap();
                ('f', *size, sha.clone())
            }
            _ => {
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                let sha = commstack_digest::sha256_hex(&bytes);
                hashes.insert(path.clone(), (bytes.len() as u64, sha.clone()));
                ('f', bytes.len() as u64, sha)
            }
        };
        let listed = Listed {
            kind,
            mode: h.mode().unwrap() & 0o7777,
            uid: h.uid().unwrap(),
            gid: h.gid().unwrap(),
            size,
            content,
        };
        list.insert(path, listed);
    }
    list
}

/// docker/Dockerfile, built with the context `cargo xtask build image --context` writes, gives
/// the tool's image file for file (path, type, mode, owner, size, sha256) and the same
/// config (user, env, labels, cmd); what differs is listed in docs/image.md (mtimes, the
/// layer split, hence the IDs).
#[test]
fn the_dockerfile_builds_the_same_files_as_the_tool() {
    let name = format!("commstack-fixture-dockerfile-{}", std::process::id());
    let f = fixture(&name, 11);
    let image = assemble_image(&f.store, &f.inputs, false).unwrap();
    docker_load(&image).unwrap();
    let ctx_dir = f._dir.path().join("context");
    let ctx = commstack_image::write_docker_context(&image, &ctx_dir).unwrap();
    let build_args = std::fs::read_to_string(ctx_dir.join("build-args")).unwrap();
    let dockerfile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docker/Dockerfile");
    let built_tag = format!("{name}-dockerfile:test");
    let mut args: Vec<String> = vec!["build".into(), "-q".into(), "-f".into()];
    args.push(dockerfile.to_string_lossy().into_owned());
    args.extend(build_args.split_whitespace().map(String::from));
    args.extend(["-t".into(), built_tag.clone()]);
    args.push(ctx_dir.to_string_lossy().into_owned());
    let out = Command::new("docker")
        .args(&args)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ours = file_list(image.tag());
    let theirs = file_list(&built_tag);
    let differ: Vec<String> = ours
        .keys()
        .chain(theirs.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|p| ours.get(*p) != theirs.get(*p))
        .map(|p| {
            format!(
                "{p}: tool {:?}, Dockerfile {:?}",
                ours.get(p),
                theirs.get(p)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "file lists differ:\n{}",
        differ.join("\n")
    );
    assert!(ours.len() > 20, "too few files to compare: {}", ours.len());

    let config = |r: &str| -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&ok("docker", &["image", "inspect", r])).unwrap();
        v[0]["Config"].clone()
    };
    let (a, b) = (config(image.tag()), config(&built_tag));
    for field in ["User", "Env", "Labels", "Cmd", "WorkingDir"] {
        assert_eq!(a[field], b[field], "{field} differs");
    }
    for r in [built_tag.as_str(), image.tag(), ctx.base_tag.as_str()] {
        rmi(r);
    }
}
/// A static stand-in for nvcc and cuobjdump (the fixture base has no shell):
/// `--version` prints nvcc's banner, `--write` creates a file in $EP_JIT_CACHE_DIR as the
/// JIT does, `--exists PATH` says whether PATH is there (following links).
fn fake_cuda_tool() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let src = dir.join("nvcc.c");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--version")) {
        printf("Cuda compilation tools, release 13.0, V13.0.88\n");
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--write")) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tmp", getenv("EP_JIT_CACHE_DIR"));
        if (mkdir(path, 0755) != 0) { perror(path); return 1; }
        printf("wrote %s\n", path);
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--exists")) {
        struct stat st;
        printf("%s\n", stat(argv[2], &st) == 0 ? "yes" : "no");
        return 0;
    }
    return 2;
}
"#,
        )
        .unwrap();
        let bin = dir.join("nvcc");
        let status = Command::new("gcc")
            .args(["-static", "-O1", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("gcc");
        assert!(status.success());
        bin
    })
}

/// One file of a fixture wheel: its path, bytes and whether it is executable.
type WheelFile = (String, Vec<u8>, bool);

/// The CUDA toolchain wheels of a V2 stack as the lock has them (nvcc, nvvm, the runtime's
/// headers, cccl, cuobjdump), with the fake tool as nvcc and cuobjdump; `without` leaves
/// one distribution out.
fn jit_toolchain(out: &Path, without: Option<&str>) -> commstack_image::JitToolchain {
    let tool = std::fs::read(fake_cuda_tool()).unwrap();
    let cu = "nvidia/cu13";
    let specs: Vec<(&str, &str, Vec<WheelFile>)> = vec![
        (
            "nvidia-cuda-nvcc",
            "13.0.88",
            vec![
                (format!("{cu}/bin/nvcc"), tool.clone(), true),
                (format!("{cu}/bin/ptxas"), tool.clone(), true),
                (
                    format!("{cu}/bin/nvcc.profile"),
                    b"TOP = $(_HERE_)/..\n".to_vec(),
                    false,
                ),
            ],
        ),
        (
            "nvidia-nvvm",
            "13.0.88",
            vec![(format!("{cu}/nvvm/bin/cicc"), tool.clone(), true)],
        ),
        (
            "nvidia-cuda-runtime",
            "13.0.96",
            [
                "cuda_runtime.h",
                "cuda_bf16.h",
                "cuda_fp8.h",
                "cooperative_groups.h",
            ]
            .iter()
            .map(|h| {
                (
                    format!("{cu}/include/{h}"),
                    format!("/* {h} */\n").into_bytes(),
                    false,
                )
            })
            .chain([(format!("{cu}/lib/libcudart.so.13"), blob(9, 2000), false)])
            .collect(),
        ),
        (
            "nvidia-cuda-cccl",
            "13.0.85",
            vec![(
                format!("{cu}/include/cccl/cuda/std/tuple"),
                b"// tuple\n".to_vec(),
                false,
            )],
        ),
        (
            "nvidia-cuda-cuobjdump",
            "13.4.92",
            vec![(format!("{cu}/bin/cuobjdump"), tool.clone(), true)],
        ),
    ];
    let wheels = specs
        .into_iter()
        .filter(|(name, _, _)| Some(*name) != without)
        .map(|(name, version, files)| {
            let mut b = WheelBuilder::new(name, version).unwrap().tag(
                "py3",
                "none",
                "manylinux_2_17_x86_64",
            );
            b.add_bytes("nvidia/__init__.py", Vec::new(), false)
                .unwrap();
            for (path, bytes, exec) in files {
                b.add_bytes(&path, bytes, exec).unwrap();
            }
            LockedWheel::from_file(&b.write(out).unwrap().path).unwrap()
        })
        .collect();
    commstack_image::JitToolchain { wheels }
}

/// A DeepEP V2 image: the toolchain its JIT runs is a layer of its own under
/// /opt/commstack/cuda with the toolkit layout nvcc.profile expects, CUDA_HOME and
/// EP_JIT_CACHE_DIR are in the image's environment, nvcc and cuobjdump run there, and
/// the image user writes the JIT cache. A V1 image has none of it (the test above).
#[test]
fn a_v2_image_holds_the_jit_toolchain_its_env_and_a_cache_the_user_writes() {
    let name = format!("commstack-fixture-v2-{}", std::process::id());
    let mut f = fixture(&name, 7);
    let tc = f._dir.path().join("toolchain-wheels");
    f.inputs.jit = Some(jit_toolchain(&tc, None));
    let image = assemble_image(&f.store, &f.inputs, false).unwrap();
    let holds: Vec<&str> = image
        .manifest
        .layers
        .iter()
        .map(|l| l.holds.as_str())
        .collect();
    let jit_layer = holds
        .iter()
        .position(|h| h.starts_with("CUDA toolchain for DeepEP V2's JIT"))
        .unwrap_or_else(|| panic!("{holds:?}"));
    assert!(
        holds[jit_layer].contains("nvidia-cuda-cuobjdump 13.4.92"),
        "{holds:?}"
    );
    assert!(
        holds[jit_layer + 1].starts_with("NVSHMEM drop-in"),
        "{holds:?}"
    );

    docker_load(&image).unwrap();
    let inspect = ok("docker", &["image", "inspect", image.tag()]);
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let env: Vec<String> = v[0]["Config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_string())
        .collect();
    let mut want: Vec<String> = ENV.iter().map(|s| s.to_string()).collect();
    want.push("CUDA_HOME=/opt/commstack/cuda/nvidia/cu13".into());
    want.push("EP_JIT_CACHE_DIR=/var/cache/deep_ep".into());
    assert_eq!(env, want);
    // A deploy computes the same from a V2 lock alone (its toolchain's nvcc), without the
    // wheels at hand: the environment Slurm's OCI job sets again.
    let mut lock = f.inputs.lock.clone();
    lock.resolved.deepep_api = commstack_stack::manifest::DeepEpApi::V2;
    lock.toolchain = (f.inputs.jit.as_ref().unwrap().wheels.iter())
        .map(|w| commstack_stack::lock::Wheel {
            name: w.name.clone(),
            version: w.version.clone(),
            filename: w.filename.clone(),
            url: format!("https://example.invalid/{}", w.filename),
            sha256: w.sha256.clone(),
            size: 0,
            requires: vec![],
            replaced_by: None,
        })
        .collect();
    assert_eq!(commstack_image::locked_image_env(&lock).unwrap(), env);

    let in_image = |entrypoint: &str, args: &[&str]| {
        let mut argv = vec![
            "run",
            "--rm",
            "--network=none",
            "--entrypoint",
            entrypoint,
            image.tag(),
        ];
        argv.extend_from_slice(args);
        ok("docker", &argv).trim().to_string()
    };
    let home = "/opt/commstack/cuda/nvidia/cu13";
    assert_eq!(
        in_image(&format!("{home}/bin/nvcc"), &["--version"]),
        "Cuda compilation tools, release 13.0, V13.0.88"
    );
    // The JIT writes <cache>/tmp as the image user (uid 1000, the image's User).
    assert_eq!(
        in_image(&format!("{home}/bin/cuobjdump"), &["--write"]),
        "wrote /var/cache/deep_ep/tmp"
    );
    for path in [
        "targets/x86_64-linux/include/cuda_fp8.h",
        "targets/x86_64-linux/include/cccl/cuda/std/tuple",
        "lib64/libcudart.so.13",
        "nvvm/bin/cicc",
    ] {
        assert_eq!(
            in_image(
                &format!("{home}/bin/nvcc"),
                &["--exists", &format!("{home}/{path}")]
            ),
            "yes",
            "{path}"
        );
    }
    // docker/Dockerfile's context does not carry the V2 environment: refused, not wrong.
    let ctx = f._dir.path().join("context");
    let err = format!(
        "{:#}",
        commstack_image::write_docker_context(&image, &ctx).unwrap_err()
    );
    assert!(err.contains("DeepEP V2") && err.contains("--oci"), "{err}");
    assert!(!ctx.exists());
    rmi(image.tag());
    rmi(image.id());
}

/// A V2 toolchain without cuobjdump (the JIT runs it on every kernel it loads) is refused
/// before any layer is written, naming the file and the wheel to lock.
#[test]
fn a_v2_toolchain_without_cuobjdump_is_refused_naming_the_wheel() {
    let name = format!("commstack-fixture-v2-nocuobjdump-{}", std::process::id());
    let mut f = fixture(&name, 7);
    let tc = f._dir.path().join("toolchain-wheels");
    f.inputs.jit = Some(jit_toolchain(&tc, Some("nvidia-cuda-cuobjdump")));
    let err = format!(
        "{:#}",
        assemble_image(&f.store, &f.inputs, false).unwrap_err()
    );
    assert!(
        err.contains("bin/cuobjdump") && err.contains("nvidia-cuda-cuobjdump"),
        "{err}"
    );
    not_in_docker(&commstack_image::assemble::image_tag(
        &name,
        &f.inputs.lock_sha256,
        &f.inputs.revision,
    ));
}
