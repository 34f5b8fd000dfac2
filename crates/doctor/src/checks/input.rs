//! What every check may look at: in a module of its own, below the checks and the list
//! that runs them.

use crate::host::HostFs;
use crate::nvidia_smi::NvidiaSmiOutput;
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
