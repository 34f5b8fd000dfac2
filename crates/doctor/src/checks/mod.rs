//! The checks, each a function of the host's files, nvidia-smi output and environment.

mod driver;
pub(crate) mod env;
mod gpu;
mod ibgda;
mod memory;
mod rdma;

use crate::host::HostFs;
use crate::nvidia_smi::NvidiaSmiOutput;
use crate::report::Check;
use crate::version::CudaVersion;

/// What every check may look at.
pub(crate) struct Host<'a> {
    pub fs: &'a HostFs,
    pub smi: &'a NvidiaSmiOutput,
    pub env: &'a [(String, String)],
    pub required_cuda: CudaVersion,
}

impl Host<'_> {
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every check, in report order.
pub(crate) fn run_all(host: &Host) -> Vec<Check> {
    let rdma = rdma::devices(host.fs);
    let ibgda = ibgda::settings(host.fs);
    vec![
        driver::check(host),
        gpu::gpus(host),
        gpu::topology(host),
        rdma::check(host.fs, &rdma),
        rdma::peermem(host.fs, &rdma),
        ibgda::stream_memops(&ibgda),
        ibgda::peer_mapping(&ibgda),
        ibgda::gdrdrv(host.fs, &ibgda),
        memory::memlock(host.fs, !rdma.is_empty()),
        memory::dev_shm(host.fs),
        env::check(host.env, host.fs),
    ]
}
