//! commstack-doctor: can this host run the DeepEP / NVSHMEM / NCCL stack?
//!
//! Each check reads the host's files under a root prefix (`/` live, or a recorded tree) and
//! nvidia-smi output (live, or recorded), and answers pass / warn / fail / skip with a one-line
//! finding and a fix: driver vs the stack's CUDA, GPUs and NVLink topology, RDMA devices,
//! nvidia_peermem, the IBGDA driver settings, gdrdrv, memlock, /dev/shm, and environment
//! variables that silently change NCCL or NVSHMEM.
//!
//! [`preflight`] is the image's gate: the same checks against what one image needs
//! (its preflight.json), one pass / fail verdict; the `commstack-doctor` binary the image
//! carries runs it.

mod checks;
mod host;
pub mod nvidia_smi;
pub mod preflight;
pub mod proc_files;
mod report;
pub mod version;

use std::path::PathBuf;

pub use host::HostFs;
pub use nvidia_smi::NvidiaSmiSource;
pub use report::{Check, DoctorReport, REPORT_SCHEMA_VERSION, Status, render_human};
pub use version::{CudaVersion, DriverVersion};

/// What the doctor examines.
#[derive(Debug, Clone)]
pub struct DoctorInput {
    /// /proc, /sys and /dev are read below this directory (`/` for the live host).
    pub root: PathBuf,
    pub nvidia_smi: NvidiaSmiSource,
    /// The environment to judge (the live one: `std::env::vars()`).
    pub env: Vec<(String, String)>,
    /// The CUDA version the stack is built with.
    pub required_cuda: CudaVersion,
}

impl DoctorInput {
    /// This host as it is: `/`, nvidia-smi from PATH, this process's environment, CUDA 13.0.
    pub fn live() -> DoctorInput {
        DoctorInput {
            root: PathBuf::from("/"),
            nvidia_smi: NvidiaSmiSource::Live,
            env: std::env::vars_os()
                .map(|(k, v)| {
                    (
                        k.to_string_lossy().into_owned(),
                        v.to_string_lossy().into_owned(),
                    )
                })
                .collect(),
            required_cuda: CudaVersion::DEFAULT_STACK,
        }
    }
}

/// Run every check. Never fails: what cannot be read becomes a finding.
pub fn run(input: &DoctorInput) -> DoctorReport {
    let fs = HostFs::new(&input.root);
    let path_var = input
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str());
    let smi = nvidia_smi::NvidiaSmiOutput::collect(&input.nvidia_smi, path_var);
    let host = checks::Host {
        fs: &fs,
        smi: &smi,
        env: &input.env,
        required_cuda: input.required_cuda,
    };
    DoctorReport {
        schema_version: REPORT_SCHEMA_VERSION,
        root: input.root.display().to_string(),
        nvidia_smi: input.nvidia_smi.describe(),
        required_cuda: input.required_cuda.to_string(),
        checks: checks::run_all(&host),
    }
}
