//! NVSHMEM self-test kernels: CUDA sources in `cu/` compiled by nvcc through `cc`
//! (see build.rs), driven from Rust with cudarc (driver API, loaded at run time).
//!
//! - [`nvshmem`]: NVSHMEM init/finalize (in Drop), symmetric memory, barriers;
//! - [`launch`]: the kernels (put bandwidth, MoE-style dispatch, signal ping-pong);
//! - [`rendezvous`]: hands rank 0's unique id to the other ranks over TCP;
//! - [`routing`], [`rng`]: seeded inputs and the CPU reference they are checked against;
//! - [`selftest`]: one rank's run; [`spawn`]: `--gpus N` on one machine;
//! - [`report`]: JSON report, table, verdict; [`options`]: command line.
//!
//! What calls the compiled kernels ([`ffi`], [`nvshmem`], [`launch`], [`selftest`]) and
//! the binary need the feature `cuda` (nvcc and NVSHMEM at build time: `cargo xtask
//! build kernels`); the rest builds and tests anywhere.

pub mod driver;
#[cfg(feature = "cuda")]
pub mod ffi;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod nvshmem;
pub mod options;
pub mod rendezvous;
pub mod report;
pub mod rng;
pub mod routing;
#[cfg(feature = "cuda")]
pub mod selftest;
pub mod spawn;

/// GPU architectures the kernels were compiled for, e.g. "90" or "90;100".
#[cfg(feature = "cuda")]
pub const BUILT_ARCHS: &str = env!("COMMSTACK_KERNELS_ARCHS");
/// nvcc and NVSHMEM versions and archs of this build (versions, not paths: the binary
/// names no directory of the machine that built it).
#[cfg(feature = "cuda")]
pub const BUILD_INFO: &str = env!("COMMSTACK_KERNELS_BUILD_INFO");
