//! `cargo xtask bench ...`: benchmarks whose results go into docs/benchmarks.md (with the
//! command, the machine and the date). Parse, then one call per subcommand: the harness is
//! commstack-bench (one module per benchmark); the benchmarks that run this CLI as whole
//! processes get its path from here (`std::env::current_exe()`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use commstack_bench::{build, deepep, fetch, lock, substitute};
use commstack_steps::ctx::Ctx;
use commstack_steps::options::Part;

use crate::args::SourceFetchArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand)]
enum Which {
    /// `cargo xtask lock` on the current stack, cold (empty cache) and no-op, as whole
    /// processes; optionally beside `pip install --dry-run --report` and `uv pip compile`.
    Lock {
        /// Repetitions of each measurement.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also time `pip install --dry-run --ignore-installed --report` for the same target
        /// (about 40 s a run).
        #[arg(long)]
        with_pip: bool,
        /// Also time `uv pip compile --no-cache` with this uv binary.
        #[arg(long, value_name = "UV")]
        with_uv: Option<PathBuf>,
    },
    /// `cargo xtask fetch` of the lock's wheels into an empty cache, beside `pip download
    /// --no-deps` of the same URLs; then a fetch killed half-way and resumed.
    Fetch {
        /// Which part of the lock: wheels (the target closure, 2.7 GB for the default
        /// stack) or toolchain.
        #[arg(long, default_value = "wheels")]
        part: String,
        /// Parallel downloads.
        #[arg(long, default_value_t = 4)]
        jobs: usize,
        /// Also time `pip download --no-deps` of the same files.
        #[arg(long)]
        with_pip: bool,
        /// Skip the kill-and-resume measurement.
        #[arg(long)]
        no_resume: bool,
    },
    /// `cargo xtask build`: its no-op time (whole processes, every step done, the image
    /// loaded; target < 1 s) and the image's size against its base's files plus its
    /// wheels' files (and DeepEP V2's JIT toolchain wheels' files; target <= 1.10x), in
    /// all and per layer; builds everything first if needed.
    Build {
        /// Repetitions of the no-op (at least 1).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        #[command(flatten)]
        fetch: SourceFetchArgs,
    },
    /// DeepEP's build through commstack (its store step forced, from the store's inputs:
    /// the build venv, NVSHMEM, the toolchain, the locked source) against DeepEP's
    /// documented `python setup.py build` in a fresh copy of the source with the same
    /// inputs and MAX_JOBS; trials interleaved, medians and the ratio (target <= 1.0x).
    /// Builds the graph up to deepep first if needed.
    Deepep {
        /// Trials, each both ways, the order alternating (a DeepEP V2 compile is minutes
        /// on 2 cores).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        trials: u64,
        /// MAX_JOBS for both builds (default: the CPU count, as `build` uses).
        #[arg(long)]
        jobs: Option<usize>,
        #[command(flatten)]
        fetch: SourceFetchArgs,
    },
    /// A new machine with a warm registry: pushes this home's image and step outputs
    /// (signed), then times `docker pull` of the image against `build --substitute` in an
    /// empty home (to the loaded, statically verified image; target <= 1.2x docker pull),
    /// and checks both give the image ID that was pushed and that nothing was compiled;
    /// `--then STACK` times an update to STACK's image the same way; `--trials N` runs each
    /// part N times and judges the median of the trials' ratios.
    Substitute(SubstituteArgs),
    /// logscan throughput on a synthetic log (real-looking NCCL INFO chatter mixed with
    /// every known signature), written to a temporary directory.
    Logscan {
        /// Size of the synthetic log in MiB.
        #[arg(long, default_value_t = 1024)]
        mib: u64,
    },
    /// `deploy render` of the current stack for each target, whole (stack.toml, the lock,
    /// NVSHMEM's variables read from its source, render, envlint, files written); target
    /// under 1 s each.
    Deploy {
        /// Renders per target.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        /// The image reference rendered (it is not pulled).
        #[arg(
            long,
            default_value = "registry.example.com/commstack/bench@sha256:390fb29b8501aa6f0e8ef8d0c2b9d0f6a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1"
        )]
        image: String,
        /// The NVSHMEM source, instead of the locked one in the cache.
        #[arg(long, value_name = "PATH")]
        nvshmem_source: Option<PathBuf>,
    },
}

/// `bench substitute`'s own flags, for clap.
#[derive(clap::Args)]
struct SubstituteArgs {
    /// The registry (`HOST[:PORT]/REPO`, `http://` for plain HTTP) to push to and
    /// substitute from.
    #[arg(long, value_name = "HOST[:PORT]/REPO")]
    registry: String,
    /// The ed25519 signing key (PKCS#8 PEM: `openssl genpkey -algorithm ed25519`); the
    /// bench's stack copy trusts its public key.
    #[arg(long, value_name = "KEY.pem")]
    key: PathBuf,
    /// PEM CA certificates for a registry with a private CA.
    #[arg(long, value_name = "FILE", env = "COMMSTACK_REGISTRY_CA")]
    ca_file: Option<PathBuf>,
    /// Keep the substituting home (`<home>/bench/substitute/home`) afterwards.
    #[arg(long)]
    keep: bool,
    /// The registry holds this home's image and step outputs from an earlier run of the
    /// bench: skip the push (the image is found by its `lock-<sha256>` tag).
    #[arg(long)]
    pushed: bool,
    /// Then time an update: STACK (locked; a change that moves some layers, such as
    /// DeepEP's or an extra requirement) is built and pushed from this home, and reached
    /// both ways from the machine of the first run, whose Docker holds the first image.
    #[arg(long, value_name = "STACK")]
    then: Option<PathBuf>,
    /// Run each part this many times both ways, each time from the same start (the
    /// image gone from Docker, the home as it was), and judge the median of the trials'
    /// ratios: a 2 s docker pull varies by a quarter from one run to the next.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=20))]
    trials: u16,
    #[command(flatten)]
    fetch: SourceFetchArgs,
}

impl From<SubstituteArgs> for substitute::Request {
    fn from(a: SubstituteArgs) -> Self {
        substitute::Request {
            registry: a.registry,
            key: a.key,
            ca_file: a.ca_file,
            fetch: a.fetch.into(),
            keep: a.keep,
            pushed: a.pushed,
            then: a.then,
            trials: usize::from(a.trials),
        }
    }
}

/// `--part`'s value.
fn part(name: &str) -> Result<Part> {
    Ok(match name {
        "wheels" => Part::Wheels,
        "toolchain" => Part::Toolchain,
        other => bail!("--part {other}: use wheels or toolchain"),
    })
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let xtask = || std::env::current_exe().context("cannot find the xtask binary");
    match args.which {
        Which::Lock {
            runs,
            with_pip,
            with_uv,
        } => {
            let req = lock::Request {
                runs,
                with_pip,
                with_uv,
            };
            lock::bench_lock(ctx, &req, &xtask()?)
        }
        Which::Fetch {
            part: name,
            jobs,
            with_pip,
            no_resume,
        } => {
            let req = fetch::Request {
                part: part(&name)?,
                jobs,
                with_pip,
                no_resume,
            };
            fetch::bench_fetch(ctx, &req, &xtask()?)
        }
        Which::Build { runs, fetch } => {
            let req = build::Request {
                runs: runs as usize,
                fetch: fetch.into(),
            };
            build::bench_build(ctx, &req, &xtask()?)
        }
        Which::Deepep {
            trials,
            jobs,
            fetch,
        } => deepep::bench_deepep(
            ctx,
            &deepep::Request {
                trials: trials as usize,
                fetch: fetch.into(),
                jobs,
            },
        ),
        Which::Deploy {
            runs,
            image,
            nvshmem_source,
        } => commstack_bench::deploy::bench_deploy(
            ctx,
            &commstack_bench::deploy::Request {
                runs: runs as usize,
                image,
                nvshmem_source,
            },
        ),
        Which::Substitute(a) => substitute::bench_substitute(ctx, &a.into(), &xtask()?),
        Which::Logscan { mib } => commstack_bench::logscan(mib),
    }
}
