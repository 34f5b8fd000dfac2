//! The CMake command line of the recipe: every option with `-D`, tools by absolute path.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_toolchain::Toolchain;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::options::NvshmemOptions;

/// The install prefix compiled into the build (the build-variable string embeds it):
/// fixed, so the same inputs give the same bytes wherever the store lives. The build is
/// installed with DESTDIR and moved into the step directory; nothing reads this path at
/// run time (RUNPATH is `$ORIGIN`).
pub const INSTALL_PREFIX: &str = "/opt/commstack/nvshmem";
/// What the private source copy's path is mapped to in debug info and `__FILE__`.
pub const SOURCE_PREFIX_MAP: &str = "/opt/commstack/src/nvshmem";

/// rdma-core found under a prefix: headers and libmlx5.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RdmaCore {
    pub prefix: PathBuf,
    pub include_dir: PathBuf,
    pub lib_dir: PathBuf,
    pub libmlx5: PathBuf,
    /// sha256 of infiniband/mlx5dv.h: names the rdma-core release in the step key.
    pub mlx5dv_h_sha256: String,
}

/// Look for `infiniband/mlx5dv.h` and `libmlx5.so` under `prefix` (`/`, `/usr`, or an
/// unpacked `dpkg -x` tree). The error says which packages provide them.
pub fn find_rdma_core(prefix: &Path) -> Result<RdmaCore> {
    // CMake runs in the build tree, where a relative prefix points elsewhere; and the
    // prefix is in the step key, so one tree must have one spelling.
    let prefix = &match fs::canonicalize(prefix) {
        Ok(p) => p,
        // Missing: the checks below say what to install.
        Err(_) => std::path::absolute(prefix)
            .with_context(|| format!("cannot make {} absolute", prefix.display()))?,
    };
    let include_dir = ["include", "usr/include"]
        .iter()
        .map(|d| prefix.join(d))
        .find(|d| d.join("infiniband/mlx5dv.h").is_file() && d.join("infiniband/verbs.h").is_file())
        .with_context(|| {
            format!(
                "no infiniband/mlx5dv.h and verbs.h under {p}/include or {p}/usr/include: NVSHMEM's IBGDA (and IBRC, \
                 IBDEVX) build against rdma-core's headers and libmlx5. Two ways out: install libibverbs-dev \
                 ibverbs-providers (Debian/Ubuntu: `apt-get install libibverbs-dev ibverbs-providers`; without root: \
                 `apt-get download libibverbs-dev ibverbs-providers libibverbs1`, `dpkg -x` each into one directory and \
                 pass it with `--rdma-core DIR`), or turn IBGDA off: `[nvshmem] ibgda = false` in the stack file or \
                 `build --no-ibgda` (then DeepEP has no internode kernels; ibrc and ibdevx must be off too)",
                p = prefix.display()
            )
        })?;
    let lib_dir = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu", "lib64", "usr/lib64", "lib", "usr/lib"]
        .iter()
        .map(|d| prefix.join(d))
        .find(|d| d.join("libmlx5.so").exists() || d.join("libmlx5.so.1").exists())
        .with_context(|| {
            format!(
                "rdma-core headers found in {}, but no libmlx5.so under {}: install ibverbs-providers (and libibverbs-dev \
                 for the libmlx5.so link)",
                include_dir.display(),
                prefix.display()
            )
        })?;
    let libmlx5 = if lib_dir.join("libmlx5.so").exists() {
        lib_dir.join("libmlx5.so")
    } else {
        lib_dir.join("libmlx5.so.1")
    };
    let header = fs::read(include_dir.join("infiniband/mlx5dv.h"))?;
    Ok(RdmaCore {
        prefix: prefix.to_path_buf(),
        include_dir,
        lib_dir,
        libmlx5,
        mlx5dv_h_sha256: hex::encode(Sha256::digest(&header)),
    })
}

/// Every `-D` of the configure step, in a stable order.
pub fn cmake_defines(
    opts: &NvshmemOptions,
    tc: &Toolchain,
    python3: &Path,
    src_dir: &Path,
    rdma: Option<&RdmaCore>,
) -> Result<Vec<(String, String)>> {
    let cuda_home = tc.cuda_home.display().to_string();
    let mut d: Vec<(String, String)> = vec![
        ("CMAKE_BUILD_TYPE".into(), "release".into()),
        ("CMAKE_INSTALL_PREFIX".into(), INSTALL_PREFIX.into()),
        ("NVSHMEM_PREFIX".into(), INSTALL_PREFIX.into()),
        ("CMAKE_MAKE_PROGRAM".into(), tc.ninja.display().to_string()),
        ("CMAKE_C_COMPILER".into(), tc.cc.display().to_string()),
        ("CMAKE_CXX_COMPILER".into(), tc.cxx.display().to_string()),
        ("CMAKE_CUDA_COMPILER".into(), tc.nvcc.display().to_string()),
        (
            "CMAKE_CUDA_HOST_COMPILER".into(),
            tc.cxx.display().to_string(),
        ),
        ("CUDAToolkit_ROOT".into(), cuda_home.clone()),
        ("CUDA_HOME".into(), cuda_home.clone()),
        ("NVSHMEM_DEVICELIB_CUDA_HOME".into(), cuda_home),
        ("CMAKE_CUDA_ARCHITECTURES".into(), opts.cuda_architectures()),
        ("Python3_EXECUTABLE".into(), python3.display().to_string()),
        // No user or system package registry: find_package sees only what we pass.
        ("CMAKE_FIND_USE_PACKAGE_REGISTRY".into(), "OFF".into()),
        (
            "CMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY".into(),
            "OFF".into(),
        ),
    ];
    d.extend(opts.nvshmem_switches());
    d.extend(opts.homes());

    let map = format!(
        "-ffile-prefix-map={}={SOURCE_PREFIX_MAP}",
        src_dir.display()
    );
    let c_flags = [map.clone()];
    let cuda_flags = [format!("-Xcompiler={map}")];
    let mut link_flags = Vec::new();
    // rdma-core's headers reach the compilers through CPATH (see `build_env_extra`):
    // NVSHMEM's device sub-project gets no flags from here, yet includes mlx5dv.h.
    if let Some(r) = rdma {
        link_flags.push(format!("-Wl,-rpath-link,{}", r.lib_dir.display()));
        d.push(("MLX5_lib".into(), r.libmlx5.display().to_string()));
    } else if opts.needs_rdma_core() {
        bail!(
            "IBGDA/IBRC/IBDEVX are on but no rdma-core prefix was found: install libibverbs-dev ibverbs-providers \
             (or pass a `dpkg -x` tree of them with `--rdma-core DIR`), or turn IBGDA off: `[nvshmem] ibgda = false` \
             in the stack file or `build --no-ibgda`"
        );
    }
    d.push(("CMAKE_C_FLAGS".into(), c_flags.join(" ")));
    d.push(("CMAKE_CXX_FLAGS".into(), c_flags.join(" ")));
    d.push(("CMAKE_CUDA_FLAGS".into(), cuda_flags.join(" ")));
    d.push(("CMAKE_SHARED_LINKER_FLAGS".into(), link_flags.join(" ")));
    if let Some(llvm) = &opts.bitcode_llvm {
        if !llvm.join("bin/clang").is_file() {
            bail!(
                "the bitcode library needs clang: no {}/bin/clang",
                llvm.display()
            );
        }
        d.push(("NVSHMEM_CLANG_DIR".into(), llvm.display().to_string()));
    }
    Ok(d)
}

/// nvcc flags that take the process out of its output (measured on nvcc 13.0):
/// - `-objtemp`: an STT_FILE symbol names nvcc's temporary file, `tmpxft_<pid>_...`;
///   with it the intermediates are named after the object.
/// - `-Xcudafe --frandom-seed=...`: cudafe++ names a translation unit's module id (the
///   suffix of `__fatbinwrap_*`, `__nv_static_*`, anonymous namespaces) after its first
///   host-visible external function or variable; a unit with none (NVSHMEM's
///   `transfer_device.cu`: all under `#ifdef __CUDA_ARCH__` or templates) gets a hash of
///   the time and the pid instead, unless given a seed. The id still hashes the source's
///   path and name, so units stay distinct; the same source compiled for two targets
///   gets one id, as every unit with an external entity already does.
pub const REPRODUCIBLE_NVCC_FLAGS: &str = "-objtemp -Xcudafe --frandom-seed=commstack";

/// Environment variables the recipe sets for the compilers: CPATH with rdma-core's
/// include directory, the only way into NVSHMEM's ExternalProject device build (its
/// `ibgda_device.cuh` includes `infiniband/mlx5dv.h`). nvcc preprocesses with the host
/// compiler, which reads CPATH for device code too.
pub fn build_env_extra(rdma: Option<&RdmaCore>) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    // The variable reaches every nvcc call, the device sub-project's too.
    env.insert(
        "NVCC_APPEND_FLAGS".to_string(),
        REPRODUCIBLE_NVCC_FLAGS.to_string(),
    );
    if let Some(r) = rdma {
        env.insert("CPATH".to_string(), r.include_dir.display().to_string());
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_rdma_core_names_the_packages() {
        let d = tempfile::tempdir().unwrap();
        let e = find_rdma_core(d.path()).unwrap_err().to_string();
        assert!(
            e.contains("libibverbs-dev")
                && e.contains("ibverbs-providers")
                && e.contains("rdma-core"),
            "{e}"
        );
        // Both ways out: the packages, or IBGDA off (in the stack file or on the command).
        assert!(
            e.contains("install libibverbs-dev ibverbs-providers")
                && e.contains("turn IBGDA off: `[nvshmem] ibgda = false`")
                && e.contains("`build --no-ibgda`"),
            "{e}"
        );
    }

    #[test]
    fn finds_a_dpkg_x_tree() {
        let d = tempfile::tempdir().unwrap();
        let inc = d.path().join("usr/include/infiniband");
        fs::create_dir_all(&inc).unwrap();
        fs::write(inc.join("mlx5dv.h"), "x").unwrap();
        fs::write(inc.join("verbs.h"), "y").unwrap();
        let lib = d.path().join("usr/lib/x86_64-linux-gnu");
        fs::create_dir_all(&lib).unwrap();
        fs::write(lib.join("libmlx5.so.1"), "").unwrap();
        std::os::unix::fs::symlink("libmlx5.so.1", lib.join("libmlx5.so")).unwrap();
        let r = find_rdma_core(d.path()).unwrap();
        let root = fs::canonicalize(d.path()).unwrap();
        assert_eq!(r.include_dir, root.join("usr/include"));
        assert_eq!(r.libmlx5, root.join("usr/lib/x86_64-linux-gnu/libmlx5.so"));

        // Given relative (as on a command line), the paths CMake gets are absolute.
        let depth = std::env::current_dir().unwrap().components().count() - 1;
        let relative = PathBuf::from("../".repeat(depth)).join(d.path().strip_prefix("/").unwrap());
        let r = find_rdma_core(&relative).unwrap();
        assert_eq!(
            r.prefix, root,
            "one tree, one spelling (it is in the step key)"
        );
        assert!(r.libmlx5.exists());
    }
}
