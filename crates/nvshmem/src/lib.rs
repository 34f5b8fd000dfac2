//! NVSHMEM built from source without NCCL, proven, and shipped as the only NVSHMEM.
//!
//! - [`NvshmemOptions`]: every NVSHMEM CMake option (the ON/OFF ones from the stack's
//!   switch table, see [`Switches`]; the stack maps onto it); `use_nccl = true` is
//!   refused with the reason.
//! - [`build`]: the hermetic build (empty environment + allowlist, every option with
//!   `-D`, Ninja, fixed install prefix) in a store step keyed by the source tree hash,
//!   the options and the toolchain; the [`BuildReport`] holds the [`Proof`] read back
//!   from the installed libraries.
//! - [`build_dropin_wheel`]: the install as `nvidia-nvshmem-cuXX==<torch's pin>+commstack.g<hash>`,
//!   laid out like NVIDIA's wheel; [`compare_wheels`] accounts for every difference
//!   with NVIDIA's wheel of the same version.

mod build;
mod cmake;
mod compare;
mod dropin;
pub mod env;
mod options;
mod proof;
mod source;
mod switches;
pub mod wheelset;

pub use build::{
    BuildReport, BuildRequest, Built, INSTALL_DIR, RECIPE as BUILD_RECIPE, REPORT_FILE,
    STEP as BUILD_STEP, SourceInfo, Timings, build, build_key, configure_only, load_report,
};
pub use cmake::{
    INSTALL_PREFIX, REPRODUCIBLE_NVCC_FLAGS, RdmaCore, SOURCE_PREFIX_MAP, cmake_defines,
    find_rdma_core,
};
pub use compare::{Comparison, Difference, DifferenceKind, compare_wheels};
pub use dropin::{
    DropIn, DropInSpec, RECIPE as DROPIN_RECIPE, STEP as DROPIN_STEP, WHEEL_REPORT_FILE,
    build_dropin_wheel, dropin_distribution, local_label,
};
pub use options::{FIXED_OFF, NvshmemOptions, UNUSED_HOME};
pub use proof::{Proof, parse_build_options_h};
pub use source::{copy_tree, source_version};
pub use switches::Switches;
