//! Compiles the CUDA sources in `cu/` with nvcc (through `cc`) against NVSHMEM.
//!
//! Inputs (environment; `cargo xtask build kernels` sets them from the provisioned
//! toolchain, or set them by hand for standalone use, see kernels/dev-env.sh):
//! - `COMMSTACK_NVCC`: the real `bin/nvcc` (else `$CUDA_HOME/bin/nvcc`);
//! - `NVSHMEM_HOME`: an NVSHMEM prefix with `include/` and `lib/` (an install prefix or
//!   the `nvidia/nvshmem` directory of NVIDIA's wheel);
//! - `COMMSTACK_CUDA_ARCHS`: CUDA architectures in stack.toml's grammar (`90`, `90a`,
//!   `100f`, `90-real`; see commstack_stack::arch), separated by `;`, e.g. `90;100`
//!   (default 90).
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
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    for file in CU_SOURCES.iter().chain(CU_HEADERS) {
        println!("cargo:rerun-if-changed={file}");
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
    // Run-time search path of libnvshmem_host.so.3: the bundle layout first, then the
    // directory built against (developer machines, CI).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{BUNDLE_RPATH}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", nvshmem.lib.display());

    let archs: Vec<String> = archs.iter().map(CudaArch::cmake).collect();
    println!(
        "cargo:rustc-env=COMMSTACK_KERNELS_BUILD_INFO=nvcc={} nvshmem={} archs={}",
        nvcc.display(),
        nvshmem.prefix.display(),
        archs.join(";")
    );
    println!(
        "cargo:rustc-env=COMMSTACK_KERNELS_ARCHS={}",
        archs.join(";")
    );
    Ok(())
}

/// The real nvcc binary: nvcc reads `nvcc.profile` beside itself, so symlinks are resolved.
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
    let real = candidate.canonicalize().map_err(|e| {
        format!(
            "nvcc not found at {} (from {origin}): {e}. {HOW_TO}, or set \
             COMMSTACK_NVCC=/path/to/bin/nvcc",
            candidate.display()
        )
    })?;
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
    prefix: PathBuf,
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
        let prefix = prefix
            .canonicalize()
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
        Ok(Self {
            prefix,
            include,
            lib,
        })
    }
}
