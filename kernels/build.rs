//! Compiles the CUDA sources in `cu/` with nvcc (through `cc`) against NVSHMEM, when the
//! feature `cuda` is on; without it there is nothing to compile (the crate is then its
//! pure-Rust parts, and no binary is built: see Cargo.toml).
//!
//! Inputs (environment; `cargo xtask build kernels` sets them from the provisioned
//! toolchain, or set them by hand for standalone use, see kernels/dev-env.sh):
//! - `COMMSTACK_NVCC`: the real `bin/nvcc` (else `$CUDA_HOME/bin/nvcc`);
//! - `NVSHMEM_HOME`: an NVSHMEM prefix with `include/` and `lib/` (an install prefix or
//!   the `nvidia/nvshmem` directory of NVIDIA's wheel);
//! - `COMMSTACK_CUDA_ARCHS`: CUDA architectures in stack.toml's grammar (`90`, `90a`,
//!   `100f`, `90-real`; see commstack_stack::arch), separated by `;`, e.g. `90;100`
//!   (default 90);
//! - `COMMSTACK_SELFTEST_RUNPATH`: the binary's RUNPATH entries, separated by `:` (e.g.
//!   `$ORIGIN/../lib/nvshmem`); unset: the bundle layout and `$NVSHMEM_HOME/lib`, which
//!   runs in place on a developer machine but names this machine's NVSHMEM.
//!
//! Reproducibility: nothing here records a path but the RUNPATH (the build info names
//! versions), nvcc runs with `-objtemp`, and the paths given are used as given (a link
//! is not resolved), so a build at a fixed path through links in it repeats byte for
//! byte (`cargo xtask build kernels` does that: crates/steps/src/flow/kernels.rs and crates/tools/src/selftest.rs).
//!
//! Linking: the device code is linked (`-rdc=true`, cc's device-link step) with
//! libnvshmem_device.a; the host side links that archive's host objects, the static
//! CUDA runtime and libnvshmem_host.so.3 (versioned name only in NVIDIA's wheels). The
//! driver (libcuda) is not linked: cudarc and both CUDA runtimes load it at run time.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use commstack_stack::CudaArch;

// In its own file so that tests/build_archs.rs can test it (a build script's own tests
// never run).
#[path = "build_archs.rs"]
mod archs;
use archs::{gencode, parse_archs};

const CU_SOURCES: &[&str] = &["cu/host.cu", "cu/kernels.cu"];
const CU_HEADERS: &[&str] = &["cu/cs_error.h"];
const HOW_TO: &str = "Run `cargo xtask toolchain` and build through `cargo xtask build kernels`, \
                      or see kernels/dev-env.sh for a standalone setup";

/// Relative to the binary: a bundle ships `bin/commstack-selftest` beside `lib/nvshmem/`.
const BUNDLE_RPATH: &str = "$ORIGIN/../lib/nvshmem";

fn main() {
    if let Err(msg) = run() {
        // A panic would bury the message in a backtrace; print it plainly and fail.
        eprintln!("\nerror: commstack-kernels cannot be built: {msg}\n");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    for var in [
        "COMMSTACK_NVCC",
        "CUDA_HOME",
        "NVSHMEM_HOME",
        "COMMSTACK_CUDA_ARCHS",
        "COMMSTACK_SELFTEST_RUNPATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for file in CU_SOURCES.iter().chain(CU_HEADERS) {
        println!("cargo:rerun-if-changed={file}");
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        // Said, not silent: someone who set up nvcc and NVSHMEM meant to build the kernels.
        if let Some(var) = ["COMMSTACK_NVCC", "NVSHMEM_HOME"]
            .into_iter()
            .find(|v| env::var_os(v).is_some())
        {
            println!(
                "cargo:warning={var} is set but the feature `cuda` is off: the CUDA kernels \
                 and commstack-selftest are not built (add `--features cuda`, as `cargo xtask \
                 build kernels` does)"
            );
        }
        return Ok(());
    }

    let nvcc = find_nvcc()?;
    let cudart_dir = find_cudart_dir(&nvcc)?;
    let nvshmem = NvshmemPrefix::from_env()?;
    let archs = parse_archs(env::var("COMMSTACK_CUDA_ARCHS").ok().as_deref())?;

    // cc takes the CUDA compiler from $NVCC (`Build::compiler` would name the host
    // compiler). SAFETY: the build script is single-threaded here.
    unsafe { env::set_var("NVCC", &nvcc) };
    let mut build = cc::Build::new();
    build
        .cuda(true)
        // We emit the runtime ourselves, after libnvshmem_device.a which needs it.
        .cudart("none")
        // cc would add -G in debug profiles: device debug code is slow and huge.
        .debug(false)
        .flag("-rdc=true")
        .flag("-std=c++17")
        // nvcc names an STT_FILE symbol after its temporary file, `tmpxft_<pid>_...`;
        // with -objtemp the intermediates are named after the object, the same each build.
        .flag("-objtemp")
        .include(&nvshmem.include)
        // In the flags so that cc's own `nvcc --device-link` step resolves NVSHMEM's
        // device symbols.
        .flag(format!("-L{}", nvshmem.lib.display()))
        .flag("-lnvshmem_device");
    for arch in &archs {
        build.flag("-gencode").flag(gencode(arch));
    }
    build.files(CU_SOURCES);
    build
        .try_compile("commstack_kernels_cu")
        .map_err(|e| format!("nvcc ({}) failed: {e}", nvcc.display()))?;

    // Order matters for the static archives: ours (emitted by cc above), then NVSHMEM's
    // device library, then the CUDA runtime both of them call.
    println!("cargo:rustc-link-search=native={}", nvshmem.lib.display());
    println!("cargo:rustc-link-lib=static=nvshmem_device");
    println!("cargo:rustc-link-search=native={}", cudart_dir.display());
    println!("cargo:rustc-link-lib=static=cudart_static");
    println!("cargo:rustc-link-lib=dylib:+verbatim=libnvshmem_host.so.3");
    // The host library is linked only for its DT_NEEDED entry; it may come from a build
    // for a newer glibc than this machine's (the stack's NVSHMEM built on the GPU
    // machine needs GLIBC_2.38, this build host may have 2.36). Its own symbol needs are
    // checked where it runs (verify's static level), not here.
    println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    // Run-time search path of libnvshmem_host.so.3 (its own RUNPATH, `$ORIGIN`, finds
    // NVSHMEM's plugins beside it).
    for entry in runpath(&nvshmem) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{entry}");
    }

    let archs: Vec<String> = archs.iter().map(CudaArch::cmake).collect();
    // Versions, not paths: the binary must not name the machine it was built on.
    println!(
        "cargo:rustc-env=COMMSTACK_KERNELS_BUILD_INFO=nvcc {} nvshmem {} archs {}",
        nvcc_version(&nvcc)?,
        nvshmem.version(),
        archs.join(";")
    );
    println!(
        "cargo:rustc-env=COMMSTACK_KERNELS_ARCHS={}",
        archs.join(";")
    );
    Ok(())
}

/// `COMMSTACK_SELFTEST_RUNPATH` split at `:` (set and empty: no RUNPATH), else the bundle
/// layout first, then the directory built against (developer machines, CI).
fn runpath(nvshmem: &NvshmemPrefix) -> Vec<String> {
    match env::var("COMMSTACK_SELFTEST_RUNPATH") {
        Ok(list) => list
            .split(':')
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect(),
        Err(_) => vec![BUNDLE_RPATH.to_string(), nvshmem.lib.display().to_string()],
    }
}

/// `V13.0.88` from `nvcc --version`.
fn nvcc_version(nvcc: &Path) -> Result<String, String> {
    let out = std::process::Command::new(nvcc)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", nvcc.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split([' ', ',', '\n'])
        .find(|w| w.starts_with('V') && w[1..].starts_with(|c: char| c.is_ascii_digit()))
        .map(String::from)
        .ok_or_else(|| format!("{} --version names no version: {text}", nvcc.display()))
}

/// The nvcc binary, at the path given: nvcc reads `nvcc.profile` beside itself, so a link
/// to the binary is resolved, but not a linked directory above it (the toolkit seen at a
/// fixed path through a link keeps that path).
fn find_nvcc() -> Result<PathBuf, String> {
    let (candidate, origin) = if let Some(path) = env::var_os("COMMSTACK_NVCC") {
        (PathBuf::from(path), "COMMSTACK_NVCC")
    } else if let Some(home) = env::var_os("CUDA_HOME") {
        (PathBuf::from(home).join("bin/nvcc"), "CUDA_HOME/bin/nvcc")
    } else {
        return Err(format!(
            "nvcc not found: neither COMMSTACK_NVCC nor CUDA_HOME is set. {HOW_TO}, \
             or set COMMSTACK_NVCC=/path/to/bin/nvcc"
        ));
    };
    let not_found = |e: std::io::Error| {
        format!(
            "nvcc not found at {} (from {origin}): {e}. {HOW_TO}, or set \
             COMMSTACK_NVCC=/path/to/bin/nvcc",
            candidate.display()
        )
    };
    let given = std::path::absolute(&candidate).map_err(not_found)?;
    let real = match std::fs::symlink_metadata(&given).map_err(not_found)? {
        m if m.file_type().is_symlink() => given.canonicalize().map_err(not_found)?,
        _ => given,
    };
    if !real.is_file() {
        return Err(format!("{} (from {origin}) is not a file", real.display()));
    }
    if !real.with_file_name("nvcc.profile").is_file() {
        return Err(format!(
            "{} (from {origin}) has no nvcc.profile beside it: not a CUDA toolkit's nvcc",
            real.display()
        ));
    }
    Ok(real)
}

/// The directory holding libcudart_static.a. cc only looks in
/// `<nvcc>/../targets/<arch>-linux/lib`; PyPI's wheels put it in `<nvcc>/../lib`.
fn find_cudart_dir(nvcc: &Path) -> Result<PathBuf, String> {
    let top = nvcc
        .parent()
        .and_then(Path::parent)
        .ok_or("nvcc has no parent directory")?;
    let candidates = [
        top.join("lib"),
        top.join("targets/x86_64-linux/lib"),
        top.join("lib64"),
    ];
    candidates
        .iter()
        .find(|dir| dir.join("libcudart_static.a").is_file())
        .cloned()
        .ok_or_else(|| {
            let mut msg = format!(
                "libcudart_static.a (the static CUDA runtime) not found next to {}; looked in:",
                nvcc.display()
            );
            for dir in &candidates {
                let _ = write!(msg, " {}", dir.display());
            }
            let _ = write!(
                msg,
                ". With PyPI's wheels, install nvidia-cuda-runtime into the same tree as \
                 nvidia-cuda-nvcc. {HOW_TO}"
            );
            msg
        })
}

struct NvshmemPrefix {
    include: PathBuf,
    lib: PathBuf,
}

impl NvshmemPrefix {
    fn from_env() -> Result<Self, String> {
        let prefix = env::var_os("NVSHMEM_HOME")
            .map(PathBuf::from)
            .ok_or_else(|| {
                format!(
                    "NVSHMEM not found: NVSHMEM_HOME is not set. {HOW_TO}, or set NVSHMEM_HOME \
                 to an NVSHMEM prefix (for NVIDIA's wheel nvidia-nvshmem-cu13: its \
                 nvidia/nvshmem directory)"
                )
            })?;
        // Absolute but not resolved: a link at a fixed path stays that path.
        let prefix = std::path::absolute(&prefix)
            .map_err(|e| format!("NVSHMEM_HOME={}: {e}", prefix.display()))?;
        let include = prefix.join("include");
        let lib = prefix.join("lib");
        let required = [
            include.join("nvshmem.h"),
            include.join("nvshmemx.h"),
            lib.join("libnvshmem_device.a"),
            lib.join("libnvshmem_host.so.3"),
        ];
        let missing: Vec<String> = required
            .iter()
            .filter(|p| !p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "NVSHMEM_HOME={} is incomplete, missing: {}. It must hold NVSHMEM's headers \
                 and its device (static) and host libraries. {HOW_TO}",
                prefix.display(),
                missing.join(", ")
            ));
        }
        Ok(Self { include, lib })
    }

    /// `3.4.5` from `include/non_abi/nvshmem_version.h`, `unknown` without it.
    fn version(&self) -> String {
        let header = std::fs::read_to_string(self.include.join("non_abi/nvshmem_version.h"))
            .unwrap_or_default();
        let part = |name: &str| {
            header.lines().find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some("#define") && words.next() == Some(name))
                    .then(|| words.next().map(String::from))
                    .flatten()
            })
        };
        match (
            part("NVSHMEM_VENDOR_MAJOR_VERSION"),
            part("NVSHMEM_VENDOR_MINOR_VERSION"),
            part("NVSHMEM_VENDOR_PATCH_VERSION"),
        ) {
            (Some(a), Some(b), Some(c)) => format!("{a}.{b}.{c}"),
            _ => "unknown".to_string(),
        }
    }
}
