//! DeepEP built from the locked revision against the stack's NVSHMEM and torch, and the
//! Python environment around it.
//!
//! - [`env`]: the build environment, computed from the stack (an empty environment plus
//!   an explicit list: NVSHMEM_DIR, TORCH_CUDA_ARCH_LIST, the cccl include path on CUDA
//!   13, MAX_JOBS, CUDA_HOME, the libcuda link stub), never inherited.
//! - [`source`], [`nvshmem`]: the inputs, checked before anything is compiled (the API
//!   the sources implement, the RDC fix, an NVSHMEM prefix with the unversioned
//!   `libnvshmem_host.so` DeepEP V1 links, built with NVSHMEM_USE_NCCL=OFF).
//! - [`python`]: what a Python environment holds, read by a small probe.
//! - [`venv`]: the managed mode's build environment, a store step made from the lock.
//! - [`build`]: `setup.py bdist_wheel` in a store step keyed by everything the wheel
//!   depends on; [`wheel_check`] proves the result (no libcuda stub shipped, links the
//!   stack's NVSHMEM).
//! - [`reproducible`]: the same step key gives the same wheel on any machine (a fixed
//!   build directory, prefix maps, `$ORIGIN` RUNPATH, a canonical zip, a path scan).
//! - [`schedule`]: the compile jobs' order (host compiles first), through a ninja front.
//! - [`wheelhouse`]: every wheel the runtime needs, with hash-pinned requirements and a
//!   constraints file that keeps NVIDIA's NVSHMEM from coming back.

pub mod archs;
pub mod build;
pub mod env;
pub mod nvshmem;
pub mod python;
pub mod reproducible;
pub mod run;
pub mod schedule;
pub mod source;
pub mod venv;
pub mod wheel_check;
pub mod wheelhouse;

pub use build::{
    BUILD_REPORT_FILE, BuildReport, BuildRequest, Built, PythonTarget, build, build_key,
};
pub use nvshmem::NvshmemInput;
pub use python::PythonEnv;
pub use source::{SourceInput, SubmoduleInput};
pub use venv::{LockedWheel, ManagedVenv, managed_venv, runtime_wheels};
pub use wheelhouse::{Wheelhouse, WheelhouseKind, assemble_wheelhouse};
