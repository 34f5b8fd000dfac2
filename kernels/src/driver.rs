//! Is there a CUDA driver? Answered without panicking (cudarc panics when it has to
//! load libcuda and cannot).

use cudarc::driver::{CudaContext, result};

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(
        "no CUDA driver: libcuda.so.1 (NVIDIA's driver library) could not be loaded, so this \
         machine has no usable NVIDIA GPU. Run commstack-selftest on a GPU machine (a GPU \
         bundle carries it there); on this machine only the CPU tests apply \
         (`cargo xtask build kernels --test`)"
    )]
    NotFound,
    #[error(
        "the CUDA driver is installed but cuInit failed: {0:?} (no GPU visible? CUDA_VISIBLE_DEVICES? driver older than CUDA 13.0?)"
    )]
    Init(result::DriverError),
    #[error("cuDeviceGetCount failed: {0:?}")]
    Count(result::DriverError),
}

/// True when libcuda can be loaded (does not initialise it).
pub fn driver_present() -> bool {
    // SAFETY: only tries dlopen on libcuda's names and closes it again.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Loads and initialises the driver; every later cudarc call may then use it.
pub fn require_driver() -> Result<(), DriverError> {
    if !driver_present() {
        return Err(DriverError::NotFound);
    }
    result::init().map_err(DriverError::Init)
}

/// Number of visible GPUs (after [`require_driver`]).
pub fn device_count() -> Result<usize, DriverError> {
    require_driver()?;
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(DriverError::Count)
}
