//! The checks, each a function of the host's files, nvidia-smi output and environment.

pub(crate) mod arch;
pub(crate) mod driver;
pub(crate) mod env;
mod gpu;
pub(crate) mod ibgda;
mod input;
pub(crate) mod kernel;
pub(crate) mod memory;
pub(crate) mod rdma;

pub(crate) use input::Host;

use crate::report::Check;

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
