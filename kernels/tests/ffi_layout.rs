//! The Rust mirrors of NVSHMEM's types against the layout nvcc computed from the real
//! headers (cs_abi_layout in cu/host.cu). Needs no GPU.

use std::mem::{align_of, offset_of, size_of};

use commstack_kernels::ffi::{
    self, AbiLayout, NvshmemUniqueId, NvshmemUniqueIdArgs, UNIQUEID_BYTES,
};

#[test]
fn the_layout_struct_itself_matches() {
    assert_eq!(ffi::abi_layout().struct_size, size_of::<AbiLayout>() as u64);
}

#[test]
fn unique_id_matches_the_headers() {
    let c = ffi::abi_layout();
    assert_eq!(c.uniqueid_size, UNIQUEID_BYTES as u64);
    assert_eq!(c.uniqueid_size, size_of::<NvshmemUniqueId>() as u64);
    assert_eq!(c.uniqueid_align, align_of::<NvshmemUniqueId>() as u64);
    assert_eq!(
        c.uniqueid_version_offset,
        offset_of!(NvshmemUniqueId, version) as u64
    );
    assert_eq!(
        c.uniqueid_internal_offset,
        offset_of!(NvshmemUniqueId, internal) as u64
    );
    assert_eq!(c.uniqueid_internal_len, 124);
    // NVSHMEMX_UNIQUEID_INITIALIZER: (1 << 16) + sizeof(nvshmemx_uniqueid_t).
    assert_eq!(
        c.uniqueid_initial_version,
        (1 << 16) + UNIQUEID_BYTES as i32
    );
}

#[test]
fn unique_id_args_match_the_headers() {
    let c = ffi::abi_layout();
    assert_eq!(
        c.uniqueid_args_size,
        size_of::<NvshmemUniqueIdArgs>() as u64
    );
    assert_eq!(
        c.uniqueid_args_id_offset,
        offset_of!(NvshmemUniqueIdArgs, id) as u64
    );
    assert_eq!(
        c.uniqueid_args_myrank_offset,
        offset_of!(NvshmemUniqueIdArgs, myrank) as u64
    );
    assert_eq!(
        c.uniqueid_args_nranks_offset,
        offset_of!(NvshmemUniqueIdArgs, nranks) as u64
    );
    assert_eq!(c.init_attr_size, 144, "nvshmemx_init_attr_v1");
}

#[test]
fn headers_are_an_nvshmem_3_release() {
    let c = ffi::abi_layout();
    assert_eq!(c.header_major, 3, "{c:?}");
    // The library this test binary loaded (through its RUNPATH) matches the headers.
    let (major, minor, patch) = commstack_kernels::nvshmem::Nvshmem::loaded_version();
    assert_eq!(
        (major, minor, patch),
        (c.header_major, c.header_minor, c.header_patch)
    );
}
