//! commstack-verify: proves that an environment holds the stack it should.
//!
//! - ELF reading is the `commstack-elf` crate's (the builds use it too).
//! - [`static_level`]: those checks over every library of the stack in an environment
//!   ([`libstdcxx`]: DeepEP's extension uses the process's libstdc++; [`deepep_links`]:
//!   it is linked to the environment's one NVSHMEM host library and, V2, one NCCL).
//! - [`runtime`]: what a Python process really maps after `import torch, deep_ep`.
//! - [`runner`]: runs a Python test and applies the exit-clean gate to its teardown.
//! - [`expect`]: what "right" means, one struct filled from arguments or the lock.
//! - [`check`], [`report`]: passed / failed / not run with cause and fix; the report.
//! - [`verify`]: the levels run against one Python environment.
//! - [`cli`]: the command line (`cargo xtask verify` and the `commstack-verify` binary).
pub mod check;
pub mod cli;
pub mod deepep_links;
pub mod environment;
pub mod expect;
pub mod facts;
pub mod layers;
pub mod libstdcxx;
pub mod mps;
pub mod process;
pub mod report;
pub mod runner;
pub mod runtime;
pub mod selftest;
pub mod static_level;
pub mod verify;

pub use check::{Check, Status};
pub use expect::{Expectations, NcclVersion};
pub use report::{Level, Report};
pub use verify::{VerifyOptions, verify_image_static, verify_python};
