//! `nvshmem.pass-env`: which environment variables may reach the NVSHMEM build. NVSHMEM's
//! CMake takes the default of every option from the environment variable of the same
//! name (cmake_config/NVSHMEMEnv.cmake) and reads a few more (`CUDA_HOME`, `*_HOME`, ...);
//! compilers read `CC`, `CFLAGS`, `CPATH`; CMake reads `CMAKE_*`. The build starts from an
//! empty environment; these are the names a user may not let back in. One rule, used by
//! stack.toml's validation (so `lock` refuses them) and by the build.

use crate::switches::{FIXED_OFF, SWITCHES};

/// Variables NVSHMEM's CMake files read (3.4.5: NVSHMEMEnv.cmake, src/CMakeLists.txt,
/// src/device, src/modules/*/CMakeLists.txt.in, examples/).
pub const READ_BY_NVSHMEM_CMAKE: [&str; 12] = [
    "CUDA_HOME",
    "NVSHMEM_DEVICELIB_CUDA_HOME",
    "CMAKE_CCACHE_FLAGS",
    "GDRCOPY_HOME",
    "LIBFABRIC_HOME",
    "MPI_HOME",
    "NCCL_HOME",
    "PMIX_HOME",
    "PMI_HOME",
    "PMI2_HOME",
    "SHMEM_HOME",
    "UCX_HOME",
];

/// Variables that change what compilers, linkers or CMake do.
const TOOL_VARIABLES: [&str; 16] = [
    "CC",
    "CXX",
    "CUDACXX",
    "CUDAHOSTCXX",
    "CFLAGS",
    "CXXFLAGS",
    "CUDAFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "LIBRARY_PATH",
    "LD_LIBRARY_PATH",
    "CUTLASS_HOME",
    "DESTDIR",
];

/// Variables the recipe itself sets; a passthrough may not replace them.
const SET_BY_RECIPE: [&str; 10] = [
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "TZ",
    "SOURCE_DATE_EPOCH",
    "GIT_DIR",
    "GIT_CEILING_DIRECTORIES",
    "PWD",
];

/// Why `name` may not pass through to the NVSHMEM build, or None if it may. `lock`
/// (validating stack.toml) and the build apply this one rule.
pub fn refusal(name: &str) -> Option<String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Some(format!("{name:?} is not an environment variable name"));
    }
    if READ_BY_NVSHMEM_CMAKE.contains(&name) {
        return Some(format!(
            "{name} is read by NVSHMEM's CMake as a default; set the matching stack option instead"
        ));
    }
    // NVCC_APPEND_FLAGS/NVCC_PREPEND_FLAGS, LD_PRELOAD and friends, MAKEFLAGS: each one
    // changes what a tool does behind the recipe's explicit command lines.
    let tool_prefixes = ["CMAKE_", "NINJA", "NVCC_", "LD_", "CCACHE_"];
    if TOOL_VARIABLES.contains(&name)
        || matches!(
            name,
            "MAKEFLAGS" | "MFLAGS" | "GCC_EXEC_PREFIX" | "COMPILER_PATH"
        )
        || tool_prefixes.iter().any(|p| name.starts_with(p))
    {
        return Some(format!(
            "{name} changes how the compilers, linker or CMake behave; the recipe passes tools and flags explicitly"
        ));
    }
    if SET_BY_RECIPE.contains(&name) {
        return Some(format!("{name} is set by the recipe itself"));
    }
    if name.starts_with("NCCL_") {
        return Some(format!(
            "{name}: no NCCL_* variable belongs in an NVSHMEM build without NCCL"
        ));
    }
    if name.starts_with("NVSHMEM_") && is_build_option(name) {
        return Some(format!(
            "{name} is an NVSHMEM build option: NVSHMEM's CMake would take it as the default; set the stack option instead"
        ));
    }
    None
}

/// NVSHMEM_* names that are build options (NVSHMEMEnv.cmake). Runtime variables such as
/// NVSHMEM_DISABLE_NVLS or NVSHMEM_BOOTSTRAP are not.
fn is_build_option(name: &str) -> bool {
    SWITCHES.iter().any(|s| s.cmake == name)
        || FIXED_OFF.contains(&name)
        || matches!(
            name,
            "NVSHMEM_USE_NCCL"
                | "NVSHMEM_BUILD_BITCODE_LIBRARY"
                | "NVSHMEM_PREFIX"
                | "NVSHMEM_CLANG_DIR"
                | "NVSHMEM_EXAMPLES_INSTALL"
                // Build-variable string entries (debug and trace code compiled in).
                | "NVSHMEM_DEBUG"
                | "NVSHMEM_DEVEL"
                | "NVSHMEM_VERBOSE"
                | "NVSHMEM_TRACE"
                | "NVSHMEM_TIMEOUT_DEVICE_POLLING"
        )
}
