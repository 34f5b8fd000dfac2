// Error reporting shared by the host functions of the .cu sources.
//
// Every exported function returns 0 on success and non-zero on failure; on failure it
// has stored a message that names the failing call, read by Rust via cs_last_error().
#pragma once

#include <cuda_runtime.h>

void cs_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Stores "<call> failed: <name> (<code>): <description>" and returns 1 from the caller.
#define CS_CUDA_CHECK(call)                                                            \
    do {                                                                               \
        cudaError_t cs_err_ = (call);                                                  \
        if (cs_err_ != cudaSuccess) {                                                  \
            cs_set_error("%s failed: %s (%d): %s", #call, cudaGetErrorName(cs_err_),   \
                         (int)cs_err_, cudaGetErrorString(cs_err_));                   \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

// Same for NVSHMEM host calls, which return an int status (0 = success).
#define CS_NVSHMEM_CHECK(call)                                                         \
    do {                                                                               \
        int cs_st_ = (call);                                                           \
        if (cs_st_ != 0) {                                                             \
            cs_set_error("%s failed: NVSHMEM status %d (run with NVSHMEM_DEBUG=INFO "  \
                         "for NVSHMEM's own log)",                                     \
                         #call, cs_st_);                                               \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

// Checks the launch of the kernel just enqueued (configuration errors, missing image
// for this GPU's architecture). Faults during execution surface at the next stream
// synchronisation, which the Rust side checks.
#define CS_LAUNCH_CHECK(kernel_name)                                                   \
    do {                                                                               \
        cudaError_t cs_err_ = cudaGetLastError();                                      \
        if (cs_err_ != cudaSuccess) {                                                  \
            cs_set_error("launch of %s failed: %s (%d): %s", kernel_name,              \
                         cudaGetErrorName(cs_err_), (int)cs_err_,                      \
                         cudaGetErrorString(cs_err_));                                 \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

#define CS_FAIL(...)                 \
    do {                             \
        cs_set_error(__VA_ARGS__);   \
        return 1;                    \
    } while (0)
