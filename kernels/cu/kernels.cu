// Self-test kernels and their launchers, exported to Rust.
//
// (a) put and get bandwidth: one contiguous chunk per block, nvshmemx_putmem_block /
//     nvshmemx_getmem_block;
// (b) MoE-style dispatch: one warp per (token, destination PE) item,
//     nvshmemx_putmem_nbi_warp into the receiver's [sender][slot] region;
// (c) signal ping-pong: one thread per side, nvshmemx_signal_op + signal_wait_until.
// Launchers return 0 or 1 (message in cs_last_error()); execution faults surface at the
// caller's next stream synchronisation.

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>

#include "cs_error.h"

namespace {

constexpr int kPutThreads = 512;
constexpr int kDispatchThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kDispatchMaxBlocks = 4096;

// Each block copies bytes [blockIdx.x * chunk, min(+chunk, bytes)) to the same offsets
// of `dst` on `pe`. The host guarantees chunk % 16 == 0 and that every block has work.
__global__ void __launch_bounds__(kPutThreads)
    put_block_kernel(char *dst, const char *src, size_t bytes, size_t chunk, int pe) {
    const size_t off = (size_t)blockIdx.x * chunk;
    if (off >= bytes) return;  // uniform across the block
    const size_t n = (bytes - off < chunk) ? (bytes - off) : chunk;
    nvshmemx_putmem_block(dst + off, src + off, n, pe);
    // putmem_block ends with a block barrier; one quiet per block completes the puts.
    if (threadIdx.x == 0) nvshmem_quiet();
}

// The same split as put_block_kernel, fetching: each block copies its chunk of `src` on
// `pe` into the same offsets of the local `dst`. getmem_block returns once the data is
// in `dst`, so no quiet is needed.
__global__ void __launch_bounds__(kPutThreads)
    get_block_kernel(char *dst, const char *src, size_t bytes, size_t chunk, int pe) {
    const size_t off = (size_t)blockIdx.x * chunk;
    if (off >= bytes) return;  // uniform across the block
    const size_t n = (bytes - off < chunk) ? (bytes - off) : chunk;
    nvshmemx_getmem_block(dst + off, src + off, n, pe);
}

// Item i sends token item_token[i] (token_bytes at send + token * token_bytes) to PE
// item_pe[i], at byte offset item_offset[i] of `recv`. One warp per item.
__global__ void __launch_bounds__(kDispatchThreads)
    dispatch_kernel(char *recv, const char *send, size_t token_bytes, const int32_t *item_token,
                    const int32_t *item_pe, const uint64_t *item_offset, int nitems) {
    const int warps_per_block = blockDim.x / kWarpSize;
    const int warp = blockIdx.x * warps_per_block + threadIdx.x / kWarpSize;
    const int nwarps = gridDim.x * warps_per_block;
    for (int i = warp; i < nitems; i += nwarps) {  // uniform across the warp
        nvshmemx_putmem_nbi_warp(recv + item_offset[i],
                                 send + (size_t)item_token[i] * token_bytes, token_bytes,
                                 item_pe[i]);
    }
    nvshmem_quiet();
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Round i (1-based): the initiator sets the peer's signal to i and waits for its own
// to reach i; the responder waits for i and answers. cycles[i-1] is the clock64()
// duration of round i; span[0..2] = (globaltimer ns, clock64 cycles) over all rounds,
// so that the host can convert cycles to ns with the clock actually running.
// With peer == own PE (1 PE) the initiator signals itself.
__global__ void pingpong_kernel(uint64_t *sig, int peer, int rounds, int initiator,
                                long long *cycles, unsigned long long *span) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const uint64_t g0 = globaltimer_ns();
    const long long c0 = clock64();
    for (int i = 1; i <= rounds; ++i) {
        const long long t = clock64();
        if (initiator) {
            nvshmemx_signal_op(sig, (uint64_t)i, NVSHMEM_SIGNAL_SET, peer);
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, (uint64_t)i);
        } else {
            nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, (uint64_t)i);
            nvshmemx_signal_op(sig, (uint64_t)i, NVSHMEM_SIGNAL_SET, peer);
        }
        cycles[i - 1] = clock64() - t;
    }
    nvshmem_quiet();
    span[0] = globaltimer_ns() - g0;
    span[1] = (unsigned long long)(clock64() - c0);
}

}  // namespace

extern "C" {

int cs_put_threads_per_block(void) { return kPutThreads; }

// Number of put blocks resident at once on the current device: the grid that keeps
// every SM busy (and the cap of the host's grid choice).
int cs_put_max_resident_blocks(int *out) {
    int device = -1, sms = 0, per_sm = 0;
    CS_CUDA_CHECK(cudaGetDevice(&device));
    CS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, put_block_kernel,
                                                                kPutThreads, 0));
    if (sms < 1 || per_sm < 1) {
        CS_FAIL("put_block_kernel cannot be resident: %d SMs, %d blocks per SM", sms, per_sm);
    }
    *out = sms * per_sm;
    return 0;
}

// One contiguous chunk per block: block i moves bytes [i * chunk, min(+chunk, bytes)).
// get != 0: read `src` on `pe` into the local `dst`; otherwise write `src` to `dst` on `pe`.
int cs_launch_rma(void *dst, const void *src, size_t bytes, size_t chunk, int nblocks, int pe,
                  int get, cudaStream_t stream) {
    if (bytes == 0 || chunk == 0 || chunk % 16 != 0 || nblocks < 1 ||
        (size_t)(nblocks - 1) * chunk >= bytes || (size_t)nblocks * chunk < bytes) {
        CS_FAIL("cs_launch_rma(%s): bad grid: bytes=%zu chunk=%zu nblocks=%d",
                get ? "get" : "put", bytes, chunk, nblocks);
    }
    if (get) {
        get_block_kernel<<<nblocks, kPutThreads, 0, stream>>>((char *)dst, (const char *)src,
                                                              bytes, chunk, pe);
        CS_LAUNCH_CHECK("get_block_kernel");
    } else {
        put_block_kernel<<<nblocks, kPutThreads, 0, stream>>>((char *)dst, (const char *)src,
                                                              bytes, chunk, pe);
        CS_LAUNCH_CHECK("put_block_kernel");
    }
    return 0;
}

int cs_launch_dispatch(void *recv, const void *send, size_t token_bytes,
                       const int32_t *item_token, const int32_t *item_pe,
                       const uint64_t *item_offset, int nitems, cudaStream_t stream) {
    if (nitems < 0 || token_bytes == 0) {
        CS_FAIL("cs_launch_dispatch: bad arguments: nitems=%d token_bytes=%zu", nitems,
                token_bytes);
    }
    if (nitems == 0) return 0;
    const int warps_per_block = kDispatchThreads / kWarpSize;
    int nblocks = (nitems + warps_per_block - 1) / warps_per_block;
    if (nblocks > kDispatchMaxBlocks) nblocks = kDispatchMaxBlocks;
    dispatch_kernel<<<nblocks, kDispatchThreads, 0, stream>>>(
        (char *)recv, (const char *)send, token_bytes, item_token, item_pe, item_offset, nitems);
    CS_LAUNCH_CHECK("dispatch_kernel");
    return 0;
}

int cs_launch_pingpong(uint64_t *sig, int peer, int rounds, int initiator, long long *cycles,
                       unsigned long long *span, cudaStream_t stream) {
    if (rounds < 1) CS_FAIL("cs_launch_pingpong: rounds=%d < 1", rounds);
    pingpong_kernel<<<1, 1, 0, stream>>>(sig, peer, rounds, initiator, cycles, span);
    CS_LAUNCH_CHECK("pingpong_kernel");
    return 0;
}

}  // extern "C"
