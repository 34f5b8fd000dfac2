//! NVSHMEM self-test kernels: CUDA sources in `cu/` compiled by nvcc through `cc`
//! (see build.rs), driven from Rust with cudarc (driver API, loaded at run time).
//!
//! - [`nvshmem`]: NVSHMEM init/finalize (in Drop), symmetric memory, barriers;
//! - [`launch`]: the kernels (put bandwidth, MoE-style dispatch, signal ping-pong);
//! - [`rendezvous`]: hands rank 0's unique id to the other ranks over TCP;
//! - [`routing`], [`rng`]: seeded inputs and the CPU reference they are checked against;
//! - [`selftest`]: one rank's run; [`spawn`]: `--gpus N` on one machine;
//! - [`report`]: JSON report, table, verdict; [`options`]: command line.

pub mod driver;
pub mod ffi;
pub mod launch;
pub mod nvshmem;
pub mod options;
pub mod rendezvous;
pub mod report;
pub mod rng;
pub mod routing;
pub mod selftest;
pub mod spawn;

/// GPU architectures the kernels were compiled for, e.g. "90" or "90;100".
pub const BUILT_ARCHS: &str = env!("COMMSTACK_KERNELS_ARCHS");
/// nvcc and NVSHMEM versions and archs of this build (versions, not paths: the binary
/// names no directory of the machine that built it).
pub const BUILD_INFO: &str = env!("COMMSTACK_KERNELS_BUILD_INFO");
