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
//! The runtime is runc: crun (Slurm's documented example) refuses this machine's hybrid
//! cgroup v1/v2 layout ("cgroups in hybrid mode not supported"), runc does not. slurmd runs
//! jobs as root here (it must be root to start them). Needs: slurm-wlm, munge, runc,
//! skopeo, umoci, docker-registry, openssl, apache2-utils (.ci/run installs them).

#[path = "../../image/tests/support/mod.rs"]
mod support;

mod common;

use std::net::TcpListener;

use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{crate_dir, tables};
use commstack_deploy::{ImageRef, Target, render};
use commstack_doctor::preflight::{Expectations, IMAGE_EXPECTATIONS};
use commstack_image::{DataFile, Tool, assemble_image, export_oci};
use commstack_registry::{Credentials, PushOptions, RegistryAuth, push_layout};
use commstack_stack::Stack;
use commstack_testkit::registry::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry};

const PACKAGES: &str = "slurm-wlm munge runc skopeo umoci (apt-get install; .ci/run does)";

fn run(program: &str, args: &[&str], dir: &Path) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test ({e}): {PACKAGES}"))
}

fn ok(program: &str, args: &[&str], dir: &Path) -> String {
    let out = run(program, args, dir);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

/// munged, slurmctld and slurmd for one node on loopback, configured under `dir`; each
/// stopped (its pid file's process) when dropped.
struct Cluster {
    dir: PathBuf,
}

/// Where the runtime mounts a recorded node, read-only, in every container of a cluster
/// started with one ([`Cluster::start_with_node`]): Debian's empty /mnt, so the image's
/// tree is left as it is.
const NODE_MOUNT: &str = "/mnt";

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        Cluster::start_with_node(dir, None)
    }

    /// With `node`, oci.conf's runtime is runc behind a wrapper that bind-mounts `node`
    /// read-only at [`NODE_MOUNT`] in every container it starts: as a GPU node's container
    /// hook mounts the host's driver files, for an image that does not carry the
    /// recorded node itself (a real image).
    fn start_with_node(dir: &Path, node: Option<&Path>) -> Cluster {
        let d = dir.to_path_buf();
        for sub in ["munge", "state", "spool", "log", "runc"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let key: Vec<u8> = (0..1024u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(d.join("munge/munge.key"), key).unwrap();
        ok("chmod", &["400", "munge/munge.key"], &d);
        let m = |f: &str| d.join("munge").join(f).display().to_string();
        ok(
            "munged",
            &[
                "--force",
                &format!("--key-file={}", m("munge.key")),
                &format!("--socket={}", m("munge.socket")),
                &format!("--pid-file={}", m("munged.pid")),
                &format!("--log-file={}", m("munged.log")),
                &format!("--seed-file={}", m("munged.seed")),
            ],
            &d,
        );
        let cluster = Cluster { dir: d.clone() };
        let host = ok("hostname", &["-s"], &d).trim().to_string();
        let (ctld, slurmd) = (free_port(), free_port());
        let p = |f: &str| d.join(f).display().to_string();
        std::fs::write(
            d.join("slurm.conf"),
            format!(
                "ClusterName=commstack-test\nSlurmctldHost={host}(127.0.0.1)\nSlurmctldPort={ctld}\nSlurmdPort={slurmd}\n\
                 AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\nSlurmUser=root\nSlurmdUser=root\n\
                 StateSaveLocation={state}\nSlurmdSpoolDir={spool}\nSlurmctldPidFile={ctldpid}\nSlurmdPidFile={dpid}\n\
                 SlurmctldLogFile={ctldlog}\nSlurmdLogFile={dlog}\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 MpiDefault=none\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nGresTypes=gpu\n\
                 JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\nReturnToService=2\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:1 State=UNKNOWN\n\
                 PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP\n",
                sock = m("munge.socket"),
                state = p("state"),
                spool = p("spool"),
                ctldpid = p("slurmctld.pid"),
                dpid = p("slurmd.pid"),
                ctldlog = p("log/slurmctld.log"),
                dlog = p("log/slurmd.log"),
                cpus = std::thread::available_parallelism().map_or(1, |n| n.get()),
            ),
        )
        .unwrap();
        // A GPU-less node offers one "GPU" (the job asks --gpus-per-node).
        std::fs::write(
            d.join("gres.conf"),
            format!("NodeName={host} Name=gpu File=/dev/null\n"),
        )
        .unwrap();
        let runc = match node {
            None => format!("runc --root={}", p("runc")),
            Some(node) => runc_with_node(&d, &p("runc"), node),
        };
        std::fs::write(
            d.join("oci.conf"),
            format!(
                "RunTimeQuery=\"{runc} state %n.%u.%j.%s.%t\"\nRunTimeKill=\"{runc} kill -a %n.%u.%j.%s.%t\"\n\
                 RunTimeDelete=\"{runc} delete --force %n.%u.%j.%s.%t\"\nRunTimeRun=\"{runc} run --bundle %b %n.%u.%j.%s.%t\"\n"
            ),
        )
        .unwrap();
        let conf = p("slurm.conf");
        ok("slurmctld", &["-f", &conf], &d);
        ok("slurmd", &["-f", &conf], &d);
        let start = Instant::now();
        loop {
            let state = cluster.slurm("sinfo", &["-h", "-o", "%t"]);
            if String::from_utf8_lossy(&state.stdout).trim() == "idle" {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the node did not come up: {}\n{}",
                String::from_utf8_lossy(&state.stdout),
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        cluster
    }

    fn slurm(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}: {PACKAGES}"))
    }

    fn logs(&self) -> String {
        ["log/slurmctld.log", "log/slurmd.log"]
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "== {f}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Submits `script` in `work` with `env` and waits for the job: its exit status and
    /// its output file.
    fn sbatch(&self, work: &Path, script: &str, env: &[(&str, String)]) -> (bool, String) {
        std::fs::write(work.join("job.sbatch"), script).unwrap();
        let out = Command::new("sbatch")
            .args(["--wait", "--parsable", "job.sbatch"])
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .current_dir(work)
            .output()
            .unwrap_or_else(|e| panic!("sbatch: {e}: {PACKAGES}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let id = stdout
            .lines()
            .next()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        assert!(
            !id.is_empty(),
            "no job id: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let output = std::fs::read_to_string(work.join(format!("slurm-test-{id}.out")))
            .unwrap_or_else(|e| panic!("job {id} wrote no output ({e}): {}", self.logs()));
        (out.status.success(), output)
    }
}

/// A runc wrapper under `dir` (oci.conf calls it as `runc`'s place, with `run --bundle
/// BUNDLE NAME`): the step's config.json with `node` bind-mounted read-only at
/// [`NODE_MOUNT`] (the rootfs made absolute), written to a bundle of its own, then runc.
fn runc_with_node(dir: &Path, runc_root: &str, node: &Path) -> String {
    let wrapper = dir.join("runc-with-node");
    std::fs::write(
        &wrapper,
        format!(
            r#"#!/bin/sh
set -eu
[ "$1" = run ] && [ "$2" = --bundle ] || exec runc --root={runc_root} "$@"
bundle=$3 name=$4
run=$(mktemp -d {dir}/run-bundle.XXXXXX)
/usr/bin/python3 - "$bundle" "$run/config.json" <<'PY'
import json, os, sys
bundle, out = sys.argv[1], sys.argv[2]
with open(os.path.join(bundle, "config.json")) as f:
    config = json.load(f)
root = config["root"]["path"]
config["root"]["path"] = root if os.path.isabs(root) else os.path.join(bundle, root)
config["mounts"].append({{"destination": "{NODE_MOUNT}", "type": "bind", "source": "{node}", "options": ["rbind", "ro"]}})
with open(out, "w") as f:
    json.dump(config, f)
PY
exec runc --root={runc_root} run --bundle "$run" "$name"
"#,
            dir = dir.display(),
            node = node.display(),
        ),
    )
    .unwrap();
    ok("chmod", &["755", wrapper.to_str().unwrap()], dir);
    wrapper.display().to_string()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for pid in ["slurmd.pid", "slurmctld.pid", "munge/munged.pid"] {
            if let Ok(pid) = std::fs::read_to_string(self.dir.join(pid)) {
                let _ = Command::new("kill").arg(pid.trim()).status();
            }
        }
    }
}

/// The test registry's login as an `auths` file: containers-auth.json(5) for skopeo
/// (REGISTRY_AUTH_FILE) and a Docker config.json alike.
fn write_auths(path: &Path, registry: &TestRegistry) {
    let auth = base64::engine::general_purpose::STANDARD
        .encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
    std::fs::write(
        path,
        format!(
            "{{\"auths\":{{\"{}\":{{\"auth\":\"{auth}\"}}}}}}",
            registry.host()
        ),
    )
    .unwrap();
}

/// `/etc/containers/certs.d/<host>/ca.crt` for the test's registry (a port of its own),
/// removed when dropped.
struct CertsD(PathBuf);

impl CertsD {
    fn install(host: &str, ca: &Path) -> CertsD {
        let dir = Path::new("/etc/containers/certs.d").join(host);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(ca, dir.join("ca.crt")).unwrap();
        CertsD(dir)
    }
}

impl Drop for CertsD {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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
    write_auths(&w.join("auth.json"), &registry);
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
