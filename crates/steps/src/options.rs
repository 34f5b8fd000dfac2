//! What the commands are asked to do, as plain structs: xtask parses its command line
//! into these (clap lives there only, with each flag's help), tests and benchmarks fill
//! them in directly, and [`crate::settings::Settings`] resolves them once against the
//! stack and its lock. Each field is the flag of the same name.

use std::path::PathBuf;

use commstack_stack::CudaArch;

use crate::graph::StepId;

/// What every command shares: `--stack`, `--home`, `--quiet`.
#[derive(Clone, Debug, Default)]
pub struct GlobalOptions {
    /// None: stack.toml here or in the nearest parent that has one.
    pub stack: Option<PathBuf>,
    /// None: $XDG_CACHE_HOME/commstack.
    pub home: Option<PathBuf>,
    pub quiet: bool,
}

/// The settings of every build command (the whole graph and each target). The fields
/// without a flag of `build` are set by one target's own flags.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    pub force: bool,
    /// None: the CPU count.
    pub jobs: Option<usize>,
    /// `build nvshmem --source` / `build deepep --source`: a tree instead of the locked one.
    pub source: Option<PathBuf>,
    pub fetch: SourceFetch,
    /// `--with KEY=PREFIX`: install prefixes of the packages enabled transports build against.
    pub with: Vec<(String, PathBuf)>,
    pub toolchain: ToolchainChoice,
    /// Empty: stack.toml's nvshmem.cuda-archs.
    pub cuda_archs: Vec<CudaArch>,
    pub no_ibgda: bool,
    pub static_lib: bool,
    /// None: this system's rdma-core.
    pub rdma_core: Option<PathBuf>,
    /// `--keep-env NAME`: environment variables NVSHMEM's build keeps.
    pub keep_env: Vec<String>,
    /// `build nvshmem --torch-pin`; None: the lock's.
    pub torch_pin: Option<String>,
    pub allow_version_mismatch: bool,
    /// `build nvshmem --compare-with WHEEL`.
    pub compare_with: Option<PathBuf>,
    /// `build kernels --nvshmem-from`: `stack`, `nvidia-wheel` or a prefix.
    pub nvshmem_from: String,
    /// `build kernels --test`.
    pub test: bool,
    /// None: python3 on PATH.
    pub python3: Option<PathBuf>,
    /// `build nvshmem --configure-only DIR`.
    pub configure_only: Option<PathBuf>,
    pub deepep: DeepepOptions,
}

/// Where a locked source comes from when it is not in the cache yet.
#[derive(Clone, Debug, Default)]
pub struct SourceFetch {
    pub mirror: Vec<String>,
    pub offline: bool,
    pub accept_tree_match: bool,
}

/// Where the build toolchain comes from: this machine's CUDA (`system`), a wheel
/// directory, or (neither) the lock's toolchain wheels from the cache.
#[derive(Clone, Debug, Default)]
pub struct ToolchainChoice {
    pub system: bool,
    /// The CUDA toolkit for `system`.
    pub cuda_home: PathBuf,
    pub wheels: Option<PathBuf>,
}

/// What only `build deepep` reads.
#[derive(Clone, Debug, Default)]
pub struct DeepepOptions {
    /// Adopt mode: this environment and its torch (None: a venv made from the lock).
    pub python: Option<PathBuf>,
    /// Managed mode: the interpreter the venv is made from.
    pub base_python: Option<PathBuf>,
    /// An NVSHMEM build step or install prefix (None: the store's build of the stack's).
    pub nvshmem: Option<PathBuf>,
    pub nvshmem_wheel: Option<PathBuf>,
    pub nccl_dir: Option<PathBuf>,
    pub allow_second_nccl: bool,
}

/// The whole graph's own settings (`build` without a target, and `build image`).
#[derive(Clone, Debug, Default)]
pub struct GraphOptions {
    pub locked: bool,
    pub dry_run: bool,
    pub until: Option<StepId>,
    pub only: Option<StepId>,
    pub json: bool,
    pub gpus: bool,
    pub oci: Option<PathBuf>,
    pub context: Option<PathBuf>,
    pub check: bool,
    /// Write the timings page (timings.html) beside summary.json.
    pub timings: bool,
    pub cache: CacheOptions,
}

/// The binary cache (`build` and `push`).
#[derive(Clone, Debug, Default)]
pub struct CacheOptions {
    /// None: stack.toml's [cache] registry.
    pub substitute: Option<String>,
    pub no_substitute: bool,
    pub allow_unsigned: bool,
    pub ca_file: Option<PathBuf>,
}

/// What `fetch` and `mirror export` fetch, and how.
#[derive(Clone, Debug)]
pub struct FetchRequest {
    pub mirror: Vec<String>,
    pub offline: bool,
    /// Downloads at once.
    pub jobs: usize,
    pub retries: u32,
    pub accept_tree_match: bool,
    /// Hash every cached file before trusting it.
    pub verify: bool,
    /// A JSON list of artifacts instead of the lock's.
    pub artifacts: Option<PathBuf>,
    /// Empty: every part of the lock.
    pub only: Vec<Part>,
}

/// A part of the lock, by the role its artifacts play.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Sources,
    Toolchain,
    Wheels,
    Replaced,
    /// The Debian packages of the image's base.
    Debs,
}

impl Part {
    pub const ALL: [Part; 5] = [
        Part::Sources,
        Part::Toolchain,
        Part::Wheels,
        Part::Replaced,
        Part::Debs,
    ];

    /// The name on the command line (`sources`, `toolchain`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Part::Sources => "sources",
            Part::Toolchain => "toolchain",
            Part::Wheels => "wheels",
            Part::Replaced => "replaced",
            Part::Debs => "debs",
        }
    }

    /// What the part holds, where its name does not say it (`--help`).
    pub fn about(self) -> Option<&'static str> {
        match self {
            Part::Debs => Some("The Debian packages of the image's base"),
            _ => None,
        }
    }
}
