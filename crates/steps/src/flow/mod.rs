//! Each step's flow: one function (or a few) per step of the stack, also called alone by
//! the single commands (`build nvshmem`, `build kernels`, `build deepep`, `fetch`,
//! `toolchain`, `gpu-bundle`, `adopt`). No flow names a command module of xtask
//! (tests/tidy.rs checks).

pub mod deepep;
pub mod fetch;
pub mod fetch_options;
pub mod image;
pub mod in_image;
pub mod jit_check;
pub mod kernels;
pub mod lock;
pub mod nccl;
pub mod nvshmem;
pub mod toolchain;
pub mod verify_report;
pub mod verify_runtime;
pub mod verify_static;
