//! What every target renders alike: the paths inside the image, the commands of the gate,
//! and the environment of the fabric and of the user (the bootstrap differs per target:
//! see `k8s::env` and `slurm`).

use commstack_stack::Stack;
use commstack_stack::deploy::{Deploy, Network};
use commstack_stack::manifest::DeepEpApi;

use crate::image_ref::ImageRef;

/// The image's preflight, as the image carries it (`commstack-doctor` with the
/// expectations written from the lock when the image is made); `--network` is the
/// deploy's fabric ([`Shape::preflight`]).
pub const PREFLIGHT: &[&str] = &[
    "/opt/commstack/bin/commstack-doctor",
    "preflight",
    "--expectations",
    "/opt/commstack/preflight.json",
];
/// The image's NVSHMEM self-test.
pub const SELFTEST: &str = "/opt/commstack/bin/commstack-selftest";
/// Where the image carries DeepEP's test scripts (its `tests/` directory).
pub const DEEPEP_TESTS: &str = "/opt/commstack/deepep";
/// The venv's python.
pub const PYTHON: &str = "/opt/commstack/venv/bin/python";
/// The image's variable naming DeepEP V2's JIT cache (a volume of its own on Kubernetes).
pub const JIT_CACHE_VAR: &str = "EP_JIT_CACHE_DIR";

/// Everything a render needs: the validated stack, its `[deploy]`, the image and the
/// environment it carries (its config's Env, `KEY=VALUE` each:
/// `commstack_image::locked_image_env` of the lock it was made from).
pub struct Shape<'a> {
    pub stack: &'a Stack,
    pub deploy: &'a Deploy,
    pub image: &'a ImageRef,
    pub image_env: &'a [String],
}

impl Shape<'_> {
    /// The preflight's command for this deploy: [`PREFLIGHT`] with the fabric the nodes
    /// have (`none`: one node, the RDMA checks skipped).
    pub fn preflight(&self) -> Vec<String> {
        let mut argv: Vec<String> = PREFLIGHT.iter().map(|s| s.to_string()).collect();
        argv.extend([
            "--network".to_string(),
            self.deploy.network.as_str().to_string(),
        ]);
        argv
    }

    /// The value of `name` in the image's environment.
    pub fn image_var(&self, name: &str) -> Option<&str> {
        self.image_env
            .iter()
            .filter_map(|e| e.split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v)
    }

    /// The port of the self-test's rendezvous: the one after MASTER_PORT.
    pub fn rdzv_port(&self) -> u32 {
        u32::from(self.deploy.master_port) + 1
    }

    /// The variables of the fabric, then the user's `[deploy.env]`, all literal: the same
    /// on every node. The image's own (DeepEP V2's JIT cache and CUDA_HOME among them)
    /// come with the image, not from here.
    pub fn fixed_env(&self) -> Vec<(String, String)> {
        let d = self.deploy;
        let mut env = Vec::new();
        if d.network == Network::None {
            // One node: no remote transport to load (the default, ibrc, is not built).
            env.push(("NVSHMEM_REMOTE_TRANSPORT".into(), "none".into()));
        }
        if let Some(gid) = d.gid_index {
            env.push(("NVSHMEM_IB_GID_INDEX".into(), gid.to_string()));
            env.push(("NCCL_IB_GID_INDEX".into(), gid.to_string()));
        }
        if let Some(ifname) = &d.socket_ifname {
            env.push(("NCCL_SOCKET_IFNAME".into(), ifname.clone()));
            env.push(("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME".into(), ifname.clone()));
            env.push(("GLOO_SOCKET_IFNAME".into(), ifname.clone()));
        }
        env.extend(d.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// The gate's test script for one node (POSIX sh), after the bootstrap variables are
    /// set: the self-test across every node with one process per GPU (torchrun is the
    /// node's launcher; the seed comes from the image digest so every rank agrees), then
    /// DeepEP's own tests for this shape.
    pub fn gate_tests_script(&self) -> String {
        let d = self.deploy;
        let g = d.gpus_per_node;
        let (dir, tests): (&str, Vec<&str>) = match self.stack.deepep.api {
            DeepEpApi::V1 => (
                "tests",
                vec![
                    if d.nodes == 1 {
                        "test_intranode.py"
                    } else {
                        "test_internode.py"
                    },
                    "test_low_latency.py",
                ],
            ),
            DeepEpApi::V2 => (
                "tests",
                vec![
                    if d.nodes == 1 {
                        "legacy/test_intranode.py"
                    } else {
                        "legacy/test_internode.py"
                    },
                    "legacy/test_low_latency.py",
                    "elastic/test_ep.py",
                ],
            ),
        };
        let mut s = String::new();
        s.push_str("set -eu\n");
        s.push_str(&format!(
            "echo \"gate: self-test on node $NODE_RANK of $NNODES ({g} GPUs each)\"\n\
             torchrun --no-python --nnodes=\"$NNODES\" --nproc-per-node={g} --node-rank=\"$NODE_RANK\" \\\n  \
             --master-addr=\"$MASTER_ADDR\" --master-port=\"$MASTER_PORT\" \\\n  \
             {SELFTEST} --seed {} --timeout 900\n",
            self.image.seed()
        ));
        s.push_str(&format!(
            "if [ ! -d {DEEPEP_TESTS}/{dir} ]; then\n  echo \"gate: the image has no DeepEP tests at {DEEPEP_TESTS}/{dir}: it cannot prove DeepEP for this shape\" >&2\n  exit 1\nfi\ncd {DEEPEP_TESTS}\n"
        ));
        for t in tests {
            s.push_str(&format!(
                "echo \"gate: DeepEP {dir}/{t} on node $NODE_RANK\"\n{PYTHON} {dir}/{t} --num-processes {g}\n"
            ));
        }
        s.push_str("echo \"gate: node $NODE_RANK passed\"\n");
        s
    }
}
