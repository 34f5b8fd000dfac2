//! The toolchain from locked PyPI wheels, unpacked into one store step.
//!
//! Step layout (`<store>/steps/toolchain-<hash>/`):
//! ```text
//! python/nvidia/cu13/         CUDA_HOME: the NVIDIA wheels merged, as pip would install them,
//!   bin/nvcc, nvcc.profile      plus the toolkit layout nvcc.profile and CMake expect:
//!   targets/x86_64-linux/include -> ../../include
//!   targets/x86_64-linux/lib     -> ../../lib  (libcudart.so link added, stubs/libcuda.so made)
//!   lib64 -> lib
//! python/cmake/data/bin/cmake   the cmake wheel's binary (finds its share/ beside it)
//! bin/ninja                     the ninja wheel's script (a binary)
//! toolchain.json                what is where, the versions read from the tools
//! ```

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_store::{Outcome, StepDir, StepKey, Store};
use commstack_wheel::{InstallLayout, WheelFilename, install, normalize_name};
use serde::{Deserialize, Serialize};
use xshell::{Shell, cmd};

use crate::probe::{cmake_version, host_compilers, is_executable, ninja_version, nvcc_version};
use crate::stub::make_libcuda_stub;
use crate::{ToolVersions, Toolchain, ToolchainSource, WheelPin};

/// The distributions a wheel toolchain is made of (PEP 503 names). All CUDA ones must be
/// of one CUDA release (torch 2.11 pins cuda-toolkit 13.0.2: nvcc/crt/nvvm 13.0.88,
/// runtime 13.0.96, cccl 13.0.85, nvtx 13.0.85, nvml-dev 13.0.87). Beyond the compiler,
/// NVSHMEM's sources include `nvtx3/` (nvidia-nvtx, with NVSHMEM_NVTX on as in NVIDIA's
/// build) and `nvml.h` (nvidia-nvml-dev; the library itself is dlopened at run time).
pub const REQUIRED_WHEELS: [&str; 9] = [
    "nvidia-cuda-nvcc",
    "nvidia-cuda-runtime",
    "nvidia-cuda-crt",
    "nvidia-nvvm",
    "nvidia-cuda-cccl",
    "nvidia-nvtx",
    "nvidia-nvml-dev",
    "cmake",
    "ninja",
];

/// Distributions a toolchain may also hold: DeepEP V2's stacks lock cuobjdump, which its
/// JIT runs at run time (`commstack_stack::lock::JIT_CUOBJDUMP`).
pub const OPTIONAL_WHEELS: [&str; 1] = ["nvidia-cuda-cuobjdump"];

pub const TOOLCHAIN_FILE: &str = "toolchain.json";
const STEP: &str = "toolchain";
const TARGET_DIR: &str = "targets/x86_64-linux";

/// One locked wheel, already downloaded and (by the fetcher) verified.
#[derive(Clone, Debug)]
pub struct WheelInput {
    pub filename: String,
    pub path: PathBuf,
    pub sha256: String,
}

/// A provisioned toolchain and whether this call built it or found it.
#[derive(Debug)]
pub struct Provisioned {
    pub toolchain: Toolchain,
    pub outcome: Outcome,
}

/// What `toolchain.json` holds; paths relative to the step directory.
#[derive(Serialize, Deserialize)]
struct Stored {
    schema: u32,
    wheels: Vec<WheelPin>,
    cuda_home: PathBuf,
    nvcc: PathBuf,
    cuda_include_dirs: Vec<PathBuf>,
    cudart_lib_dir: PathBuf,
    cuda_stubs_dir: PathBuf,
    cmake: PathBuf,
    ninja: PathBuf,
    cuda: String,
    nvcc_version: String,
    cmake_version: String,
    ninja_version: String,
    libcuda_stub_symbols: usize,
}

/// The step key: the wheels' file names and sha256s, nothing else.
pub fn toolchain_key(wheels: &[WheelInput]) -> Result<(StepKey, serde_json::Value)> {
    let pins = pins_of(wheels)?;
    let inputs = serde_json::json!({ "schema": 1, "target": "x86_64-linux", "wheels": pins });
    Ok((StepKey::new(STEP, &inputs), inputs))
}

fn pins_of(wheels: &[WheelInput]) -> Result<Vec<WheelPin>> {
    let mut pins: Vec<WheelPin> = wheels
        .iter()
        .map(|w| {
            let sha = w.sha256.trim().to_ascii_lowercase();
            if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("{}: {:?} is not a sha256 hex digest", w.filename, w.sha256);
            }
            Ok(WheelPin {
                filename: w.filename.clone(),
                sha256: sha,
            })
        })
        .collect::<Result<_>>()?;
    pins.sort();
    Ok(pins)
}

/// Check that the set is exactly the required distributions, CUDA ones of one major.
fn check_set(wheels: &[WheelInput]) -> Result<u64> {
    let mut names = Vec::new();
    let mut cuda_majors = Vec::new();
    for w in wheels {
        let f = WheelFilename::parse(&w.filename)?;
        let name = normalize_name(&f.name);
        // The lock resolves the CUDA parts through the `cuda-toolkit[...]` meta package,
        // which carries no files: it pins the versions, nothing to unpack.
        if name == "cuda-toolkit" {
            continue;
        }
        if !REQUIRED_WHEELS.contains(&name.as_str()) && !OPTIONAL_WHEELS.contains(&name.as_str()) {
            bail!(
                "{}: {name} is not part of the toolchain (expected exactly: {}; optionally {})",
                w.filename,
                REQUIRED_WHEELS.join(", "),
                OPTIONAL_WHEELS.join(", ")
            );
        }
        if names.contains(&name) {
            bail!("{name} is given twice in the toolchain wheels");
        }
        if name.starts_with("nvidia-") {
            cuda_majors.push((f.version.release()[0], w.filename.clone()));
        }
        names.push(name);
    }
    let missing: Vec<&str> = REQUIRED_WHEELS
        .iter()
        .copied()
        .filter(|r| !names.iter().any(|n| n == r))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the toolchain wheels lack {}: lock them (CUDA ones of torch's CUDA release)",
            missing.join(", ")
        );
    }
    let major = cuda_majors[0].0;
    if let Some((m, f)) = cuda_majors.iter().find(|(m, _)| *m != major) {
        bail!(
            "{f} is CUDA {m}, {} is CUDA {major}: all CUDA wheels must be of one release",
            cuda_majors[0].1
        );
    }
    Ok(major)
}

/// Provision (or find) the toolchain made of `wheels`. `nvcc --version` and a one-kernel
/// compile prove it works before the step is sealed.
pub fn provision_wheels(store: &Store, wheels: &[WheelInput], force: bool) -> Result<Provisioned> {
    let major = check_set(wheels)?;
    let (key, inputs) = toolchain_key(wheels)?;
    let pins = pins_of(wheels)?;
    let outcome = store.run(&key, &inputs, force, |dir| build(dir, wheels, &pins, major))?;
    let toolchain = load_provisioned(outcome.path())?;
    Ok(Provisioned { toolchain, outcome })
}

fn build(dir: &StepDir, wheels: &[WheelInput], pins: &[WheelPin], major: u64) -> Result<()> {
    let out = &dir.out;
    for w in wheels {
        // A damaged cache file is quarantined so that the next fetch downloads it again.
        commstack_fetch::check_cached_file(&w.path, &w.sha256)
            .map_err(|e| anyhow::anyhow!("{}: {e}", w.filename))?;
    }
    let layout = InstallLayout {
        purelib: out.join("python"),
        platlib: out.join("python"),
        scripts: out.join("bin"),
        data: out.join("data"),
        headers: out.join("include"),
    };
    let mut sorted: Vec<&WheelInput> = wheels.iter().collect();
    sorted.sort_by(|a, b| a.filename.cmp(&b.filename));
    for w in sorted {
        install(&w.path, &layout).with_context(|| format!("cannot unpack {}", w.filename))?;
    }

    let cuda_rel = PathBuf::from(format!("python/nvidia/cu{major}"));
    let cuda_home = out.join(&cuda_rel);
    make_toolkit_layout(&cuda_home, major)?;

    let host = host_compilers()?;
    let include = cuda_home.join(TARGET_DIR).join("include");
    let stubs = cuda_home.join(TARGET_DIR).join("lib/stubs");
    let stub_symbols = make_libcuda_stub(&host.cc, &include, &stubs)?;

    let nvcc_rel = cuda_rel.join("bin/nvcc");
    let nvcc = out.join(&nvcc_rel);
    if fs::symlink_metadata(&nvcc)
        .map(|m| !m.file_type().is_file())
        .unwrap_or(true)
        || !is_executable(&nvcc)
    {
        bail!(
            "{} is not an executable file: the nvidia-cuda-nvcc wheel is incomplete",
            nvcc.display()
        );
    }
    if !nvcc.with_file_name("nvcc.profile").is_file() {
        bail!(
            "no nvcc.profile beside {}: nvcc cannot find its tools without it",
            nvcc.display()
        );
    }
    let (cuda, nvcc_version) = nvcc_version(&nvcc)?;
    if !nvcc_version.starts_with(&format!("{major}.")) {
        bail!("nvcc reports {nvcc_version}, the wheels are CUDA {major}");
    }
    smoke_compile(&nvcc, &host.cc, &dir.logs)?;

    let cmake_rel = PathBuf::from("python/cmake/data/bin/cmake");
    let ninja_rel = PathBuf::from("bin/ninja");
    let cmake_version = cmake_version(&out.join(&cmake_rel))?;
    let ninja_version = ninja_version(&out.join(&ninja_rel))?;

    for (header, wheel) in [
        ("nvtx3/nvToolsExt.h", "nvidia-nvtx"),
        ("nvml.h", "nvidia-nvml-dev"),
    ] {
        if !cuda_home.join("include").join(header).is_file() {
            bail!(
                "no include/{header} in {}: the {wheel} wheel is missing or incomplete",
                cuda_home.display()
            );
        }
    }
    let target = cuda_rel.join(TARGET_DIR);
    let mut include_dirs = vec![target.join("include")];
    if cuda_home.join(TARGET_DIR).join("include/cccl").is_dir() {
        include_dirs.push(target.join("include/cccl"));
    } else {
        bail!(
            "no include/cccl in {}: the nvidia-cuda-cccl wheel is incomplete",
            cuda_home.display()
        );
    }
    let stored = Stored {
        schema: 1,
        wheels: pins.to_vec(),
        cuda_home: cuda_rel.clone(),
        nvcc: nvcc_rel,
        cuda_include_dirs: include_dirs,
        cudart_lib_dir: target.join("lib"),
        cuda_stubs_dir: target.join("lib/stubs"),
        cmake: cmake_rel,
        ninja: ninja_rel,
        cuda,
        nvcc_version,
        cmake_version,
        ninja_version,
        libcuda_stub_symbols: stub_symbols,
    };
    let path = out.join(TOOLCHAIN_FILE);
    fs::write(&path, serde_json::to_string_pretty(&stored)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// nvcc.profile adds `-I$(TOP)/targets/x86_64-linux/include`, and CMake's FindCUDAToolkit
/// wants `libcudart.so`: the wheels have neither, so add the links a toolkit has.
fn make_toolkit_layout(cuda_home: &Path, major: u64) -> Result<()> {
    if !cuda_home.join("include/cuda_runtime.h").is_file() {
        bail!(
            "{} has no include/cuda_runtime.h: the nvidia-cuda-runtime wheel is missing or changed layout",
            cuda_home.display()
        );
    }
    let target = cuda_home.join(TARGET_DIR);
    fs::create_dir_all(&target)?;
    link(Path::new("../../include"), &target.join("include"))?;
    link(Path::new("../../lib"), &target.join("lib"))?;
    link(Path::new("lib"), &cuda_home.join("lib64"))?;
    let versioned = format!("libcudart.so.{major}");
    if !cuda_home.join("lib").join(&versioned).is_file() {
        bail!("{} has no lib/{versioned}", cuda_home.display());
    }
    link(Path::new(&versioned), &cuda_home.join("lib/libcudart.so"))?;
    Ok(())
}

fn link(target: &Path, at: &Path) -> Result<()> {
    symlink(target, at)
        .with_context(|| format!("cannot link {} -> {}", at.display(), target.display()))
}

/// Compile one kernel for sm_90: proves cicc, ptxas, the headers and the host compiler
/// fit together, which `--version` alone does not.
fn smoke_compile(nvcc: &Path, cc: &Path, work: &Path) -> Result<()> {
    let src = work.join("smoke.cu");
    let obj = work.join("smoke.o");
    fs::write(
        &src,
        "#include <cuda_runtime.h>\n__global__ void k(int *p) { *p = 1; }\n",
    )?;
    let sh = Shell::new()?;
    commstack_exec::output(
        "the provisioned nvcc compiling a one-line kernel",
        &mut cmd!(sh, "{nvcc} -ccbin {cc} -arch=sm_90 -c {src} -o {obj}").into(),
    )?;
    fs::remove_file(&src).ok();
    fs::remove_file(&obj).ok();
    Ok(())
}

/// Read a provisioned step back (no tool is run but the host compilers' `--version`).
pub fn load_provisioned(step_dir: &Path) -> Result<Toolchain> {
    let path = step_dir.join(TOOLCHAIN_FILE);
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let s: Stored = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a toolchain record", path.display()))?;
    let host = host_compilers()?;
    let abs = |p: &Path| step_dir.join(p);
    Ok(Toolchain {
        source: ToolchainSource::Wheels {
            wheels: s.wheels,
            step: step_dir.to_path_buf(),
        },
        cuda_home: abs(&s.cuda_home),
        nvcc: abs(&s.nvcc),
        cuda_include_dirs: s.cuda_include_dirs.iter().map(|p| abs(p)).collect(),
        cudart_lib_dir: abs(&s.cudart_lib_dir),
        cuda_stubs_dir: Some(abs(&s.cuda_stubs_dir)),
        cmake: abs(&s.cmake),
        ninja: abs(&s.ninja),
        cc: host.cc,
        cxx: host.cxx,
        versions: ToolVersions {
            nvcc: s.nvcc_version,
            cuda: s.cuda,
            cmake: s.cmake_version,
            ninja: s.ninja_version,
            cc: host.cc_version,
            cxx: host.cxx_version,
        },
    })
}
