//! Raw bindings to the `extern "C"` host functions of `cu/host.cu` and `cu/kernels.cu`.
//!
//! Every `c_int` result is 0 on success; otherwise [`cs_last_error`] holds a message that
//! names the failing CUDA/NVSHMEM call. Use the safe wrappers in [`crate::nvshmem`] and
//! [`crate::launch`] instead of these.

use std::ffi::{c_char, c_int, c_longlong, c_ulonglong, c_void};

/// Bytes of `nvshmemx_uniqueid_t` (checked by a `static_assert` in host.cu and by tests).
pub const UNIQUEID_BYTES: usize = 128;

/// Mirror of NVSHMEM's `nvshmemx_uniqueid_v1` (bootstrap_device_host/nvshmem_uniqueid.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvshmemUniqueId {
    pub version: c_int,
    pub internal: [c_char; 124],
}

/// Mirror of NVSHMEM's `nvshmemx_uniqueid_args_v1`.
#[repr(C)]
pub struct NvshmemUniqueIdArgs {
    pub version: c_int,
    pub id: *mut NvshmemUniqueId,
    pub myrank: c_int,
    pub nranks: c_int,
}

/// Layout facts of NVSHMEM's types as nvcc saw them (filled by `cs_abi_layout`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AbiLayout {
    pub struct_size: u64,
    pub uniqueid_size: u64,
    pub uniqueid_align: u64,
    pub uniqueid_version_offset: u64,
    pub uniqueid_internal_offset: u64,
    pub uniqueid_internal_len: u64,
    pub uniqueid_args_size: u64,
    pub uniqueid_args_id_offset: u64,
    pub uniqueid_args_myrank_offset: u64,
    pub uniqueid_args_nranks_offset: u64,
    pub init_attr_size: u64,
    pub uniqueid_initial_version: i32,
    pub header_major: i32,
    pub header_minor: i32,
    pub header_patch: i32,
}

/// `cudaStream_t` and `CUstream` are the same handle type.
pub type Stream = cudarc::driver::sys::CUstream;

unsafe extern "C" {
    pub fn cs_last_error() -> *const c_char;
    pub fn cs_abi_layout(out: *mut AbiLayout);
    pub fn cs_loaded_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int);

    pub fn cs_get_uniqueid(out: *mut c_void) -> c_int;
    pub fn cs_init(rank: c_int, nranks: c_int, uid: *const c_void, expected_device: c_int)
    -> c_int;
    pub fn cs_finalize();
    pub fn cs_my_pe() -> c_int;
    pub fn cs_n_pes() -> c_int;
    pub fn cs_malloc(bytes: usize, out: *mut *mut c_void) -> c_int;
    pub fn cs_free(ptr: *mut c_void);
    pub fn cs_barrier_all();

    pub fn cs_put_threads_per_block() -> c_int;
    pub fn cs_put_max_resident_blocks(out: *mut c_int) -> c_int;
    /// `get` != 0: read `src` on `pe` into local `dst`; else write `src` to `dst` on `pe`.
    pub fn cs_launch_rma(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        chunk: usize,
        nblocks: c_int,
        pe: c_int,
        get: c_int,
        stream: Stream,
    ) -> c_int;
    pub fn cs_launch_dispatch(
        recv: *mut c_void,
        send: *const c_void,
        token_bytes: usize,
        item_token: *const i32,
        item_pe: *const i32,
        item_offset: *const u64,
        nitems: c_int,
        stream: Stream,
    ) -> c_int;
    pub fn cs_launch_pingpong(
        sig: *mut u64,
        peer: c_int,
        rounds: c_int,
        initiator: c_int,
        cycles: *mut c_longlong,
        span: *mut c_ulonglong,
        stream: Stream,
    ) -> c_int;
}

/// The layout NVSHMEM's headers have, as compiled into this crate.
pub fn abi_layout() -> AbiLayout {
    let mut out = AbiLayout::default();
    // SAFETY: cs_abi_layout only writes the struct (no NVSHMEM or CUDA state involved).
    unsafe { cs_abi_layout(&mut out) };
    out
}

/// The message stored by the last failing `cs_*` call on this thread.
pub fn last_error() -> String {
    // SAFETY: cs_last_error returns a pointer to a NUL-terminated thread-local buffer.
    unsafe { std::ffi::CStr::from_ptr(cs_last_error()) }
        .to_string_lossy()
        .into_owned()
}
