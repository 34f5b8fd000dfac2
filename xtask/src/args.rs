//! The command line's shared flags (clap) and the plain options of commstack-pipeline
//! they parse into: clap lives here, in the CLI, and nowhere below it.

use std::path::PathBuf;

use commstack_stack::CudaArch;
use commstack_steps::graph::StepId;
use commstack_steps::options::Part;
use commstack_steps::options::{
    BuildOptions, CacheOptions, DeepepOptions, FetchRequest, GlobalOptions, GraphOptions,
    SourceFetch, ToolchainChoice,
};

#[derive(clap::Args)]
pub struct GlobalArgs {
    /// The stack manifest to use; its lock is the file beside it with the `.lock` extension.
    /// Default: stack.toml in the current directory or the nearest parent that has one
    /// (the way cargo finds Cargo.toml), so commands work from any subdirectory.
    #[arg(long, global = true, env = "COMMSTACK_STACK")]
    pub stack: Option<PathBuf>,
    /// Where commstack keeps its download cache and step store.
    /// Default: $XDG_CACHE_HOME/commstack (usually ~/.cache/commstack).
    #[arg(long, global = true, env = "COMMSTACK_HOME")]
    pub home: Option<PathBuf>,
    /// Print less: no progress bars, only results and errors.
    #[arg(long, short, global = true)]
    pub quiet: bool,
}

/// The settings every build command takes from its command line (the whole graph and each
/// target); the fields marked `skip` are set by one target's own flags.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct BuildArgs {
    /// Build again even if the store has the result (every step of the selection; the
    /// base is the exception: remove its step, `cargo xtask store gc`, to make it again).
    #[arg(long)]
    pub force: bool,
    /// Parallel compile jobs (default: the CPU count).
    #[arg(long, short)]
    pub jobs: Option<usize>,
    #[arg(skip)]
    pub source: Option<PathBuf>,
    /// Where the locked source comes from when it is not in the cache yet.
    #[command(flatten)]
    pub fetch: SourceFetchArgs,
    /// The install prefix of a package an enabled transport builds against, e.g.
    /// `--with ucx=/opt/ucx` (for nvshmem.ucx = true in stack.toml). Repeatable.
    #[arg(long, value_name = "KEY=PREFIX", value_parser = parse_with)]
    pub with: Vec<(String, PathBuf)>,
    #[command(flatten)]
    pub toolchain: ToolchainArgs,
    /// CMAKE_CUDA_ARCHITECTURES entries (`90`, `90a`, `100f`, `90-real`: stack.toml's
    /// grammar), overriding stack.toml's nvshmem.cuda-archs.
    #[arg(long, value_delimiter = ',', value_name = "ARCH,...")]
    pub cuda_archs: Vec<CudaArch>,
    /// Build without IBGDA, overriding stack.toml (no rdma-core needed; no internode
    /// DeepEP kernels).
    #[arg(long)]
    pub no_ibgda: bool,
    /// Also build libnvshmem.a, nvshmem-info and the CMake package with NVSHMEM's own
    /// install rules, overriding stack.toml's nvshmem.static-lib (about a third more
    /// compile work; NVIDIA's wheel ships none of them).
    #[arg(long)]
    pub static_lib: bool,
    /// Where rdma-core's headers and libmlx5 are (`/`, or a `dpkg -x` tree of
    /// libibverbs-dev + ibverbs-providers). Default: this system.
    #[arg(long, value_name = "DIR")]
    pub rdma_core: Option<PathBuf>,
    /// An environment variable to keep for the build (e.g. NVSHMEM_DISABLE_NVLS);
    /// variables NVSHMEM's CMake reads as option defaults are refused.
    #[arg(long = "keep-env", value_name = "NAME")]
    pub keep_env: Vec<String>,
    #[arg(skip)]
    pub torch_pin: Option<String>,
    /// Ship another NVSHMEM version under torch's pinned version (see the error it lifts).
    #[arg(long)]
    pub allow_version_mismatch: bool,
    #[arg(skip)]
    pub compare_with: Option<PathBuf>,
    #[arg(skip)]
    pub nvshmem_from: String,
    #[arg(skip)]
    pub test: bool,
    /// The Python interpreter NVSHMEM's CMake requires (default: python3 on PATH).
    #[arg(long)]
    pub python3: Option<PathBuf>,
    #[arg(skip)]
    pub configure_only: Option<PathBuf>,
    #[arg(skip)]
    pub deepep: DeepepArgs,
}

/// `build nvshmem`: NVSHMEM from source with NVSHMEM_USE_NCCL=OFF, proven, and its
/// drop-in wheel.
#[derive(clap::Args)]
pub struct NvshmemTarget {
    #[command(flatten)]
    pub build: BuildArgs,
    /// An unpacked source tree to build instead of the locked one (development only: its
    /// tree hash keys the build, and the output says it is an override).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// The NVSHMEM version torch pins (default: from stack.lock, else the source's).
    #[arg(long)]
    pub torch_pin: Option<String>,
    /// NVIDIA's wheel of the same version: compare ours with it file by file; fail on
    /// unexplained differences.
    #[arg(long, value_name = "WHEEL")]
    pub compare_with: Option<PathBuf>,
    /// Only run CMake's configure step in DIR (not the store) and print the NVSHMEM
    /// options CMake ended up with: checks the option mapping against a source in seconds.
    #[arg(long, value_name = "DIR")]
    pub configure_only: Option<PathBuf>,
}

impl NvshmemTarget {
    pub fn into_options(self) -> BuildOptions {
        BuildOptions {
            source: self.source,
            torch_pin: self.torch_pin,
            compare_with: self.compare_with,
            configure_only: self.configure_only,
            ..self.build.into()
        }
    }
}

/// `build kernels`: the NVSHMEM self-test (commstack-selftest), compiled with the
/// toolchain's nvcc.
#[derive(clap::Args)]
pub struct KernelsTarget {
    #[command(flatten)]
    pub build: BuildArgs,
    /// The NVSHMEM to compile against: `stack` (the stack's own build, made or found in
    /// the store), `nvidia-wheel` (NVIDIA's wheel of torch's pin, from the cache: enough
    /// to compile and test on a CPU machine), or an install PREFIX.
    #[arg(
        long,
        value_name = "stack|nvidia-wheel|PREFIX",
        default_value = "stack"
    )]
    pub nvshmem_from: String,
    /// Run the crate's tests (debug build) and clippy (warnings as errors) with that
    /// environment instead of building the release binary.
    #[arg(long)]
    pub test: bool,
}

impl KernelsTarget {
    pub fn into_options(self) -> BuildOptions {
        BuildOptions {
            nvshmem_from: self.nvshmem_from,
            test: self.test,
            ..self.build.into()
        }
    }
}

/// `build deepep`: DeepEP into a wheel and the wheelhouse (managed venv, or --python
/// PATH to adopt).
#[derive(clap::Args)]
pub struct DeepepTarget {
    #[command(flatten)]
    pub build: BuildArgs,
    /// A DeepEP source (directory or archive) to build instead of the locked one
    /// (development only: it is hashed and compared with the lock, and the output says so).
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub deepep: DeepepArgs,
}

impl DeepepTarget {
    pub fn into_options(self) -> BuildOptions {
        BuildOptions {
            source: self.source,
            deepep: self.deepep.into(),
            ..self.build.into()
        }
    }
}

/// Mirrors and trust flags for fetching a locked source (see `cargo xtask fetch --help`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SourceFetchArgs {
    /// A mirror directory or URL tried before upstream. Repeatable.
    #[arg(long, value_name = "DIR|URL")]
    pub mirror: Vec<String>,
    /// Open no network connection.
    #[arg(long)]
    pub offline: bool,
    /// Accept an archive whose tree hash equals the lock's although its sha256 differs
    /// (recorded with its own sha256; later runs use it without the flag).
    #[arg(long)]
    pub accept_tree_match: bool,
}

fn parse_with(s: &str) -> Result<(String, PathBuf), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=PREFIX"))?;
    Ok((k.to_string(), PathBuf::from(v)))
}

/// Where the build toolchain comes from (shared by `toolchain` and `build`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ToolchainArgs {
    /// Use the CUDA toolkit installed here and cmake/ninja from PATH (no wheels, no
    /// network; e.g. the GPU machine). Recorded as "system" in every report.
    #[arg(long, conflicts_with = "wheels")]
    pub system: bool,
    /// The installed CUDA toolkit for --system.
    #[arg(long, default_value = "/usr/local/cuda", requires = "system")]
    pub cuda_home: PathBuf,
    /// Provision from the toolchain wheels in DIR (nvidia-cuda-nvcc, -runtime, -crt,
    /// nvidia-nvvm, nvidia-cuda-cccl, nvidia-nvtx, nvidia-nvml-dev, cmake, ninja) instead of
    /// stack.lock + cache.
    #[arg(long, value_name = "DIR")]
    pub wheels: Option<PathBuf>,
}

/// The options only `build deepep` reads (flattened into `build`'s arguments).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeepepArgs {
    /// deepep: build in this existing Python environment and its torch (adopt mode)
    /// instead of a venv made from the lock (managed mode).
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// deepep, managed mode: the interpreter the build venv is made from (default:
    /// python3.X on PATH, X.Y the lock's target).
    #[arg(long, value_name = "PATH", conflicts_with = "python")]
    pub base_python: Option<PathBuf>,
    /// deepep: the NVSHMEM to build against: an NVSHMEM build step (`<store>/steps/nvshmem-*`
    /// or a copy of one) or an install prefix. Default: the store's build of the stack's NVSHMEM.
    #[arg(long, value_name = "DIR")]
    pub nvshmem: Option<PathBuf>,
    /// deepep: the drop-in NVSHMEM wheel (default: made from the --nvshmem build step).
    #[arg(long, value_name = "WHEEL")]
    pub nvshmem_wheel: Option<PathBuf>,
    /// deepep V2: an NCCL root to build against instead of the environment's own.
    #[arg(long, value_name = "DIR")]
    pub nccl_dir: Option<PathBuf>,
    /// deepep V2: accept --nccl-dir although the process then holds a second libnccl.
    #[arg(long)]
    pub allow_second_nccl: bool,
}

/// The whole graph's own flags.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct GraphArgs {
    /// Refuse to change stack.lock: a lock that does not match stack.toml is an error
    /// (CI), not resolved again.
    #[arg(long)]
    pub locked: bool,
    /// Print the plan and run nothing: every step, its key, and whether it is reused or
    /// runs and why (the input that changed, named).
    #[arg(long)]
    pub dry_run: bool,
    /// Stop after STEP: run it and the steps it depends on.
    #[arg(long, value_parser = step_parser(), value_name = "STEP", conflicts_with = "only")]
    pub until: Option<StepId>,
    /// Run only STEP; the steps it depends on must be done already.
    #[arg(long, value_parser = step_parser(), value_name = "STEP")]
    pub only: Option<StepId>,
    /// Print the summary (or with --dry-run the plan) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The runtime step also runs verify's runtime and selftest levels in a container
    /// with the GPUs (`docker run --gpus all`: NVIDIA GPUs and the NVIDIA container
    /// runtime).
    #[arg(long)]
    pub gpus: bool,
    /// Also write the image as an OCI image layout (gzip layers) into DIR, which must not
    /// exist.
    #[arg(long, value_name = "DIR")]
    pub oci: Option<PathBuf>,
    /// Also write the build context of docker/Dockerfile into DIR, which must not exist.
    #[arg(long, value_name = "DIR")]
    pub context: Option<PathBuf>,
    /// After the build, build the selected steps again in a fresh home with the time
    /// zone, locale, umask, job count, hostname and process ids varied (`--force` in a
    /// child process), and compare what each step ships byte for byte; a file that
    /// differs is named (with diffoscope's report when it is installed) and the exit
    /// status is 1. With --only STEP, only that step is built again.
    #[arg(long, conflicts_with = "dry_run")]
    pub check: bool,
    /// Also write an HTML report of the run beside summary.json
    /// (`<home>/pipeline/<stack>/timings.html`, its path printed): every step on a
    /// timeline with its wait and run time and what ran beside it, NVSHMEM's and DeepEP's
    /// compile jobs from their ninja logs, the summary table. One self-contained file (no
    /// script, no network); `cargo xtask timings SUMMARY.json` renders it again.
    #[arg(long, conflicts_with = "dry_run")]
    pub timings: bool,
    /// The binary cache (`--substitute` and its trust and TLS).
    #[command(flatten)]
    pub cache: CacheArgs,
}

/// The binary cache's flags, shared by `build` (the whole graph) and `push` (which runs the
/// graph until the image).
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct CacheArgs {
    /// Take step outputs from this binary cache (what `cargo xtask cache push` filled)
    /// instead of building them: each keyed step that would run is looked up by its key
    /// (`<step>-<key>`), its signature verified under stack.toml's [cache] trusted-keys,
    /// its layers' sha256 checked as they stream, and it is sealed in the store as a local
    /// build is; a step the cache lacks is built here. Default: stack.toml's [cache]
    /// registry. Not with --force (which builds again).
    #[arg(long, value_name = "HOST[:PORT]/REPO")]
    pub substitute: Option<String>,
    /// Build every step here, even when stack.toml's [cache] names a registry.
    #[arg(long, conflicts_with = "substitute")]
    pub no_substitute: bool,
    /// Accept pulled outputs that are unsigned or not signed by a trusted key (a warning
    /// for each, even with --quiet; each store step they bring is marked, and the summary
    /// says so), and reuse outputs that entered the store so. Without it such outputs are
    /// refused, in the cache and in the store (`cargo xtask store gc --unsigned` removes
    /// them from the store).
    #[arg(long)]
    pub allow_unsigned: bool,
    /// PEM CA certificates to trust besides the system's, for the binary cache's registry
    /// (and for `push`, the registry pushed to).
    #[arg(long, value_name = "FILE", env = "COMMSTACK_REGISTRY_CA")]
    pub ca_file: Option<PathBuf>,
}

/// `build image`: the graph until the image is loaded (and verified, and run, with
/// --verify).
#[derive(clap::Args)]
#[command(after_help = "\
The stack must have an [image] section (the default stack.toml has one) and a lock with its
[base]; every step the image needs is made first when missing (see `cargo xtask build --help`).

Prints the image ID (the sha256 of its config: the same lock, commit and tool binaries give
the same ID), the tag (<name>:<first 12 hex of the lock's sha256>-g<first 12 hex of the commit>), the size, the layers and
where the image step's files are (config, SBOM, provenance, image.json); the verify reports
are kept under <home>/reports/image-<id>/.")]
pub struct ImageTarget {
    /// Verify the image (the graph until its runtime step): verify's static level on this
    /// machine over the image's layers, while Docker loads it (ELF closure, one
    /// libnvshmem_host (ours, NCCL off), one libnccl at the lock's version, DeepEP's
    /// device code of the host library's build); then `import torch` in the loaded image
    /// with no GPU and no network.
    #[arg(long, conflicts_with = "no_load")]
    pub verify: bool,
    /// Make the image step but do not load it into Docker.
    #[arg(long)]
    pub no_load: bool,
    /// Refuse to change stack.lock (see `build --help`).
    #[arg(long)]
    pub locked: bool,
    /// Print the plan and run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// With --verify: also verify's runtime and selftest levels in the loaded image
    /// (`docker run --gpus all`).
    #[arg(long, requires = "verify")]
    pub gpus: bool,
    /// Also write the image as an OCI image layout into DIR, which must not exist.
    #[arg(long, value_name = "DIR")]
    pub oci: Option<PathBuf>,
    /// Write the build context of docker/Dockerfile into DIR, which must not exist.
    #[arg(long, value_name = "DIR")]
    pub context: Option<PathBuf>,
    #[command(flatten)]
    pub build: BuildArgs,
}

impl ImageTarget {
    /// The graph's flags this asks for.
    pub fn into_graph(self) -> (GraphOptions, BuildOptions) {
        let until = match (self.verify, self.no_load) {
            (true, _) => StepId::Runtime,
            (false, true) => StepId::Image,
            (false, false) => StepId::Load,
        };
        let graph = GraphOptions {
            locked: self.locked,
            dry_run: self.dry_run,
            until: Some(until),
            only: None,
            json: self.json,
            gpus: self.gpus,
            oci: self.oci,
            context: self.context,
            ..GraphOptions::default()
        };
        (graph, self.build.into())
    }
}

/// Where the artifacts come from and how to get them; shared by `fetch` and `mirror export`.
#[derive(clap::Args, Clone, Debug)]
pub struct FetchFlags {
    /// A mirror tried before upstream: a directory of files named as upstream names them
    /// (as `cargo xtask mirror export` writes), a file:// URL, or an http(s) base URL.
    /// Repeat to give several; they are tried in order.
    #[arg(long, value_name = "DIR|URL")]
    pub mirror: Vec<String>,
    /// Open no network connection: use only the cache and mirror directories, and fail
    /// with the list of everything missing.
    #[arg(long)]
    pub offline: bool,
    /// Downloads at once.
    #[arg(long, short, value_name = "N", default_value_t = 4)]
    pub jobs: usize,
    /// Retries of one URL after failures that brought no bytes (5xx, 429, resets,
    /// timeouts), with exponential backoff.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub retries: u32,
    /// Accept a source archive whose sha256 differs from the lock when its unpacked tree
    /// hash equals the lock's (the same release from another origin). Recorded in the
    /// cache with the archive's own sha256: later runs use it without the flag, hold it
    /// to that sha256, and report it.
    #[arg(long)]
    pub accept_tree_match: bool,
    /// Hash every cached file before trusting it; a damaged one is moved to the cache's
    /// quarantine/ (kept to inspect) and downloaded again.
    #[arg(long)]
    pub verify: bool,
    /// Fetch the artifacts listed in this JSON file instead of the lock's: an array of
    /// {"name", "filename", "urls": [..], "sha256", "size"?, "tree_sha256"?}.
    /// For benchmarks and tests.
    #[arg(long, value_name = "FILE")]
    pub artifacts: Option<PathBuf>,
    /// Only these parts of the lock (comma-separated): `sources` (NVSHMEM, DeepEP),
    /// `toolchain` (CUDA compiler wheels, cmake, ninja), `wheels` (the target's Python
    /// closure), `replaced` (wheels the stack replaces, kept for comparison). Default: all.
    #[arg(long, value_parser = part_parser(), value_delimiter = ',', value_name = "PART,...")]
    pub only: Vec<Part>,
}

/// `--until`/`--only`'s value: a step by its name, the names listed in `--help`.
pub fn step_parser() -> impl clap::builder::TypedValueParser<Value = StepId> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(StepId::ALL.map(|s| PossibleValue::new(s.name()).help(s.about())))
        .map(|name| StepId::from_name(&name).expect("a possible value names a step"))
}

/// `--only`'s value for fetch: a part of the lock by its name.
fn part_parser() -> impl clap::builder::TypedValueParser<Value = Part> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let value = |p: Part| {
        let v = PossibleValue::new(p.name());
        match p.about() {
            Some(about) => v.help(about),
            None => v,
        }
    };
    PossibleValuesParser::new(Part::ALL.map(value)).map(|name| {
        Part::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .expect("a possible value names a part")
    })
}

impl From<GlobalArgs> for GlobalOptions {
    fn from(a: GlobalArgs) -> GlobalOptions {
        GlobalOptions {
            stack: a.stack,
            home: a.home,
            quiet: a.quiet,
        }
    }
}

impl From<BuildArgs> for BuildOptions {
    fn from(a: BuildArgs) -> BuildOptions {
        BuildOptions {
            force: a.force,
            jobs: a.jobs,
            source: a.source,
            fetch: a.fetch.into(),
            with: a.with,
            toolchain: a.toolchain.into(),
            cuda_archs: a.cuda_archs,
            no_ibgda: a.no_ibgda,
            static_lib: a.static_lib,
            rdma_core: a.rdma_core,
            keep_env: a.keep_env,
            torch_pin: a.torch_pin,
            allow_version_mismatch: a.allow_version_mismatch,
            compare_with: a.compare_with,
            nvshmem_from: a.nvshmem_from,
            test: a.test,
            python3: a.python3,
            configure_only: a.configure_only,
            deepep: a.deepep.into(),
        }
    }
}

impl From<SourceFetchArgs> for SourceFetch {
    fn from(a: SourceFetchArgs) -> SourceFetch {
        SourceFetch {
            mirror: a.mirror,
            offline: a.offline,
            accept_tree_match: a.accept_tree_match,
        }
    }
}

impl From<ToolchainArgs> for ToolchainChoice {
    fn from(a: ToolchainArgs) -> ToolchainChoice {
        ToolchainChoice {
            system: a.system,
            cuda_home: a.cuda_home,
            wheels: a.wheels,
        }
    }
}

impl From<DeepepArgs> for DeepepOptions {
    fn from(a: DeepepArgs) -> DeepepOptions {
        DeepepOptions {
            python: a.python,
            base_python: a.base_python,
            nvshmem: a.nvshmem,
            nvshmem_wheel: a.nvshmem_wheel,
            nccl_dir: a.nccl_dir,
            allow_second_nccl: a.allow_second_nccl,
        }
    }
}

impl From<GraphArgs> for GraphOptions {
    fn from(a: GraphArgs) -> GraphOptions {
        GraphOptions {
            locked: a.locked,
            dry_run: a.dry_run,
            until: a.until,
            only: a.only,
            json: a.json,
            gpus: a.gpus,
            oci: a.oci,
            context: a.context,
            check: a.check,
            timings: a.timings,
            cache: a.cache.into(),
        }
    }
}

impl From<CacheArgs> for CacheOptions {
    fn from(a: CacheArgs) -> CacheOptions {
        CacheOptions {
            substitute: a.substitute,
            no_substitute: a.no_substitute,
            allow_unsigned: a.allow_unsigned,
            ca_file: a.ca_file,
        }
    }
}

impl From<FetchFlags> for FetchRequest {
    fn from(a: FetchFlags) -> FetchRequest {
        FetchRequest {
            mirror: a.mirror,
            offline: a.offline,
            jobs: a.jobs,
            retries: a.retries,
            accept_tree_match: a.accept_tree_match,
            verify: a.verify,
            artifacts: a.artifacts,
            only: a.only,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BuildArgs,
    }

    /// `--cuda-archs` parses through the stack's CUDA-arch type: the entries every place
    /// pins are kept as written, "9x0" is refused with the grammar's message.
    #[test]
    fn cuda_archs_flag_uses_the_stack_grammar() {
        let cli = Cli::try_parse_from(["build", "--cuda-archs", "90,90a,100f,90-real"])
            .unwrap_or_else(|e| panic!("{e}"));
        let archs: Vec<String> = cli.args.cuda_archs.iter().map(|a| a.cmake()).collect();
        assert_eq!(archs, ["90", "90a", "100f", "90-real"]);
        let Err(e) = Cli::try_parse_from(["build", "--cuda-archs", "90,9x0"]) else {
            panic!("9x0 was accepted");
        };
        let e = e.to_string();
        assert!(e.contains("\"9x0\" is not a CUDA architecture"), "{e}");
    }
}
