//! The environment DeepEP's `setup.py` runs in: empty, then an explicit list computed
//! from the stack. Nothing is inherited from the caller's shell.
//!
//! DeepEP's setup.py and torch's extension builder read many variables (below): a stray
//! `TORCH_CUDA_ARCH_LIST`, `NVSHMEM_DIR` or `DISABLE_SM90_FEATURES` in a user's shell
//! would silently change the wheel. Starting from nothing removes them all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use commstack_stack::manifest::DeepEpApi;
use commstack_toolchain::Toolchain;
use serde::{Deserialize, Serialize};

/// Variables that change a DeepEP build when set, and so are never inherited (the
/// recipe sets the ones it needs). Documentation, and the list the tests check.
pub const NEVER_INHERITED: [&str; 33] = [
    // DeepEP V1 setup.py
    "NVSHMEM_DIR",
    "TORCH_CUDA_ARCH_LIST",
    "DISABLE_SM90_FEATURES",
    "DISABLE_AGGRESSIVE_PTX_INSTRS",
    "TOPK_IDX_BITS",
    // DeepEP V2 setup.py and deep_ep/utils/find_pkgs.py
    "EP_NVSHMEM_ROOT_DIR",
    "EP_NCCL_ROOT_DIR",
    "NCCL_DIR",
    "EP_NUM_TOPK_IDX_BITS",
    "EP_JIT_CACHE_DIR",
    "EP_JIT_PRINT_COMPILER_COMMAND",
    "EP_JIT_NVCC_COMPILER",
    // torch.utils.cpp_extension
    "CUDA_HOME",
    "CUDA_PATH",
    "MAX_JOBS",
    "TORCH_EXTENSIONS_DIR",
    "TORCH_DONT_CHECK_COMPILER_ABI",
    // compilers and linker
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "LDSHARED",
    "LDCXXSHARED",
    "CPATH",
    "LIBRARY_PATH",
    "LD_LIBRARY_PATH",
    "NVCC_APPEND_FLAGS",
    "NVCC_PREPEND_FLAGS",
    // Python
    "PYTHONPATH",
    "PYTHONHOME",
    // every tool that records a time
    "SOURCE_DATE_EPOCH",
];

/// What the environment is computed from.
#[derive(Clone, Debug)]
pub struct EnvInputs<'a> {
    pub api: DeepEpApi,
    /// The `bin` directory of the Python environment that builds (first on PATH).
    pub python_bin_dir: &'a Path,
    pub toolchain: &'a Toolchain,
    /// The NVSHMEM install prefix (`include/`, `lib/libnvshmem_host.so`, `lib/libnvshmem_device.a`).
    pub nvshmem_prefix: &'a Path,
    /// V2 only: the NCCL root (`include/nccl.h`, `lib/libnccl.so.2`), the environment's own.
    pub nccl_root: Option<&'a Path>,
    /// More include directories for CPATH, after the cccl one, each with why: rdma-core's
    /// (NVSHMEM's IBGDA headers include infiniband/mlx5dv.h), the environment's CUDA
    /// library headers (torch's ATen includes cusparse.h, cublas_v2.h, ...).
    pub extra_include: &'a [(PathBuf, String)],
    /// `TORCH_CUDA_ARCH_LIST` (see [`crate::archs`]).
    pub torch_cuda_arch_list: &'a str,
    pub jobs: usize,
    /// Private HOME and TMPDIR for the build.
    pub home: &'a Path,
    pub tmp: &'a Path,
    /// The build directory: `git` must not find a repository above it (setup.py asks
    /// `git rev-parse` for a version suffix).
    pub git_ceiling: &'a Path,
    /// `-ffile-prefix-map=OLD=NEW` flags (see [`crate::reproducible`]): to gcc through
    /// CPPFLAGS, to nvcc through NVCC_APPEND_FLAGS.
    pub prefix_maps: &'a [String],
    /// nvcc has `-objtemp`: its temp file names (the objects' STT_FILE) follow the object.
    pub nvcc_objtemp: bool,
    /// A directory holding the `ld` that rewrites the build machine's rpaths (given to
    /// gcc's link as `-B<dir>/` through LDFLAGS).
    pub ld_wrapper_dir: Option<&'a Path>,
    /// SOURCE_DATE_EPOCH: what every tool that records a time writes.
    pub source_date_epoch: u64,
}

/// The computed environment and why each stack-driven variable is there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildEnv {
    pub vars: BTreeMap<String, String>,
    /// One line per decision a rule or a trap made (for the build report).
    pub notes: Vec<String>,
}

/// The whole environment of the DeepEP build.
pub fn build_env(i: &EnvInputs<'_>) -> Result<BuildEnv> {
    let mut env = BuildEnv {
        vars: BTreeMap::new(),
        notes: Vec::new(),
    };
    process_env(i, &mut env);
    compilers(i, &mut env)?;
    include_path(i, &mut env)?;
    link_stub(i, &mut env)?;
    reproducible_flags(i, &mut env);
    pipe_flags(&mut env);
    Ok(env)
}

/// PATH, HOME, TMPDIR, the locale, the time and Python's switches.
fn process_env(i: &EnvInputs<'_>, env: &mut BuildEnv) {
    let tc = i.toolchain;
    let mut path: Vec<String> = vec![abs(i.python_bin_dir)];
    for dir in tc.bin_dirs() {
        push_unique(&mut path, abs(&dir));
    }
    // sh, coreutils, as/ld (gcc calls them by name), git for setup.py's version suffix.
    for dir in ["/usr/bin", "/bin"] {
        push_unique(&mut path, dir.to_string());
    }
    env.vars.insert("PATH".into(), path.join(":"));
    env.vars.insert("HOME".into(), abs(i.home));
    env.vars.insert("TMPDIR".into(), abs(i.tmp));
    env.vars.insert("LANG".into(), "C.UTF-8".into());
    env.vars.insert("LC_ALL".into(), "C.UTF-8".into());
    env.vars.insert("TZ".into(), "UTC".into());
    // bdist_wheel stamps zip entries with it (the wheel is rewritten with it anyway),
    // gcc's __DATE__/__TIME__ too.
    env.vars
        .insert("SOURCE_DATE_EPOCH".into(), i.source_date_epoch.to_string());
    env.vars
        .insert("GIT_CEILING_DIRECTORIES".into(), abs(i.git_ceiling));
    env.vars.insert("PYTHONNOUSERSITE".into(), "1".into());
    env.vars
        .insert("PYTHONDONTWRITEBYTECODE".into(), "1".into());
    env.vars.insert("PYTHONHASHSEED".into(), "0".into());
}

/// The compilers, the jobs and archs, NVSHMEM and (V2) NCCL.
fn compilers(i: &EnvInputs<'_>, env: &mut BuildEnv) -> Result<()> {
    let tc = i.toolchain;
    env.vars.insert("CUDA_HOME".into(), abs(&tc.cuda_home));
    env.vars.insert("CC".into(), abs(&tc.cc));
    env.vars.insert("CXX".into(), abs(&tc.cxx));
    env.vars
        .insert("MAX_JOBS".into(), i.jobs.max(1).to_string());
    env.vars.insert(
        "TORCH_CUDA_ARCH_LIST".into(),
        i.torch_cuda_arch_list.to_string(),
    );
    env.vars.insert("NVSHMEM_DIR".into(), abs(i.nvshmem_prefix));
    env.notes.push(format!(
        "NVSHMEM_DIR: the stack's NVSHMEM install {}",
        abs(i.nvshmem_prefix)
    ));

    if i.api == DeepEpApi::V2 {
        let Some(nccl) = i.nccl_root else {
            bail!(
                "DeepEP V2 builds against NCCL's device API: the build needs the environment's NCCL (nvidia/nccl)"
            );
        };
        env.vars.insert("NCCL_DIR".into(), abs(nccl));
        env.notes.push(format!(
            "NCCL_DIR: the environment's own NCCL {} (one libnccl per process)",
            nccl.display()
        ));
    }
    Ok(())
}

/// CPATH: libcu++'s directory (CUDA 13) and the extra include directories.
fn include_path(i: &EnvInputs<'_>, env: &mut BuildEnv) -> Result<()> {
    let tc = i.toolchain;
    // CUDA 13 moved libcu++ (cuda/std/...) under include/cccl; g++ compiling DeepEP's
    // .cpp files does not look there (rule deepep-v1-cccl; V2's setup.py hard-codes
    // /usr/local/cuda/include/cccl, which a wheel toolchain does not have).
    if commstack_stack::rules::libcxx_under_cccl(u64::from(tc.cuda_major())) {
        let cccl: Vec<&PathBuf> = tc
            .cuda_include_dirs
            .iter()
            .filter(|d| d.ends_with("cccl"))
            .collect();
        if cccl.is_empty() {
            bail!(
                "the CUDA {} toolchain at {} has no include/cccl directory: DeepEP's sources include cuda/std/tuple from it (install or lock nvidia-cuda-cccl)",
                tc.versions.cuda,
                tc.cuda_home.display()
            );
        }
        let joined: Vec<String> = cccl.iter().map(|d| abs(d)).collect();
        env.vars.insert("CPATH".into(), joined.join(":"));
        env.notes.push(format!(
            "CPATH: {} (CUDA {}: cuda/std/tuple lives there; rule deepep-v1-cccl)",
            joined.join(":"),
            tc.versions.cuda
        ));
    }
    for (dir, why) in i.extra_include {
        let cpath = env.vars.entry("CPATH".to_string()).or_default();
        if !cpath.is_empty() {
            cpath.push(':');
        }
        cpath.push_str(&abs(dir));
        env.notes.push(format!("CPATH: + {} ({why})", abs(dir)));
    }
    Ok(())
}

/// LIBRARY_PATH: the libcuda link stub.
fn link_stub(i: &EnvInputs<'_>, env: &mut BuildEnv) -> Result<()> {
    let tc = i.toolchain;
    // DeepEP links -lcuda. The stub (SONAME libcuda.so.1) is found through LIBRARY_PATH,
    // which gcc searches after the -L directories and before the system ones: the link
    // is the same on a machine with a driver and one without.
    let Some(stubs) = &tc.cuda_stubs_dir else {
        bail!(
            "the toolchain at {} has no libcuda.so link stub (lib/stubs): DeepEP links -lcuda. Use the wheel toolchain (`cargo xtask toolchain`, it makes one) or a CUDA toolkit that has targets/x86_64-linux/lib/stubs",
            tc.cuda_home.display()
        );
    };
    let mut dirs = vec![abs(stubs)];
    env.notes.push(format!(
        "LIBRARY_PATH: the libcuda link stub in {} (never shipped)",
        abs(stubs)
    ));
    // V2's setup.py links `-l:libnccl.so.2` with no -L for the NCCL root (setup.py:120-124:
    // only an rpath): where no system NCCL is, the link fails "cannot find
    // -l:libnccl.so.2" unless the root's lib/ is searched.
    if let (DeepEpApi::V2, Some(nccl)) = (i.api, i.nccl_root) {
        let lib = abs(&nccl.join("lib"));
        env.notes.push(format!(
            "LIBRARY_PATH: + {lib} (V2's setup.py links -l:libnccl.so.2 without -L)"
        ));
        dirs.push(lib);
    }
    env.vars.insert("LIBRARY_PATH".into(), dirs.join(":"));
    Ok(())
}

/// The flags that make the bytes reproducible.
fn reproducible_flags(i: &EnvInputs<'_>, env: &mut BuildEnv) {
    // Reproducible bytes (crate::reproducible says why each is needed).
    if !i.prefix_maps.is_empty() {
        // CPPFLAGS, not CFLAGS: setuptools appends CPPFLAGS to Python's own compile flags
        // (-DNDEBUG, -g, ...) where CFLAGS would replace them.
        env.vars.insert("CPPFLAGS".into(), i.prefix_maps.join(" "));
        env.notes.push(
            "CPPFLAGS: -ffile-prefix-map for each input and the source tree: __FILE__ and DWARF name no build path".into(),
        );
    }
    let mut nvcc: Vec<String> = Vec::new();
    if i.nvcc_objtemp {
        nvcc.push("-objtemp".into());
    }
    nvcc.extend(i.prefix_maps.iter().map(|m| format!("-Xcompiler={m}")));
    if !nvcc.is_empty() {
        env.vars.insert("NVCC_APPEND_FLAGS".into(), nvcc.join(" "));
        env.notes.push(format!(
            "NVCC_APPEND_FLAGS: {}the same -ffile-prefix-map for nvcc's host compiler and preprocessor (every nvcc call of cpp_extension, the device link too)",
            if i.nvcc_objtemp {
                "-objtemp (the STT_FILE of each object names <object>.cudafe1.cpp, not tmpxft_<pid>_...), "
            } else {
                "(this nvcc has no -objtemp: objects name nvcc's temp file tmpxft_<pid>_..., which is not reproducible) "
            }
        ));
    }
    if let Some(dir) = i.ld_wrapper_dir {
        env.vars
            .insert("LDFLAGS".into(), format!("-B{}/", abs(dir)));
        env.notes.push(format!(
            "LDFLAGS: -B{}/: the link runs its ld, which rewrites the build machine's NVSHMEM rpath to $ORIGIN (each rewrite is in the log)",
            abs(dir)
        ));
    }
}

/// gcc's `-pipe`, for the host compiles and nvcc's: the assembly goes to `as` as it is
/// written instead of through a temp file, so the assembler runs beside the compiler.
/// DeepEP's longest job, python_api.cpp (43 MB of `-g` assembly), took 54.2 s instead of
/// 55.4 s on the CPU machine, its object byte for byte the same.
fn pipe_flags(env: &mut BuildEnv) {
    for (var, flag) in [
        ("CPPFLAGS", "-pipe"),
        ("NVCC_APPEND_FLAGS", "-Xcompiler=-pipe"),
    ] {
        let value = env.vars.entry(var.to_string()).or_default();
        if !value.is_empty() {
            value.push(' ');
        }
        value.push_str(flag);
    }
    env.notes.push(
        "CPPFLAGS, NVCC_APPEND_FLAGS: -pipe for gcc (the assembler runs beside the compiler; the same objects, sooner)".into(),
    );
}

/// Absolute (the build runs in another directory), symlinks kept as they are.
fn abs(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .display()
        .to_string()
}

fn push_unique(list: &mut Vec<String>, item: String) {
    if !list.contains(&item) {
        list.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commstack_toolchain::{ToolVersions, ToolchainSource};

    pub(crate) fn toolchain(cuda: &str, stubs: bool) -> Toolchain {
        let home = PathBuf::from("/tc/cuda");
        let include = home.join("targets/x86_64-linux/include");
        Toolchain {
            source: ToolchainSource::System,
            cuda_home: home.clone(),
            nvcc: home.join("bin/nvcc"),
            cuda_include_dirs: vec![include.clone(), include.join("cccl")],
            cudart_lib_dir: home.join("targets/x86_64-linux/lib"),
            cuda_stubs_dir: stubs.then(|| home.join("targets/x86_64-linux/lib/stubs")),
            cmake: PathBuf::from("/tc/bin/cmake"),
            ninja: PathBuf::from("/tc/bin/ninja"),
            cc: PathBuf::from("/usr/bin/gcc"),
            cxx: PathBuf::from("/usr/bin/g++"),
            versions: ToolVersions {
                nvcc: format!("{cuda}.88"),
                cuda: cuda.into(),
                cmake: "4.1.3".into(),
                ninja: "1.13.2".into(),
                cc: "gcc 13".into(),
                cxx: "g++ 13".into(),
            },
        }
    }

    fn inputs<'a>(tc: &'a Toolchain, api: DeepEpApi, nccl: Option<&'a Path>) -> EnvInputs<'a> {
        EnvInputs {
            api,
            python_bin_dir: Path::new("/venv/bin"),
            toolchain: tc,
            nvshmem_prefix: Path::new("/store/nvshmem-x/nvshmem"),
            nccl_root: nccl,
            extra_include: &[],
            torch_cuda_arch_list: "9.0",
            jobs: 16,
            home: Path::new("/w/home"),
            tmp: Path::new("/w/tmp"),
            git_ceiling: Path::new("/w"),
            prefix_maps: &[],
            nvcc_objtemp: false,
            ld_wrapper_dir: None,
            source_date_epoch: 315_532_800,
        }
    }

    #[test]
    fn v1_on_cuda_13_gets_the_stack_values_and_the_cccl_path() {
        let tc = toolchain("13.0", true);
        let env = build_env(&inputs(&tc, DeepEpApi::V1, None)).unwrap();
        let v = &env.vars;
        assert_eq!(v["NVSHMEM_DIR"], "/store/nvshmem-x/nvshmem");
        assert_eq!(v["TORCH_CUDA_ARCH_LIST"], "9.0");
        assert_eq!(v["CPATH"], "/tc/cuda/targets/x86_64-linux/include/cccl");
        assert_eq!(v["MAX_JOBS"], "16");
        assert_eq!(v["CUDA_HOME"], "/tc/cuda");
        assert_eq!(v["LIBRARY_PATH"], "/tc/cuda/targets/x86_64-linux/lib/stubs");
        assert_eq!(v["PATH"], "/venv/bin:/tc/cuda/bin:/tc/bin:/usr/bin:/bin");
        assert!(!v.contains_key("NCCL_DIR"));
        assert!(env.notes.iter().any(|n| n.contains("deepep-v1-cccl")));
    }

    #[test]
    fn only_the_allowlist_is_set() {
        // The process-level proof (a real setup.py sees exactly these and nothing of the
        // caller's) is in tests/build_fixture.rs.
        let tc = toolchain("13.0", true);
        let after = build_env(&inputs(&tc, DeepEpApi::V1, None)).unwrap();
        let allowed = [
            "PATH",
            "HOME",
            "TMPDIR",
            "LANG",
            "LC_ALL",
            "TZ",
            "SOURCE_DATE_EPOCH",
            "GIT_CEILING_DIRECTORIES",
            "PYTHONNOUSERSITE",
            "PYTHONDONTWRITEBYTECODE",
            "PYTHONHASHSEED",
            "CUDA_HOME",
            "CC",
            "CXX",
            "MAX_JOBS",
            "TORCH_CUDA_ARCH_LIST",
            "NVSHMEM_DIR",
            "CPATH",
            "LIBRARY_PATH",
            // -pipe only (pipe_flags).
            "CPPFLAGS",
            "NVCC_APPEND_FLAGS",
        ];
        let keys: Vec<&str> = after.vars.keys().map(String::as_str).collect();
        let mut want = allowed.to_vec();
        want.sort();
        assert_eq!(keys, want);
        for k in NEVER_INHERITED {
            if !allowed.contains(&k) {
                assert!(!after.vars.contains_key(k), "{k} must not be set");
            }
        }
    }

    #[test]
    fn reproducibility_flags_reach_gcc_nvcc_and_the_link() {
        let tc = toolchain("13.0", true);
        let mut i = inputs(&tc, DeepEpApi::V1, None);
        let maps = [
            "-ffile-prefix-map=/f/src=.".to_string(),
            "-ffile-prefix-map=/f/deps/nvshmem=nvshmem".to_string(),
        ];
        i.prefix_maps = &maps;
        i.nvcc_objtemp = true;
        i.ld_wrapper_dir = Some(Path::new("/f/ld"));
        i.source_date_epoch = 1_796_083_200;
        let v = build_env(&i).unwrap().vars;
        assert_eq!(
            v["CPPFLAGS"],
            "-ffile-prefix-map=/f/src=. -ffile-prefix-map=/f/deps/nvshmem=nvshmem -pipe"
        );
        assert_eq!(
            v["NVCC_APPEND_FLAGS"],
            "-objtemp -Xcompiler=-ffile-prefix-map=/f/src=. -Xcompiler=-ffile-prefix-map=/f/deps/nvshmem=nvshmem -Xcompiler=-pipe"
        );
        assert_eq!(v["LDFLAGS"], "-B/f/ld/");
        assert_eq!(v["SOURCE_DATE_EPOCH"], "1796083200");
        // CFLAGS would replace Python's own flags (-DNDEBUG): never set.
        assert!(!v.contains_key("CFLAGS") && !v.contains_key("CXXFLAGS"));
    }

    #[test]
    fn rdma_core_headers_follow_the_cccl_path() {
        let tc = toolchain("13.0", true);
        let mut i = inputs(&tc, DeepEpApi::V1, None);
        let extra = [(
            PathBuf::from("/bundle/rdma-core/usr/include"),
            "mlx5dv.h".to_string(),
        )];
        i.extra_include = &extra;
        let env = build_env(&i).unwrap();
        assert_eq!(
            env.vars["CPATH"],
            "/tc/cuda/targets/x86_64-linux/include/cccl:/bundle/rdma-core/usr/include"
        );
    }

    #[test]
    fn v2_takes_the_environments_nccl_and_cuda_12_no_cccl() {
        let tc = toolchain("13.0", true);
        let env = build_env(&inputs(
            &tc,
            DeepEpApi::V2,
            Some(Path::new("/venv/site/nvidia/nccl")),
        ))
        .unwrap();
        assert_eq!(env.vars["NCCL_DIR"], "/venv/site/nvidia/nccl");
        // setup.py gives the linker no -L for it: LIBRARY_PATH after the stub.
        assert_eq!(
            env.vars["LIBRARY_PATH"],
            format!(
                "{}:/venv/site/nvidia/nccl/lib",
                env.vars["LIBRARY_PATH"].split(':').next().unwrap()
            )
        );
        assert!(
            build_env(&inputs(&tc, DeepEpApi::V2, None))
                .unwrap_err()
                .to_string()
                .contains("NCCL")
        );
        // V2's setup.py writes EP_JIT_CACHE_DIR, EP_NCCL_ROOT_DIR, EP_NUM_TOPK_IDX_BITS and
        // EP_JIT_PRINT_COMPILER_COMMAND of its environment into deep_ep/envs.py (defaults
        // at import): none is set, so the wheel bakes no path of the build machine and
        // find_nccl_root() finds the installed nvidia-nccl at run time.
        let ep: Vec<&String> = env.vars.keys().filter(|k| k.starts_with("EP_")).collect();
        assert!(ep.is_empty(), "{ep:?}");
        for name in crate::wheel_check::PERSISTENT_ENV_NAMES {
            assert!(NEVER_INHERITED.contains(&name), "{name}");
        }
        let tc12 = toolchain("12.9", true);
        let env = build_env(&inputs(&tc12, DeepEpApi::V1, None)).unwrap();
        assert!(!env.vars.contains_key("CPATH"));
    }

    #[test]
    fn missing_cccl_or_stub_is_an_error_that_says_what_to_do() {
        let mut tc = toolchain("13.0", true);
        tc.cuda_include_dirs.truncate(1);
        let err = build_env(&inputs(&tc, DeepEpApi::V1, None))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cuda/std/tuple") && err.contains("nvidia-cuda-cccl"),
            "{err}"
        );
        let tc = toolchain("13.0", false);
        let err = build_env(&inputs(&tc, DeepEpApi::V1, None))
            .unwrap_err()
            .to_string();
        assert!(err.contains("-lcuda") && err.contains("stub"), "{err}");
    }
}
