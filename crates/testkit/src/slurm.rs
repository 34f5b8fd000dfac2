//! A real Slurm for tests: munged, slurmctld and slurmd (Debian 12's slurm-wlm 22.05) on
//! loopback, one node, configured in a directory the test gives ([`Cluster::start`]); a
//! job script submitted with `sbatch --wait` and its output file collected
//! ([`Cluster::sbatch`]). Each daemon is stopped (its pid file's process) when the cluster
//! is dropped.
//!
//! The node offers one `gpu` GRES backed by /dev/null (a GPU-less machine), and Slurm's
//! OCI containers (oci.conf) run with runc: crun (Slurm's documented example) refuses a
//! host with the hybrid cgroup v1/v2 layout ("cgroups in hybrid mode not supported"), runc
//! does not. [`Cluster::start_with_node`] puts a recorded node, read-only, at
//! [`NODE_MOUNT`] in every container, as a GPU node's container hook mounts the host's
//! driver files. slurmd runs jobs as root (it must be root to start them).
//!
//! [`CertsD`] puts a registry's CA where containers-certs.d(5) says a node keeps it, for
//! the job's bundle step (skopeo 1.9 reads no other place).
//!
//! Needs: slurm-wlm, munge, runc (and skopeo, umoci for a job that makes OCI bundles);
//! a missing one panics (fails the test), naming the packages.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PACKAGES: &str = "slurm-wlm munge runc skopeo umoci (apt-get install; .ci/run does)";

/// Where the runtime mounts a recorded node, read-only, in every container of a cluster
/// started with one ([`Cluster::start_with_node`]): Debian's empty /mnt, so the image's
/// tree is left as it is.
pub const NODE_MOUNT: &str = "/mnt";

fn ok(program: &str, args: &[&str], dir: &Path) -> String {
    crate::command::run_ok(program, args, dir, PACKAGES)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// munged, slurmctld and slurmd for one node on loopback, configured under `dir`; each
/// stopped (its pid file's process) when dropped.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    /// The cluster under `dir` (made if missing), its node idle; oci.conf's runtime is
    /// plain runc.
    pub fn start(dir: &Path) -> Cluster {
        Cluster::start_with_node(dir, None)
    }

    /// With `node`, oci.conf's runtime is runc behind a wrapper that bind-mounts `node`
    /// read-only at [`NODE_MOUNT`] in every container it starts: as a GPU node's container
    /// hook mounts the host's driver files, for an image that does not carry the
    /// recorded node itself (a real image).
    pub fn start_with_node(dir: &Path, node: Option<&Path>) -> Cluster {
        let d = dir.to_path_buf();
        for sub in ["munge", "state", "spool", "log", "runc"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        start_munged(&d);
        // Dropped from here on: a daemon that started is stopped when a later step fails.
        let cluster = Cluster { dir: d.clone() };
        let host = ok("hostname", &["-s"], &d).trim().to_string();
        write_slurm_conf(&d, &host);
        // A GPU-less node offers one "GPU" (the job asks --gpus-per-node).
        std::fs::write(
            d.join("gres.conf"),
            format!("NodeName={host} Name=gpu File=/dev/null\n"),
        )
        .unwrap();
        let runc_root = d.join("runc").display().to_string();
        let runc = match node {
            None => format!("runc --root={runc_root}"),
            Some(node) => runc_with_node(&d, &runc_root, node),
        };
        std::fs::write(
            d.join("oci.conf"),
            format!(
                "RunTimeQuery=\"{runc} state %n.%u.%j.%s.%t\"\nRunTimeKill=\"{runc} kill -a %n.%u.%j.%s.%t\"\n\
                 RunTimeDelete=\"{runc} delete --force %n.%u.%j.%s.%t\"\nRunTimeRun=\"{runc} run --bundle %b %n.%u.%j.%s.%t\"\n"
            ),
        )
        .unwrap();
        let conf = d.join("slurm.conf").display().to_string();
        ok("slurmctld", &["-f", &conf], &d);
        ok("slurmd", &["-f", &conf], &d);
        cluster.wait_idle();
        cluster
    }

    /// Until sinfo says the node is idle (a minute at most).
    fn wait_idle(&self) {
        let start = Instant::now();
        loop {
            let state = self.slurm("sinfo", &["-h", "-o", "%t"]);
            if String::from_utf8_lossy(&state.stdout).trim() == "idle" {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the node did not come up: {}\n{}",
                String::from_utf8_lossy(&state.stdout),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn slurm(&self, program: &str, args: &[&str]) -> Output {
        Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .current_dir(&self.dir)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}: {PACKAGES}"))
    }

    /// The last lines of slurmctld's and slurmd's logs, for a failure's message.
    pub fn logs(&self) -> String {
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

    /// Submits `script` (written to `work/job.sbatch`) from `work` with `env` added to the
    /// environment and waits for the job: whether it completed, and its output file (the
    /// script's own `#SBATCH --output=`, `%j` its job id, under `work`).
    pub fn sbatch(&self, work: &Path, script: &str, env: &[(&str, String)]) -> (bool, String) {
        let output_file = script
            .lines()
            .find_map(|l| l.strip_prefix("#SBATCH --output="))
            .unwrap_or_else(|| {
                panic!("the script names no output file (#SBATCH --output=):\n{script}")
            });
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
        let output = std::fs::read_to_string(work.join(output_file.trim().replace("%j", id)))
            .unwrap_or_else(|e| panic!("job {id} wrote no output ({e}): {}", self.logs()));
        (out.status.success(), output)
    }
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

/// munged with a key, socket, pid and log files of its own under `d/munge`.
fn start_munged(d: &Path) {
    let key: Vec<u8> = (0..1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(d.join("munge/munge.key"), key).unwrap();
    ok("chmod", &["400", "munge/munge.key"], d);
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
        d,
    );
}

/// `d/slurm.conf`: one node `host` on 127.0.0.1 (free ports), munge's socket under
/// `d/munge`, the state, spool, pid and log files under `d`, one `debug` partition.
fn write_slurm_conf(d: &Path, host: &str) {
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
            sock = p("munge/munge.socket"),
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

/// `/etc/containers/certs.d/<host>/ca.crt` for a test's registry (a port of its own),
/// removed when dropped: where a node's skopeo finds the CA of the registry a job's
/// bundle step pulls from.
#[derive(Debug)]
pub struct CertsD(PathBuf);

impl CertsD {
    pub fn install(host: &str, ca: &Path) -> CertsD {
        let dir = Path::new("/etc/containers/certs.d").join(host);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (writing it needs root)", dir.display()));
        std::fs::copy(ca, dir.join("ca.crt")).unwrap();
        CertsD(dir)
    }
}

impl Drop for CertsD {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
