//! The arguments of `cargo xtask build`: the settings every build takes ([`Args`], read by
//! [`crate::settings::Settings`] and the flows beside this module), and each target's own
//! flags on top ([`NvshmemTarget`], [`KernelsTarget`], [`DeepepTarget`]).

use std::path::PathBuf;

use commstack_stack::CudaArch;

use crate::flow::deepep::DeepepArgs;
use crate::flow::toolchain::ToolchainArgs;

/// The settings every build command takes from its command line (the whole graph and each
/// target); the fields marked `skip` are set by one target's own flags.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(skip)]
pub struct Args {
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
    pub build: Args,
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
    pub fn into_args(self) -> Args {
        Args {
            source: self.source,
            torch_pin: self.torch_pin,
            compare_with: self.compare_with,
            configure_only: self.configure_only,
            ..self.build
        }
    }
}

/// `build kernels`: the NVSHMEM self-test (commstack-selftest), compiled with the
/// toolchain's nvcc.
#[derive(clap::Args)]
pub struct KernelsTarget {
    #[command(flatten)]
    pub build: Args,
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
    pub fn into_args(self) -> Args {
        Args {
            nvshmem_from: self.nvshmem_from,
            test: self.test,
            ..self.build
        }
    }
}

/// `build deepep`: DeepEP into a wheel and the wheelhouse (managed venv, or --python
/// PATH to adopt).
#[derive(clap::Args)]
pub struct DeepepTarget {
    #[command(flatten)]
    pub build: Args,
    /// A DeepEP source (directory or archive) to build instead of the locked one
    /// (development only: it is hashed and compared with the lock, and the output says so).
    #[arg(long, value_name = "DIR|ARCHIVE")]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub deepep: DeepepArgs,
}

impl DeepepTarget {
    pub fn into_args(self) -> Args {
        Args {
            source: self.source,
            deepep: self.deepep,
            ..self.build
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

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
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
