// Host-side NVSHMEM entry points exported to Rust.
//
// nvshmem_init/nvshmemx_init_attr are static inline in NVSHMEM's headers and call
// nvshmemi_init_thread from libnvshmem_device.a, so Rust cannot call them: they live
// here, compiled by nvcc and linked with the device library. Every function returns 0
// on success; on failure cs_last_error() says which call failed and why.

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include "cs_error.h"

// The Rust side passes unique ids as 128 opaque bytes; keep that contract checked here.
static_assert(sizeof(nvshmemx_uniqueid_t) == 128, "nvshmemx_uniqueid_t is no longer 128 bytes");

static thread_local char cs_error_buf[1024];

void cs_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cs_error_buf, sizeof cs_error_buf, fmt, ap);
    va_end(ap);
}

// Layout facts of the NVSHMEM types as this compiler sees them, for the Rust FFI tests.
typedef struct {
    uint64_t struct_size;  // sizeof(cs_abi_layout_t): checked first by Rust
    uint64_t uniqueid_size;
    uint64_t uniqueid_align;
    uint64_t uniqueid_version_offset;
    uint64_t uniqueid_internal_offset;
    uint64_t uniqueid_internal_len;
    uint64_t uniqueid_args_size;
    uint64_t uniqueid_args_id_offset;
    uint64_t uniqueid_args_myrank_offset;
    uint64_t uniqueid_args_nranks_offset;
    uint64_t init_attr_size;
    int32_t uniqueid_initial_version;  // the version field NVSHMEMX_UNIQUEID_INITIALIZER sets
    int32_t header_major;
    int32_t header_minor;
    int32_t header_patch;
} cs_abi_layout_t;

extern "C" {

const char *cs_last_error(void) { return cs_error_buf; }

void cs_abi_layout(cs_abi_layout_t *out) {
    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    out->struct_size = sizeof(cs_abi_layout_t);
    out->uniqueid_size = sizeof(nvshmemx_uniqueid_t);
    out->uniqueid_align = alignof(nvshmemx_uniqueid_t);
    out->uniqueid_version_offset = offsetof(nvshmemx_uniqueid_t, version);
    out->uniqueid_internal_offset = offsetof(nvshmemx_uniqueid_t, internal);
    out->uniqueid_internal_len = sizeof(id.internal);
    out->uniqueid_args_size = sizeof(nvshmemx_uniqueid_args_t);
    out->uniqueid_args_id_offset = offsetof(nvshmemx_uniqueid_args_t, id);
    out->uniqueid_args_myrank_offset = offsetof(nvshmemx_uniqueid_args_t, myrank);
    out->uniqueid_args_nranks_offset = offsetof(nvshmemx_uniqueid_args_t, nranks);
    out->init_attr_size = sizeof(nvshmemx_init_attr_t);
    out->uniqueid_initial_version = id.version;
    out->header_major = NVSHMEM_VENDOR_MAJOR_VERSION;
    out->header_minor = NVSHMEM_VENDOR_MINOR_VERSION;
    out->header_patch = NVSHMEM_VENDOR_PATCH_VERSION;
}

// Version of the libnvshmem_host actually loaded (may differ from the headers).
void cs_loaded_version(int *major, int *minor, int *patch) {
    nvshmemx_vendor_get_version_info(major, minor, patch);
}

// Rank 0 only: a fresh unique id, copied to `out` (128 bytes).
int cs_get_uniqueid(void *out) {
    nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
    CS_NVSHMEM_CHECK(nvshmemx_get_uniqueid(&id));
    memcpy(out, &id, sizeof id);
    return 0;
}

// Collective: initialises NVSHMEM with the unique id from rank 0. A CUDA context must
// be current on this thread (NVSHMEM takes the current one); `expected_device` is the
// ordinal of that context, checked against what the runtime API sees.
int cs_init(int rank, int nranks, const void *uid, int expected_device) {
    int device = -1;
    CS_CUDA_CHECK(cudaGetDevice(&device));
    if (device != expected_device) {
        CS_FAIL("cudaGetDevice() returned %d but the current context is on device %d",
                device, expected_device);
    }
    if (nvshmemx_init_status() != NVSHMEM_STATUS_NOT_INITIALIZED) {
        CS_FAIL("NVSHMEM is already initialised in this process (status %d)",
                nvshmemx_init_status());
    }

    nvshmemx_uniqueid_t id;
    memcpy(&id, uid, sizeof id);
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    CS_NVSHMEM_CHECK(nvshmemx_set_attr_uniqueid_args(rank, nranks, &id, &attr));

    // The body of the inline nvshmemx_init_attr(), minus its exit(-1) on failure, so
    // that a failed init is an error the caller can report.
    nvshmemx_init_init_attr_ver_only(attr);
    nvshmemi_version_t app_version = {NVSHMEM_VENDOR_MAJOR_VERSION,
                                      NVSHMEM_VENDOR_MINOR_VERSION,
                                      NVSHMEM_VENDOR_PATCH_VERSION};
    int provided = 0;
    CS_NVSHMEM_CHECK(nvshmemi_init_thread(NVSHMEM_THREAD_SERIALIZED, &provided,
                                          NVSHMEMX_INIT_WITH_UNIQUEID, &attr, app_version));

    int my_pe = nvshmem_my_pe();
    int n_pes = nvshmem_n_pes();
    if (my_pe != rank || n_pes != nranks) {
        CS_FAIL("after init NVSHMEM reports PE %d of %d, expected rank %d of %d", my_pe,
                n_pes, rank, nranks);
    }
    return 0;
}

void cs_finalize(void) { nvshmem_finalize(); }

int cs_my_pe(void) { return nvshmem_my_pe(); }
int cs_n_pes(void) { return nvshmem_n_pes(); }

// Collective: every PE must call it with the same size.
int cs_malloc(size_t bytes, void **out) {
    void *p = nvshmem_malloc(bytes);
    if (p == NULL) {
        CS_FAIL("nvshmem_malloc(%zu) returned NULL: symmetric heap exhausted? "
                "(raise NVSHMEM_SYMMETRIC_SIZE)",
                bytes);
    }
    *out = p;
    return 0;
}

// Collective.
void cs_free(void *p) { nvshmem_free(p); }

// Host barrier over all PEs; it does not wait for work on our streams (sync first).
void cs_barrier_all(void) { nvshmem_barrier_all(); }

}  // extern "C"
