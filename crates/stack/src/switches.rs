//! NVSHMEM's ON/OFF CMake options in one table. stack.toml's `[nvshmem]` keys, their
//! defaults and echo, crates/nvshmem's `NvshmemOptions` (and its JSON) and the `-D` list
//! are all made from it, so a new option is one row here plus its line in stack.toml.

/// Who may set a switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// stack.toml's `[nvshmem]` (and so the NVSHMEM build options).
    Stack,
    /// The NVSHMEM build options only: a recipe choice, not the stack's.
    Recipe,
    /// Nobody: always its default.
    Fixed,
}

/// One NVSHMEM CMake option.
#[derive(Debug)]
pub struct Switch {
    /// The stack.toml key (`ibgda`); with `_` for `-`, the NVSHMEM options' JSON field.
    pub key: &'static str,
    /// The CMake option (`NVSHMEM_IBGDA_SUPPORT`).
    pub cmake: &'static str,
    /// DeepEP's documented NVSHMEM build: IBGDA on, the other transports off.
    pub default: bool,
    pub scope: Scope,
    /// For an option that builds against an installed package: the CMake variable of
    /// its prefix (`UCX_HOME`); the switch is on exactly when a prefix is given.
    pub home: Option<&'static str>,
}

const fn row(
    key: &'static str,
    cmake: &'static str,
    default: bool,
    scope: Scope,
    home: Option<&'static str>,
) -> Switch {
    Switch {
        key,
        cmake,
        default,
        scope,
        home,
    }
}

use Scope::{Fixed, Recipe, Stack};

/// Every switch, in the order the `-D` list passes them (part of the build's identity:
/// reordering changes NVSHMEM's configure command line).
pub const SWITCHES: &[Switch] = &[
    row("ibgda", "NVSHMEM_IBGDA_SUPPORT", true, Stack, None),
    row(
        "ibgda-gpumem-only",
        "NVSHMEM_IBGDA_SUPPORT_GPUMEM_ONLY",
        false,
        Recipe,
        None,
    ),
    row("ibrc", "NVSHMEM_IBRC_SUPPORT", false, Stack, None),
    row("ibdevx", "NVSHMEM_IBDEVX_SUPPORT", false, Stack, None),
    row("ucx", "NVSHMEM_UCX_SUPPORT", false, Stack, Some("UCX_HOME")),
    row(
        "libfabric",
        "NVSHMEM_LIBFABRIC_SUPPORT",
        false,
        Stack,
        Some("LIBFABRIC_HOME"),
    ),
    row(
        "gdrcopy",
        "NVSHMEM_USE_GDRCOPY",
        false,
        Stack,
        Some("GDRCOPY_HOME"),
    ),
    row("mpi", "NVSHMEM_MPI_SUPPORT", false, Stack, Some("MPI_HOME")),
    row(
        "shmem",
        "NVSHMEM_SHMEM_SUPPORT",
        false,
        Stack,
        Some("SHMEM_HOME"),
    ),
    row(
        "pmix",
        "NVSHMEM_PMIX_SUPPORT",
        false,
        Stack,
        Some("PMIX_HOME"),
    ),
    // The bootstrap is chosen at run time (NVSHMEM_BOOTSTRAP), never baked in.
    row("default-pmix", "NVSHMEM_DEFAULT_PMIX", false, Fixed, None),
    row("default-ucx", "NVSHMEM_DEFAULT_UCX", false, Fixed, None),
    row("mlx5dv", "NVSHMEM_USE_MLX5DV", true, Recipe, None),
    row("nvtx", "NVSHMEM_NVTX", true, Recipe, None),
    row("dlmalloc", "NVSHMEM_USE_DLMALLOC", false, Recipe, None),
    // Device-ABI options: they change code compiled from NVSHMEM's headers, so they must
    // match what torch's and DeepEP's device code expect (NVIDIA's wheel: all off).
    row(
        "timeout-device-polling",
        "NVSHMEM_TIMEOUT_DEVICE_POLLING",
        false,
        Recipe,
        None,
    ),
    row(
        "gpu-coll-use-ldst",
        "NVSHMEM_GPU_COLL_USE_LDST",
        false,
        Recipe,
        None,
    ),
    row(
        "enable-all-device-inlining",
        "NVSHMEM_ENABLE_ALL_DEVICE_INLINING",
        false,
        Recipe,
        None,
    ),
    row("debug", "NVSHMEM_DEBUG", false, Recipe, None),
    row("devel", "NVSHMEM_DEVEL", false, Recipe, None),
    row("trace", "NVSHMEM_TRACE", false, Recipe, None),
    row("verbose", "NVSHMEM_VERBOSE", false, Recipe, None),
];

/// The row for `key` (stack.toml's spelling).
pub fn find(key: &str) -> Option<&'static Switch> {
    SWITCHES.iter().find(|s| s.key == key)
}

/// The rows stack.toml may set, in table order.
pub fn in_stack() -> impl Iterator<Item = &'static Switch> {
    SWITCHES.iter().filter(|s| s.scope == Scope::Stack)
}

/// Fixed by the recipe, never by the stack: NVSHMEM's tests, examples, Python library
/// (it would reach PyPI during the build), hydra launcher and packages are not part of
/// the stack.
pub const FIXED_OFF: [&str; 14] = [
    "NVSHMEM_BUILD_TESTS",
    "NVSHMEM_BUILD_EXAMPLES",
    "NVSHMEM_BUILD_CUTLASS_EXAMPLES",
    "NVSHMEM_BUILD_PYTHON_LIB",
    "NVSHMEM_BUILD_HYDRA_LAUNCHER",
    "NVSHMEM_BUILD_TXZ_PACKAGE",
    "NVSHMEM_BUILD_PACKAGES",
    "NVSHMEM_BUILD_RPM_PACKAGE",
    "NVSHMEM_BUILD_DEB_PACKAGE",
    "NVSHMEM_BUILD_TGZ_PACKAGE",
    "NVSHMEM_TEST_STATIC_LIB",
    "NVSHMEM_INSTALL_FUNCTIONAL_TESTS",
    "NVSHMEM_ENV_ALL",
    "NVSHMEM_DEFAULT_PMI2",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_options_are_unique_and_homes_belong_to_stack_switches() {
        for (i, s) in SWITCHES.iter().enumerate() {
            assert!(
                SWITCHES[..i]
                    .iter()
                    .all(|o| o.key != s.key && o.cmake != s.cmake),
                "{} is listed twice",
                s.key
            );
            assert!(s.cmake.starts_with("NVSHMEM_"), "{}", s.cmake);
            // A home is passed with --with KEY=PREFIX, which only stack switches take.
            assert!(s.home.is_none() || s.scope == Scope::Stack, "{}", s.key);
            // A home switch is on exactly when a prefix is given: it cannot default on.
            assert!(s.home.is_none() || !s.default, "{}", s.key);
        }
    }
}
