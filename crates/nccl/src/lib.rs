//! NCCL from source, for machines NVIDIA's wheel cannot reach (the GPU machine takes at
//! most 64 MiB; nvidia-nccl-cu13 2.30.7 is 216 MB): NCCL's own `make src.build` for the
//! stack's CUDA archs, checked to be the locked version under the soname torch loads
//! (`libnccl.so.2`), and packaged as a drop-in wheel under the locked version, so that
//! `adopt` replaces the environment's NCCL with it as it replaces NVSHMEM (backup, undo).

pub mod build;
pub mod dropin;

pub use build::{Built, MakeRequest, build};
pub use dropin::{NcclDropIn, build_dropin_wheel};

/// The soname torch, NVSHMEM and DeepEP V2 load; NVIDIA's wheel ships the library under it.
pub const SONAME: &str = "libnccl.so.2";
