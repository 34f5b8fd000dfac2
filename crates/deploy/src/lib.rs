//! commstack-deploy: the pushed image, by digest, onto Kubernetes (a JobSet gate, then a
//! LeaderWorkerSet serving group) or Slurm (an sbatch script, preflight first), from
//! stack.toml's `[deploy]`. The environment of what is rendered is checked by envlint
//! against the stack's own NVSHMEM source, NCCL's and DeepEP's tables; a render with a
//! finding is refused, and nothing is written.
//!
//! Layering: [`image_ref`] and [`shape`] below [`k8s`] and [`slurm`]; [`check`] lints
//! their output; [`locate`] finds the locked NVSHMEM source; [`write`] puts files in
//! place; [`run`] is the one call `cargo xtask deploy render` makes.

pub mod bench;
pub mod check;
pub mod image_ref;
pub mod k8s;
pub mod lint_files;
pub mod locate;
mod rendered;
pub mod shape;
pub mod slurm;
pub mod write;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_envlint::NvshmemTables;
use commstack_stack::{Lock, Stack};

pub use image_ref::ImageRef;
pub use rendered::Rendered;
pub use shape::Shape;

/// Where a deploy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    K8s,
    Slurm,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::K8s, Target::Slurm];

    pub fn as_str(self) -> &'static str {
        match self {
            Target::K8s => "k8s",
            Target::Slurm => "slurm",
        }
    }
}

/// Renders `target` for `stack`'s `[deploy]` and `image`, whose config's environment is
/// `image_env` ([`commstack_image::locked_image_env`] of the lock), and refuses it when
/// envlint finds anything in the environment it sets (NVSHMEM's variables from `nvshmem`).
pub fn render(
    target: Target,
    stack: &Stack,
    image: &ImageRef,
    image_env: &[String],
    nvshmem: &NvshmemTables,
) -> Result<Rendered> {
    let Some(deploy) = &stack.deploy else {
        bail!(
            "{} has no [deploy] section: add one (nodes, gpus-per-node, network, command; the default stack.toml has an example, docs/deploy.md explains each field)",
            stack.path().display()
        );
    };
    if deploy.ibgda_access != commstack_stack::deploy::IbgdaAccess::Driver
        && !stack.nvshmem.transports.get("ibgda")
    {
        let at = stack
            .locate("deploy.ibgda-access")
            .map(|l| format!("{l}: "))
            .unwrap_or_default();
        bail!(
            "{at}deploy.ibgda-access = {:?} grants privileges for IBGDA, but this stack's NVSHMEM is built without it ([nvshmem] ibgda = false): remove ibgda-access",
            deploy.ibgda_access.as_str()
        );
    }
    let shape = Shape {
        stack,
        deploy,
        image,
        image_env,
    };
    let rendered = match target {
        Target::K8s => k8s::render(&shape)?,
        Target::Slurm => slurm::render(&shape)?,
    };
    check::refuse_findings(&shape, nvshmem, &rendered)?;
    Ok(rendered)
}

/// Where the image comes from.
#[derive(Clone, Debug)]
pub enum ImageSource {
    /// `--image REF@sha256:...`.
    Reference(String),
    /// `--pushed FILE`: what `cargo xtask push` printed (plain or `--json`).
    PushOutput(PathBuf),
}

/// `cargo xtask deploy render`'s request.
pub struct RenderRequest {
    pub stack_path: PathBuf,
    pub lock_path: PathBuf,
    pub cache_dir: PathBuf,
    pub target: Target,
    pub image: ImageSource,
    /// Default: [`default_out_dir`].
    pub out: Option<PathBuf>,
    /// The NVSHMEM source to read variables from, instead of the locked one in the cache.
    pub nvshmem_source: Option<PathBuf>,
    /// ` --stack FILE` for the commands messages name.
    pub stack_flag: String,
}

/// What [`run`] wrote.
#[derive(Debug)]
pub struct RenderReport {
    pub out_dir: PathBuf,
    pub written: Vec<PathBuf>,
    pub image: ImageRef,
    pub nvshmem_source: PathBuf,
}

/// `deploy/<target>` beside the stack file (for the repository's stack.toml: `deploy/k8s`,
/// git-ignored).
pub fn default_out_dir(stack_path: &Path, target: Target) -> PathBuf {
    let dir = stack_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    dir.join("deploy").join(target.as_str())
}

/// Reads the stack and its lock (refusing a stale lock: the image's environment and the
/// NVSHMEM source come from it), finds the NVSHMEM source, renders, and writes the files.
pub fn run(req: &RenderRequest) -> Result<RenderReport> {
    let text = std::fs::read_to_string(&req.stack_path).with_context(|| {
        format!(
            "cannot read the stack manifest {} (pick one with --stack FILE)",
            req.stack_path.display()
        )
    })?;
    let stack = Stack::parse(&req.stack_path, &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    let image = match &req.image {
        ImageSource::Reference(r) => ImageRef::parse(r)?,
        ImageSource::PushOutput(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read push's output {}", path.display()))?;
            ImageRef::from_push_output(&text)
                .with_context(|| format!("the reference in {}", path.display()))?
        }
    };
    let lock = read_fresh_lock(&req.lock_path, &stack, &req.stack_flag)?;
    let image_env = commstack_image::locked_image_env(&lock)
        .with_context(|| format!("the image's environment from {}", req.lock_path.display()))?;
    let source = match &req.nvshmem_source {
        Some(path) => path.clone(),
        None => locate::locked_nvshmem_archive(&lock, &req.lock_path, &req.cache_dir)?,
    };
    let tables = commstack_envlint::source::read(&source)
        .with_context(|| format!("reading NVSHMEM's variables from {}", source.display()))?;
    let rendered = render(req.target, &stack, &image, &image_env, &tables)?;
    let out_dir = req
        .out
        .clone()
        .unwrap_or_else(|| default_out_dir(&req.stack_path, req.target));
    let written = write::write_all(&out_dir, &rendered)?;
    Ok(RenderReport {
        out_dir,
        written,
        image,
        nvshmem_source: source,
    })
}

/// The lock beside the stack, refused when it no longer matches the manifest.
pub fn read_fresh_lock(lock_path: &Path, stack: &Stack, stack_flag: &str) -> Result<Lock> {
    let text = std::fs::read_to_string(lock_path).with_context(|| {
        format!(
            "cannot read the lock {}: run `cargo xtask lock{stack_flag}` first",
            lock_path.display()
        )
    })?;
    let lock = Lock::parse(lock_path, &text)?;
    let stale = lock.staleness(stack);
    if !stale.is_empty() {
        bail!(
            "{} is stale, it no longer matches {}:\n  {}\nrun `cargo xtask lock{stack_flag}` to resolve it again",
            lock_path.display(),
            stack.path().display(),
            stale.join("\n  ")
        );
    }
    Ok(lock)
}
