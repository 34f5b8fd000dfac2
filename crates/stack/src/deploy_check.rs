//! `[deploy]` as written ([`crate::raw::RawDeploy`]) to the model ([`crate::deploy`]):
//! every problem reported with its place in stack.toml. A free function over the raw
//! section, so validation calls it without this file knowing validation's types.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use toml::Spanned;

use crate::deploy::*;
use crate::diag::Diagnostic;
use crate::raw::{RawDeploy, RawSlurm};

/// What checking `[deploy]` gives: the model when every field was right, the problems,
/// and the spans of the fields (`deploy.nodes`, `deploy.env.NAME`) for later messages.
pub(crate) struct Checked {
    pub(crate) deploy: Option<Deploy>,
    pub(crate) diags: Vec<Diagnostic>,
    pub(crate) spans: BTreeMap<String, Range<usize>>,
}

struct Checker<'a> {
    path: &'a Path,
    text: &'a str,
    diags: Vec<Diagnostic>,
    spans: BTreeMap<String, Range<usize>>,
}

pub(crate) fn check(path: &Path, text: &str, raw: RawDeploy) -> Checked {
    let mut c = Checker {
        path,
        text,
        diags: Vec::new(),
        spans: BTreeMap::new(),
    };
    let deploy = c.deploy(raw);
    let ok = c.diags.is_empty();
    Checked {
        deploy: deploy.filter(|_| ok),
        diags: c.diags,
        spans: c.spans,
    }
}

/// A DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`) of at most `max` characters.
fn dns_label(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A name a POSIX shell can `export` (and so one Slurm scripts and env files can carry).
pub fn env_name_ok(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The variables `deploy render` sets itself (the bootstrap of torch, NCCL, NVSHMEM and
/// DeepEP): `[deploy.env]` may not set them, or the wiring would be undone silently.
pub const RENDERED_ENV: &[&str] = &[
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "NNODES",
    "NODE_RANK",
    "NPROC_PER_NODE",
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "LWS_LEADER_ADDRESS",
    "LWS_GROUP_SIZE",
    "LWS_WORKER_INDEX",
    "COMMSTACK_RDZV_ADDR",
];

/// A Kubernetes quantity: a decimal number and an optional suffix (binary Ki..Ei, decimal
/// k..E, or `m` for thousandths when `milli`). Returns its whole value (rounded down).
pub fn parse_quantity(text: &str, milli: bool) -> Option<u128> {
    const SUFFIXES: &[(&str, u128, u128)] = &[
        ("Ki", 1 << 10, 1),
        ("Mi", 1 << 20, 1),
        ("Gi", 1 << 30, 1),
        ("Ti", 1 << 40, 1),
        ("Pi", 1 << 50, 1),
        ("Ei", 1 << 60, 1),
        ("k", 1_000, 1),
        ("M", 1_000_000, 1),
        ("G", 1_000_000_000, 1),
        ("T", 1_000_000_000_000, 1),
        ("P", 1_000_000_000_000_000, 1),
        ("E", 1_000_000_000_000_000_000, 1),
        ("m", 1, 1000),
        ("", 1, 1),
    ];
    let (number, mul, div) = SUFFIXES.iter().find_map(|(s, mul, div)| {
        let n = text.strip_suffix(s)?;
        (n.ends_with(|c: char| c.is_ascii_digit() || c == '.')).then_some((n, *mul, *div))
    })?;
    if div != 1 && !milli {
        return None;
    }
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty()
        || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit())
        || int.len() + frac.len() > 24
    {
        return None;
    }
    let digits: u128 = format!("{int}{frac}").parse().ok()?;
    let scale = 10u128.pow(frac.len() as u32);
    Some(digits.checked_mul(mul)? / scale / div)
}

impl Checker<'_> {
    fn err<T>(&mut self, value: &Spanned<T>, message: String, hint: &str) {
        let mut d = Diagnostic::at(self.path, self.text, value.span(), message);
        if !hint.is_empty() {
            d.hint = Some(hint.to_string());
        }
        self.diags.push(d);
    }

    fn span<T>(&mut self, field: &str, value: &Spanned<T>) {
        self.spans.insert(field.to_string(), value.span());
    }

    /// An integer field within `range`, or `default` when absent.
    fn int(
        &mut self,
        field: &str,
        value: Option<&Spanned<i64>>,
        range: std::ops::RangeInclusive<i64>,
        default: i64,
        hint: &str,
    ) -> Option<i64> {
        let Some(v) = value else {
            return Some(default);
        };
        self.span(field, v);
        if range.contains(v.get_ref()) {
            Some(*v.get_ref())
        } else {
            self.err(
                v,
                format!(
                    "{field} must be from {} to {}, got {}",
                    range.start(),
                    range.end(),
                    v.get_ref()
                ),
                hint,
            );
            None
        }
    }

    /// One of `choices` (as written in stack.toml), or the first when absent.
    fn choice<T: Copy>(
        &mut self,
        field: &str,
        value: Option<&Spanned<String>>,
        choices: &[(&str, T)],
        hint: &str,
    ) -> Option<T> {
        let Some(v) = value else {
            return Some(choices[0].1);
        };
        self.span(field, v);
        match choices.iter().find(|(name, _)| name == v.get_ref()) {
            Some((_, t)) => Some(*t),
            None => {
                let names: Vec<String> = choices.iter().map(|(n, _)| format!("{n:?}")).collect();
                self.err(
                    v,
                    format!(
                        "{field} must be one of {}, got {:?}",
                        names.join(", "),
                        v.get_ref()
                    ),
                    hint,
                );
                None
            }
        }
    }

    fn quantity(
        &mut self,
        field: &str,
        value: Option<&Spanned<String>>,
        milli: bool,
    ) -> Result<Option<Quantity>, ()> {
        let Some(v) = value else { return Ok(None) };
        self.span(field, v);
        match parse_quantity(v.get_ref(), milli) {
            Some(n) if n > 0 => Ok(Some(Quantity {
                text: v.get_ref().clone(),
                value: n,
            })),
            _ => {
                let example = if milli {
                    "\"16\" or \"500m\""
                } else {
                    "\"32Gi\" or \"512Mi\""
                };
                self.err(
                    v,
                    format!("{field}: {:?} is not a positive Kubernetes quantity", v.get_ref()),
                    &format!("a number with an optional suffix (Ki, Mi, Gi, Ti or k, M, G, T), e.g. {example}"),
                );
                Err(())
            }
        }
    }

    fn deploy(&mut self, raw: RawDeploy) -> Option<Deploy> {
        let name = self.label(
            "deploy.name",
            raw.name.as_ref(),
            DEFAULT_DEPLOY_NAME,
            MAX_DEPLOY_NAME,
        );
        let namespace = self.label(
            "deploy.namespace",
            raw.namespace.as_ref(),
            DEFAULT_NAMESPACE,
            63,
        );
        let nodes = self.int(
            "deploy.nodes",
            Some(&raw.nodes),
            1..=1024,
            1,
            "nodes of one serving group, one pod (Kubernetes) or task (Slurm) each",
        );
        let gpus = self.int("deploy.gpus-per-node", Some(&raw.gpus_per_node), 1..=16, 8, "the GPUs of each node, all held by its one pod: DeepEP V2's local ranks share memory through pidfd_getfd, so they must share one PID namespace");
        let replicas = self.int(
            "deploy.replicas",
            raw.replicas.as_ref(),
            1..=1000,
            1,
            "serving groups (the LeaderWorkerSet's replicas)",
        );
        let master_port = self.int(
            "deploy.master-port",
            raw.master_port.as_ref(),
            1024..=65535,
            DEFAULT_MASTER_PORT.into(),
            "",
        );
        let deadline = self.int(
            "deploy.gate-deadline-seconds",
            raw.gate_deadline_seconds.as_ref(),
            60..=86_400,
            DEFAULT_GATE_DEADLINE_SECONDS.into(),
            "how long each Job of the gate may run before it is stopped",
        );
        let network = self.choice(
            "deploy.network",
            Some(&raw.network),
            &[("infiniband", Network::Infiniband), ("roce", Network::Roce), ("none", Network::None)],
            "the fabric between the nodes: \"infiniband\", \"roce\", or \"none\" (one node, no RDMA)",
        );
        let network_and_rdma = self.network(&raw, network, nodes);
        let command = self.command(&raw.command);
        let env = self.env(&raw.env);
        let node_selector = self.node_selector(&raw.node_selector);
        let sizes = self.sizes(&raw);
        let policies = self.policies(&raw);
        let slurm = self.slurm(&raw.slurm);
        for (field, v) in [
            ("deploy.run-as-root", &raw.run_as_root),
            ("deploy.host-network", &raw.host_network),
        ] {
            if let Some(v) = v {
                self.span(field, v);
            }
        }
        let (network, rdma_resource, rdma_per_node, gid_index, socket_ifname) = network_and_rdma?;
        let (shm, cpu, memory, ephemeral) = sizes?;
        let (ibgda_access, restart_policy, pull_secret) = policies?;
        Some(Deploy {
            name: name?,
            namespace: namespace?,
            nodes: nodes? as u32,
            gpus_per_node: gpus? as u32,
            replicas: replicas? as u32,
            network,
            rdma_resource,
            rdma_per_node,
            gid_index,
            socket_ifname,
            command: command?,
            env: env?,
            shm_size: shm,
            ibgda_access,
            run_as_root: raw.run_as_root.is_some_and(|v| *v.get_ref()),
            host_network: raw.host_network.is_some_and(|v| *v.get_ref()),
            node_selector: node_selector?,
            image_pull_secret: pull_secret,
            cpu,
            memory,
            ephemeral_storage: ephemeral,
            restart_policy,
            master_port: master_port? as u16,
            gate_deadline_seconds: deadline? as u32,
            slurm: slurm?,
        })
    }

    /// `/dev/shm` and the resource requests, each a Kubernetes quantity.
    #[allow(clippy::type_complexity)]
    fn sizes(
        &mut self,
        raw: &RawDeploy,
    ) -> Option<(
        Quantity,
        Option<Quantity>,
        Option<Quantity>,
        Option<Quantity>,
    )> {
        let shm = match raw.shm_size.as_ref() {
            Some(_) => self
                .quantity("deploy.shm-size", raw.shm_size.as_ref(), false)
                .ok()
                .flatten(),
            None => Some(Quantity {
                text: DEFAULT_SHM_SIZE.into(),
                value: parse_quantity(DEFAULT_SHM_SIZE, false).expect("the default parses"),
            }),
        };
        let cpu = self.quantity("deploy.cpu", raw.cpu.as_ref(), true);
        let memory = self.quantity("deploy.memory", raw.memory.as_ref(), false);
        let ephemeral = self.quantity(
            "deploy.ephemeral-storage",
            raw.ephemeral_storage.as_ref(),
            false,
        );
        Some((shm?, cpu.ok()?, memory.ok()?, ephemeral.ok()?))
    }

    /// IBGDA's privileges, the group's restart policy and the pull secret.
    fn policies(&mut self, raw: &RawDeploy) -> Option<(IbgdaAccess, GroupRestart, Option<String>)> {
        let ibgda_access = self.choice(
            "deploy.ibgda-access",
            raw.ibgda_access.as_ref(),
            &[("driver", IbgdaAccess::Driver), ("sys-rawio", IbgdaAccess::SysRawio), ("privileged", IbgdaAccess::Privileged)],
            "\"driver\": the nodes' driver has PeerMappingOverride=1; \"sys-rawio\" adds CAP_SYS_RAWIO; \"privileged\" runs the container privileged (what IBGDA needs without PeerMappingOverride)",
        );
        let restart_policy = self.choice(
            "deploy.restart-policy",
            raw.restart_policy.as_ref(),
            &[
                (
                    "recreate-group-after-start",
                    GroupRestart::RecreateGroupAfterStart,
                ),
                (
                    "recreate-group-on-pod-restart",
                    GroupRestart::RecreateGroupOnPodRestart,
                ),
                ("none", GroupRestart::None),
            ],
            "the LeaderWorkerSet's restartPolicy; docs/deploy.md says what each does",
        );
        let mut pull_secret_ok = true;
        let pull_secret = raw.image_pull_secret.as_ref().map(|s| {
            self.span("deploy.image-pull-secret", s);
            if !s.get_ref().split('.').all(|p| dns_label(p, 63)) || s.get_ref().len() > 253 {
                self.err(
                    s,
                    format!(
                        "deploy.image-pull-secret {:?} is not a Secret name",
                        s.get_ref()
                    ),
                    "the name of a kubernetes.io/dockerconfigjson Secret in the namespace",
                );
                pull_secret_ok = false;
            }
            s.get_ref().clone()
        });
        if !pull_secret_ok {
            return None;
        }
        Some((ibgda_access?, restart_policy?, pull_secret))
    }

    fn label(
        &mut self,
        field: &str,
        value: Option<&Spanned<String>>,
        default: &str,
        max: usize,
    ) -> Option<String> {
        let Some(v) = value else {
            return Some(default.to_string());
        };
        self.span(field, v);
        if dns_label(v.get_ref(), max) {
            Some(v.get_ref().clone())
        } else {
            self.err(
                v,
                format!(
                    "{field} {:?} is not a DNS label of at most {max} characters",
                    v.get_ref()
                ),
                "lowercase letters, digits and '-', starting and ending with a letter or digit",
            );
            None
        }
    }

    /// `network`, `rdma-resource`, `rdma-per-node`, `gid-index`, `socket-ifname` together:
    /// each depends on the fabric.
    #[allow(clippy::type_complexity)]
    fn network(
        &mut self,
        raw: &RawDeploy,
        network: Option<Network>,
        nodes: Option<i64>,
    ) -> Option<(Network, Option<String>, u32, Option<u32>, Option<String>)> {
        let per_node = self.int("deploy.rdma-per-node", raw.rdma_per_node.as_ref(), 1..=64, 1, "devices of the RDMA resource each pod requests (one per NIC where the device plugin exposes each NIC)");
        let gid = match &raw.gid_index {
            None => Some(None),
            Some(g) => self
                .int(
                    "deploy.gid-index",
                    Some(g),
                    0..=255,
                    0,
                    "the RoCE GID index of the NICs (`show_gids` lists them)",
                )
                .map(|g| Some(g as u32)),
        };
        let ifname = match &raw.socket_ifname {
            None => Some(None),
            Some(i) => {
                self.span("deploy.socket-ifname", i);
                let ok = (1..=15).contains(&i.get_ref().len())
                    && i.get_ref()
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                if ok {
                    Some(Some(i.get_ref().clone()))
                } else {
                    self.err(
                        i,
                        format!(
                            "deploy.socket-ifname {:?} is not a network interface name",
                            i.get_ref()
                        ),
                        "e.g. \"eth0\" (the pod's interface) or \"bond0\" with host-network",
                    );
                    None
                }
            }
        };
        let resource = match &raw.rdma_resource {
            None => None,
            Some(r) => {
                self.span("deploy.rdma-resource", r);
                let ok = r.get_ref().split_once('/').is_some_and(|(domain, name)| {
                    !domain.is_empty()
                        && domain.split('.').all(|p| dns_label(p, 63))
                        && !name.is_empty()
                        && name.len() <= 63
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                });
                if !ok {
                    self.err(r, format!("deploy.rdma-resource {:?} is not an extended resource name", r.get_ref()), "DOMAIN/NAME as the RDMA device plugin registers it, e.g. \"rdma/ib\" or \"rdma/roce_gdr\"");
                    return None;
                }
                Some(r.get_ref().clone())
            }
        };
        let network = network?;
        match (network, &resource) {
            (Network::None, Some(_)) => {
                let r = raw.rdma_resource.as_ref().expect("a resource was written");
                self.err(
                    r,
                    "deploy.rdma-resource is set but deploy.network is \"none\"".into(),
                    "remove it, or set network to \"infiniband\" or \"roce\"",
                );
                return None;
            }
            (Network::Infiniband | Network::Roce, None) => {
                self.err(&raw.network, format!("deploy.network = {:?} needs deploy.rdma-resource", network.as_str()), "the RDMA device plugin's resource, e.g. rdma-resource = \"rdma/ib\" (InfiniBand) or \"rdma/roce_gdr\" (RoCE)");
                return None;
            }
            _ => {}
        }
        if network == Network::None && nodes.is_some_and(|n| n > 1) {
            self.err(&raw.nodes, format!("deploy.nodes = {} needs RDMA between the nodes, but deploy.network is \"none\"", nodes.unwrap_or_default()), "DeepEP's internode kernels and NVSHMEM's IBGDA need RDMA: set network to \"infiniband\" or \"roce\" with rdma-resource, or deploy one node");
            return None;
        }
        if let (Some(Some(_)), Some(g)) = (&gid, &raw.gid_index)
            && network != Network::Roce
        {
            self.err(
                g,
                format!(
                    "deploy.gid-index is for RoCE, but deploy.network is {:?}",
                    network.as_str()
                ),
                "InfiniBand needs no GID index: remove it",
            );
            return None;
        }
        Some((network, resource, per_node? as u32, gid?, ifname?))
    }

    fn command(&mut self, raw: &Spanned<Vec<Spanned<String>>>) -> Option<Vec<String>> {
        self.span("deploy.command", raw);
        if raw.get_ref().is_empty() || raw.get_ref()[0].get_ref().trim().is_empty() {
            self.err(raw, "deploy.command is empty".into(), "the payload as an argv, e.g. [\"python3\", \"-m\", \"sglang.launch_server\", \"--model-path\", \"/models/m\"]");
            return None;
        }
        let mut ok = true;
        for arg in raw.get_ref() {
            if arg.get_ref().contains('\0') {
                self.err(
                    arg,
                    "deploy.command: an argument holds a NUL byte".into(),
                    "",
                );
                ok = false;
            }
        }
        ok.then(|| raw.get_ref().iter().map(|a| a.get_ref().clone()).collect())
    }

    fn env(
        &mut self,
        raw: &BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    ) -> Option<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        let mut ok = true;
        for (key, value) in raw {
            let name = key.get_ref();
            self.spans.insert(format!("deploy.env.{name}"), key.span());
            if !env_name_ok(name) {
                self.err(
                    key,
                    format!("deploy.env: {name:?} is not an environment variable name"),
                    "letters, digits and '_', not starting with a digit",
                );
                ok = false;
                continue;
            }
            if RENDERED_ENV.contains(&name.as_str()) {
                self.err(key, format!("deploy.env: {name} is set by `deploy render` itself (the bootstrap of torch, NCCL, NVSHMEM and DeepEP)"), "remove it: docs/deploy.md lists what is set and from what (deploy.master-port sets the port)");
                ok = false;
                continue;
            }
            let text = match value.get_ref() {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                _ => {
                    self.err(
                        value,
                        format!("deploy.env.{name} must be a string, an integer or a boolean"),
                        "environment values are text: quote it",
                    );
                    ok = false;
                    continue;
                }
            };
            if text.contains('\0') {
                self.err(value, format!("deploy.env.{name} holds a NUL byte"), "");
                ok = false;
                continue;
            }
            out.insert(name.clone(), text);
        }
        ok.then_some(out)
    }

    fn node_selector(
        &mut self,
        raw: &BTreeMap<Spanned<String>, Spanned<String>>,
    ) -> Option<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        let mut ok = true;
        for (key, value) in raw {
            let k = key.get_ref();
            // A label key: an optional DNS-subdomain prefix and '/', then a name of at most
            // 63 characters; a value of at most 63 characters of the same alphabet.
            let name_ok = |n: &str| {
                n.len() <= 63
                    && n.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && n.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            };
            let key_ok = match k.split_once('/') {
                Some((prefix, name)) => {
                    prefix.split('.').all(|p| dns_label(p, 63)) && name_ok(name)
                }
                None => name_ok(k),
            };
            let v = value.get_ref();
            if !key_ok || !(v.is_empty() || name_ok(v)) {
                self.err(key, format!("deploy.node-selector: {k:?} = {v:?} is not a node label"), "label keys are [PREFIX/]NAME and values at most 63 letters, digits, '-', '_' and '.', e.g. \"nvidia.com/gpu.product\" = \"NVIDIA-H200\"");
                ok = false;
            }
            out.insert(k.clone(), v.clone());
        }
        ok.then_some(out)
    }

    fn slurm(&mut self, raw: &RawSlurm) -> Option<Slurm> {
        let container = self.choice(
            "deploy.slurm.container",
            raw.container.as_ref(),
            &[("oci", SlurmContainer::Oci), ("pyxis", SlurmContainer::Pyxis)],
            "\"oci\": Slurm's own OCI container support (oci.conf, a bundle made with umoci); \"pyxis\": the pyxis plugin's --container-image",
        );
        let mut ok = true;
        let mut word = |c: &mut Self,
                        field: &str,
                        v: &Option<Spanned<String>>,
                        allowed: &str|
         -> Option<String> {
            let v = v.as_ref()?;
            c.span(field, v);
            let good = !v.get_ref().is_empty()
                && v.get_ref()
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || allowed.contains(ch));
            if !good {
                c.err(
                    v,
                    format!(
                        "{field} {:?} has characters an #SBATCH line cannot carry",
                        v.get_ref()
                    ),
                    "letters, digits and the punctuation Slurm uses for it",
                );
                ok = false;
            }
            Some(v.get_ref().clone())
        };
        let partition = word(self, "deploy.slurm.partition", &raw.partition, "_-.,");
        let account = word(self, "deploy.slurm.account", &raw.account, "_-.");
        let time = word(self, "deploy.slurm.time", &raw.time, ":-");
        let bundle_dir = word(self, "deploy.slurm.bundle-dir", &raw.bundle_dir, "/_-.");
        if let (Some(dir), Some(v)) = (&bundle_dir, &raw.bundle_dir)
            && !dir.starts_with('/')
        {
            self.err(
                v,
                format!("deploy.slurm.bundle-dir {dir:?} is not an absolute path"),
                "a directory on each node's local disk, e.g. \"/var/tmp/commstack-bundles\"",
            );
            ok = false;
        }
        if !ok {
            return None;
        }
        Some(Slurm {
            container: container?,
            partition,
            account,
            time,
            bundle_dir: bundle_dir.unwrap_or_else(|| DEFAULT_BUNDLE_DIR.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_follow_kubernetes_form() {
        assert_eq!(parse_quantity("32Gi", false), Some(32 << 30));
        assert_eq!(parse_quantity("1.5Gi", false), Some(3 << 29));
        assert_eq!(parse_quantity("500m", true), Some(0));
        assert_eq!(parse_quantity("16", true), Some(16));
        assert_eq!(parse_quantity("2k", false), Some(2000));
        for bad in ["", "Gi", "32GB", "-1Gi", "1.2.3", "500m", "1 Gi", "0x10"] {
            assert_eq!(parse_quantity(bad, false), None, "{bad}");
        }
    }
}
