//! A real scheduler runs the rendered Slurm job: munge, slurmctld and slurmd (Debian 12's
//! slurm-wlm 22.05) on loopback, one node, configured in a temporary directory; the job
//! script `deploy render --target slurm` writes, submitted with `sbatch --wait`, for a
//! small fixture image (crates/image's fixture stack, carrying the real
//! `commstack-doctor`, its preflight.json, a shell and two recorded nodes) pushed by digest
//! to a real registry on loopback. The script's own steps run: the OCI bundle made by
//! skopeo + umoci, the image's preflight in Slurm's OCI container support (oci.conf with
//! runc), then the payload, whose output is collected in the job's output file.
//!
//! The nodes are recorded ones (the GPU-less CI machine has no driver to check):
//! COMMSTACK_PREFLIGHT_ROOT picks the preflight's root inside the image. A healthy node
//! completes the job; a node with a 64 MiB /dev/shm fails the preflight and the payload
//! never runs.
//!
//! The cluster is testkit's (`commstack_testkit::slurm`, shared with xtask's real-image
//! test, xtask/tests/slurm_real_image.rs): Slurm's OCI containers with runc, jobs run as
//! root. Needs: slurm-wlm, munge, runc, skopeo, umoci, docker-registry, openssl,
//! apache2-utils (.ci/run installs them).

#[path = "../../image/tests/support/mod.rs"]
mod support;

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{crate_dir, tables};
use commstack_deploy::{ImageRef, Target, render};
use commstack_doctor::preflight::{Expectations, IMAGE_EXPECTATIONS};
use commstack_image::{DataFile, Tool, assemble_image, export_oci};
use commstack_registry::{Credentials, PushOptions, RegistryAuth, push_layout};
use commstack_stack::Stack;
use commstack_testkit::registry::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry};
use commstack_testkit::slurm::{CertsD, Cluster};

fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test: {e}"))
}

fn ok(program: &str, args: &[&str], dir: &Path) -> String {
    commstack_testkit::command::run_ok(program, args, dir, "see .ci/run for the packages")
}

/// This crate's sibling binary, built as the workspace builds it: the doctor the image
/// carries.
fn doctor_binary() -> PathBuf {
    let out = run(
        env!("CARGO"),
        &[
            "build",
            "-p",
            "commstack-doctor",
            "--bin",
            "commstack-doctor",
            "--message-format=json-render-diagnostics",
        ],
        &crate_dir(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the doctor's executable")
}

/// The shared libraries `binary` loads, as base files (host file, image path, origin).
fn libraries(binary: &Path) -> Vec<(PathBuf, String, String)> {
    ok("ldd", &[binary.to_str().unwrap()], Path::new("/"))
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(|p| {
            (
                PathBuf::from(p),
                p.trim_start_matches('/').to_string(),
                "deb:libc6".to_string(),
            )
        })
        .collect()
}

/// Every file under `from`, as base files under `to` in the image.
fn tree(from: &Path, to: &str) -> Vec<(PathBuf, String, String)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            files.extend(tree(&entry.path(), &format!("{to}/{name}")));
        } else {
            files.push((entry.path(), format!("{to}/{name}"), "fixture:node".into()));
        }
    }
    files
}

/// The fixture image: the doctor and preflight.json, /bin/sh (the payload step's shell),
/// and two recorded nodes under /opt/nodes: `ok` (the healthy HGX host) and `small-shm`
/// (the same with Docker's 64 MiB /dev/shm). Returns it pushed (`HOST/REPO@sha256:...`)
/// and its environment as a deploy computes it from the fixture's lock.
fn pushed_image(work: &Path, registry: &TestRegistry) -> (String, Vec<String>) {
    let doctor = doctor_binary();
    let node = Path::new(env!("CARGO_MANIFEST_DIR")).join("../doctor/tests/fixtures/hgx-h100-8gpu");
    let small = work.join("small-shm");
    ok(
        "cp",
        &["-r", node.to_str().unwrap(), small.to_str().unwrap()],
        work,
    );
    let mounts = small.join("root/proc/mounts");
    let text = std::fs::read_to_string(&mounts).unwrap();
    std::fs::write(&mounts, text.replace("size=16777216k", "size=65536k")).unwrap();
    let sh = PathBuf::from("/usr/bin/dash");
    let mut base = libraries(&doctor);
    for lib in libraries(&sh) {
        if !base.iter().any(|(_, p, _)| *p == lib.1) {
            base.push(lib);
        }
    }
    base.push((sh, "bin/sh".into(), "deb:dash".into()));
    base.extend(tree(&node, "opt/nodes/ok"));
    base.extend(tree(&small, "opt/nodes/small-shm"));

    let mut f = support::fixture_with("commstack-fixture-slurm", 7, &base);
    let lock = &f.inputs.lock.resolved;
    let expect = Expectations::new(
        &lock.cuda,
        &["90".parse().unwrap()],
        &["ibgda"],
        lock.deepep_api,
    )
    .unwrap();
    f.inputs.tools.push(Tool {
        name: "commstack-doctor".into(),
        version: "0.1.0".into(),
        image_path: "/opt/commstack/bin/commstack-doctor".into(),
        host_path: doctor,
        source: "target/debug/commstack-doctor".into(),
    });
    f.inputs.data.push(DataFile {
        image_path: IMAGE_EXPECTATIONS.into(),
        bytes: expect.to_json().into_bytes(),
        source: "the fixture lock".into(),
    });
    let image = assemble_image(&f.store, &f.inputs, false).unwrap();
    let layout = work.join("oci");
    export_oci(&image, &layout, Some(&f.store)).unwrap();
    let target =
        commstack_registry::Target::parse(&format!("{}/commstack/slurm", registry.host())).unwrap();
    let mut options = PushOptions::new(target);
    options.ca_file = Some(registry.ca());
    options.progress = false;
    options.credentials = Some(Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
        source: "the test".into(),
    });
    let env = commstack_image::locked_image_env(&f.inputs.lock).unwrap();
    (push_layout(&layout, &options).unwrap().reference, env)
}

/// The job script for `image`: one node with one GPU, no fabric, Slurm's OCI containers
/// with bundles under `bundles`, the image's fake verify tool as the payload.
fn job_script(image: &str, image_env: &[String], bundles: &Path) -> String {
    let one_node =
        std::fs::read_to_string(crate_dir().join("tests/fixtures/one-node.toml")).unwrap();
    let head = &one_node[..one_node.find("[deploy]").unwrap()];
    let toml = format!(
        "{head}[deploy]\nname = \"slurm-test\"\nnodes = 1\ngpus-per-node = 1\nnetwork = \"none\"\n\
         command = [\"/opt/commstack/bin/commstack-verify\"]\nshm-size = \"1Gi\"\n\n\
         [deploy.slurm]\ncontainer = \"oci\"\nbundle-dir = \"{}\"\n",
        bundles.display()
    );
    let stack = Stack::parse(Path::new("slurm-test.toml"), &toml).unwrap();
    let rendered = render(
        Target::Slurm,
        &stack,
        &ImageRef::parse(image).unwrap(),
        image_env,
        &tables(),
    )
    .unwrap();
    let (_, script) = &rendered.files[0];
    script.clone()
}

#[test]
fn the_rendered_job_runs_on_slurm_and_a_failing_preflight_stops_it() {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let registry = TestRegistry::start();
    let (image, image_env) = pushed_image(w, &registry);
    let script = job_script(&image, &image_env, &w.join("bundles"));
    assert!(script.contains("--container=\"$BUNDLE\""), "{script}");

    // skopeo in the job's bundle step: this registry's CA where containers-certs.d(5)
    // says a node keeps it (skopeo 1.9 reads no other place), removed after the test;
    // its credentials through REGISTRY_AUTH_FILE.
    let _ca = CertsD::install(&registry.host(), &registry.ca());
    registry.write_auths(&w.join("auth.json"));
    let env = |node: &str| {
        vec![
            (
                "CONTAINERS_REGISTRIES_CONF",
                w.join("registries.conf").display().to_string(),
            ),
            (
                "REGISTRY_AUTH_FILE",
                w.join("auth.json").display().to_string(),
            ),
            (
                "COMMSTACK_PREFLIGHT_ROOT",
                format!("/opt/nodes/{node}/root"),
            ),
            (
                "COMMSTACK_PREFLIGHT_NVIDIA_SMI_DIR",
                format!("/opt/nodes/{node}/nvidia-smi"),
            ),
        ]
    };
    let cluster = Cluster::start(&w.join("slurm"));

    let (completed, output) = cluster.sbatch(w, &script, &env("ok"));
    assert!(completed, "the job failed:\n{output}\n{}", cluster.logs());
    assert!(output.contains("\"verdict\": \"pass\""), "{output}");
    assert!(
        output.contains("\"root\": \"/opt/nodes/ok/root\""),
        "{output}"
    );
    // The payload ran in the image, as the image's user, with the image's PATH set again
    // by the script (Slurm gives the container the job's environment).
    let payload = output
        .lines()
        .find(|l| l.starts_with("uid="))
        .unwrap_or_else(|| panic!("no payload output:\n{output}"));
    assert!(
        payload.starts_with("uid=1000 gid=1000 ")
            && payload.contains(" path=/opt/commstack/venv/bin:/opt/commstack/bin:"),
        "{payload}"
    );
    // The bundle is the image by digest, made once and kept for the next job.
    let hex = image.rsplit(':').next().unwrap();
    assert!(w.join("bundles").join(hex).join("config.json").is_file());

    let (completed, output) = cluster.sbatch(w, &script, &env("small-shm"));
    assert!(!completed, "the job must fail:\n{output}");
    assert!(output.contains("\"verdict\": \"fail\""), "{output}");
    assert!(output.contains("\"dev-shm\""), "{output}");
    assert!(output.contains("the payload does not run"), "{output}");
    assert!(!output.contains("uid=1000"), "the payload ran:\n{output}");
}
