//! The Slurm render: one sbatch script, one task per node holding the node's GPUs (and so
//! one PID namespace for its ranks), the image by digest through Slurm's own OCI container
//! support (`srun --container=BUNDLE`, the bundle made on each node by skopeo and umoci)
//! or pyxis' `--container-image`. The preflight runs first on every node; a failure stops
//! the job before the payload.

use anyhow::Result;
use commstack_stack::deploy::SlurmContainer;

use crate::rendered::Rendered;
use crate::shape::Shape;

pub const JOB_FILE: &str = "job.sbatch";

/// `text` as one shell word.
pub fn quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c))
    {
        return text.to_string();
    }
    format!("'{}'", text.replace('\'', "'\\''"))
}

fn words(args: &[&str]) -> String {
    args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ")
}

pub fn render(shape: &Shape) -> Result<Rendered> {
    Ok(Rendered {
        files: vec![(JOB_FILE.to_string(), script(shape))],
    })
}

fn script(shape: &Shape) -> String {
    let d = shape.deploy;
    let s = &d.slurm;
    let mut out = String::new();
    out.push_str("#!/bin/bash\n");
    out.push_str(&format!(
        "# Rendered by `cargo xtask deploy render --target slurm` from {} ([deploy]).\n# Submit with `sbatch {JOB_FILE}`. docs/deploy.md says what each step does.\n",
        shape.stack.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    out.push_str(&format!("#SBATCH --job-name={}\n", d.name));
    out.push_str(&format!("#SBATCH --nodes={}\n", d.nodes));
    // One task per node: it holds every GPU of the node, its launcher starts the ranks.
    out.push_str("#SBATCH --ntasks-per-node=1\n");
    out.push_str(&format!("#SBATCH --gpus-per-node={}\n", d.gpus_per_node));
    out.push_str("#SBATCH --exclusive\n");
    for (flag, value) in [
        ("partition", &s.partition),
        ("account", &s.account),
        ("time", &s.time),
    ] {
        if let Some(v) = value {
            out.push_str(&format!("#SBATCH --{flag}={v}\n"));
        }
    }
    out.push_str(&format!("#SBATCH --output={}-%j.out\n", d.name));
    out.push_str("set -euo pipefail\n\n");
    out.push_str(&format!("IMAGE={}\n", quote(&shape.image.to_string())));
    out.push_str(&bootstrap(shape));
    let container = match s.container {
        SlurmContainer::Oci => {
            out.push_str(&bundle_step(shape));
            "--container=\"$BUNDLE\"".to_string()
        }
        SlurmContainer::Pyxis => {
            // enroot's form: REGISTRY#REPO@sha256:... ; the name keeps one import for
            // every step of the job.
            out.push_str(&format!(
                "\n# 1. The image through pyxis (enroot imports it by digest once; the steps share it).\nPYXIS_IMAGE={}\n",
                quote(&format!("{}#{}@{}", shape.image.registry(), shape.image.path(), shape.image.digest()))
            ));
            format!(
                "--container-image=\"$PYXIS_IMAGE\" --container-name=commstack-{}",
                &shape.image.digest_hex[..12]
            )
        }
    };
    out.push_str(&format!(
        "\n# 2. The image's preflight on every node, before anything else runs there.\necho \"preflight on $SLURM_NNODES node(s)\"\nif ! srun --ntasks-per-node=1 --kill-on-bad-exit=1 {container} {}; then\n    echo \"the preflight failed on a node (its verdict is above): the payload does not run\" >&2\n    exit 1\nfi\n",
        words(&shape.preflight().iter().map(String::as_str).collect::<Vec<_>>())
    ));
    out.push_str(&payload_step(shape, &container));
    out
}

/// Step 3: the payload, one task per node, in a shell of the image that sets the node's
/// rank (and, in the OCI form, the image's own environment) and then execs `command`.
fn payload_step(shape: &Shape, container: &str) -> String {
    let mut inner = String::new();
    let note = match shape.deploy.slurm.container {
        SlurmContainer::Oci => {
            inner.push_str(&image_env(shape));
            "\n# Slurm's OCI containers get the job's environment, not the image's: the image's\n# own (PATH with its venv, VIRTUAL_ENV, PIP_CONSTRAINT, ...; for DeepEP V2 CUDA_HOME and\n# EP_JIT_CACHE_DIR) is set again first."
        }
        SlurmContainer::Pyxis => "",
    };
    inner.push_str(
        "export RANK=\"$SLURM_NODEID\" NODE_RANK=\"$SLURM_NODEID\" PET_NODE_RANK=\"$SLURM_NODEID\"\nexec \"$@\"",
    );
    let command: Vec<&str> = shape.deploy.command.iter().map(String::as_str).collect();
    format!(
        "\n# 3. The payload, one task per node; its node rank comes from SLURM_NODEID.{note}\nsrun --ntasks-per-node=1 --kill-on-bad-exit=1 {container} /bin/sh -c '\n{}' sh \\\n    {}\n",
        // The script is one single-quoted word.
        inner.replace('\'', "'\\''"),
        words(&command)
    )
}

/// `export K=V ...` lines of the image's environment (its Config.Env) and the image
/// user's HOME, for the payload's shell.
fn image_env(shape: &Shape) -> String {
    let mut vars: Vec<String> = shape
        .image_env
        .iter()
        .filter_map(|e| e.split_once('='))
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect();
    if let Some(image) = &shape.stack.image {
        vars.push(format!("HOME={}", quote(&format!("/home/{}", image.user))));
    }
    vars.iter().map(|v| format!("export {v}\n")).collect()
}

/// The bootstrap every task inherits (the container gets the job's environment), then
/// the fabric's and the user's variables.
fn bootstrap(shape: &Shape) -> String {
    let d = shape.deploy;
    let mut out = String::from(
        "\n# The bootstrap: the first node is the leader; WORLD_SIZE and RANK count nodes, as\n# DeepEP's launch scripts read them; torchrun takes the shape from PET_*.\nMASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\nexport MASTER_ADDR\n",
    );
    let lines = [
        ("MASTER_PORT", d.master_port.to_string()),
        ("NNODES", "$SLURM_NNODES".to_string()),
        ("WORLD_SIZE", "$SLURM_NNODES".to_string()),
        ("NPROC_PER_NODE", d.gpus_per_node.to_string()),
        ("PET_NNODES", "$SLURM_NNODES".to_string()),
        ("PET_NPROC_PER_NODE", d.gpus_per_node.to_string()),
        ("PET_MASTER_ADDR", "$MASTER_ADDR".to_string()),
        ("PET_MASTER_PORT", d.master_port.to_string()),
        (
            "COMMSTACK_RDZV_ADDR",
            format!("$MASTER_ADDR:{}", shape.rdzv_port()),
        ),
    ];
    for (k, v) in lines {
        out.push_str(&format!("export {k}=\"{v}\"\n"));
    }
    let fixed = shape.fixed_env();
    if !fixed.is_empty() {
        out.push_str("# The fabric's and stack.toml's [deploy.env].\n");
        for (k, v) in fixed {
            out.push_str(&format!("export {k}={}\n", quote(&v)));
        }
    }
    out
}

/// Step 1 of the OCI form: the bundle on every node, once per node and digest: skopeo
/// pulls the image by digest (it checks the manifest's sha256), umoci unpacks it, and
/// /dev/shm of the bundle's config is sized (runtime-spec's default is 64 MiB).
fn bundle_step(shape: &Shape) -> String {
    let d = shape.deploy;
    let shm_kib = d.shm_size.value / 1024;
    format!(
        r#"
# 1. The OCI bundle on every node (Slurm's oci.conf runs it, e.g. with crun): made once per
# node and image digest under the bundle directory, in a temporary directory renamed into
# place when whole; concurrent jobs on a node wait on its lock.
BUNDLE={bundle_dir}/{hex}
srun --ntasks-per-node=1 --kill-on-bad-exit=1 /bin/sh -c '
set -eu
bundle=$1 ref=$2
[ -f "$bundle/config.json" ] && exit 0
mkdir -p "$(dirname "$bundle")"
exec 9>"$bundle.lock"
flock 9
[ -f "$bundle/config.json" ] && exit 0
tmp=$(mktemp -d "$bundle.tmp.XXXXXX")
trap "rm -rf \"$tmp\"" EXIT
skopeo copy --quiet "docker://$ref" "oci:$tmp/layout:image"
rootless=; [ "$(id -u)" -eq 0 ] || rootless=--rootless
umoci unpack $rootless --image "$tmp/layout:image" "$tmp/bundle"
sed -i "s/\"size=65536k\"/\"size={shm_kib}k\"/g" "$tmp/bundle/config.json"
grep -q "\"size={shm_kib}k\"" "$tmp/bundle/config.json" || {{ echo "cannot size /dev/shm in $tmp/bundle/config.json" >&2; exit 1; }}
mv "$tmp/bundle" "$bundle"
' sh "$BUNDLE" "$IMAGE"
"#,
        bundle_dir = d.slurm.bundle_dir,
        hex = shape.image.digest_hex,
    )
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(quote("torchrun"), "torchrun");
        assert_eq!(quote("--seed=1"), "--seed=1");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
        assert_eq!(quote(""), "''");
    }
}
