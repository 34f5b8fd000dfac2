//! Safe launchers for the kernels of `cu/kernels.cu`. Each checks its arguments
//! against the buffers it is given, then enqueues on `stream`; faults during
//! execution show up at the next synchronisation of that stream.

use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::ffi;
use crate::nvshmem::{SymmetricBuffer, check};
use crate::routing::SendItem;

/// Smallest piece of a message one put block copies: small messages use few blocks.
pub const PUT_MIN_CHUNK: usize = 16 * 1024;

/// How a put of `bytes` is split over blocks: block b copies
/// `[b * chunk, min((b + 1) * chunk, bytes))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutGrid {
    pub nblocks: u32,
    pub chunk: usize,
}

impl PutGrid {
    /// Enough blocks to fill the GPU (`max_blocks` resident) for large messages, one
    /// per [`PUT_MIN_CHUNK`] for small ones; chunks are multiples of 16 bytes so every
    /// block starts 16-byte aligned (NVSHMEM's vector copy path) and none is empty.
    pub fn new(bytes: usize, max_blocks: u32) -> Self {
        assert!(bytes > 0 && max_blocks > 0);
        let want = bytes.div_ceil(PUT_MIN_CHUNK).clamp(1, max_blocks as usize);
        let chunk = bytes.div_ceil(want).next_multiple_of(16);
        let nblocks = bytes.div_ceil(chunk) as u32;
        Self { nblocks, chunk }
    }
}

/// Blocks of the put kernel that fit on the current device at once.
pub fn put_max_resident_blocks() -> anyhow::Result<u32> {
    let mut n = 0;
    // SAFETY: writes one int; uses the runtime's current device.
    check(
        unsafe { ffi::cs_put_max_resident_blocks(&mut n) },
        "querying the put kernel's occupancy",
    )?;
    Ok(n as u32)
}

/// The direction of a block-wise RMA transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rma {
    /// `nvshmemx_putmem_block`: local `src` to `dst` on the peer.
    Put,
    /// `nvshmemx_getmem_block`: `src` on the peer into the local `dst`.
    Get,
}

impl Rma {
    pub fn name(self) -> &'static str {
        match self {
            Rma::Put => "put",
            Rma::Get => "get",
        }
    }
}

/// Move `bytes` between `src` and `dst` with PE `pe`, one chunk per block of `grid`.
pub fn rma(
    op: Rma,
    stream: &CudaStream,
    dst: &SymmetricBuffer<'_>,
    src: &SymmetricBuffer<'_>,
    bytes: usize,
    pe: usize,
    grid: PutGrid,
) -> anyhow::Result<()> {
    ensure!(
        bytes <= dst.len() && bytes <= src.len(),
        "{} of {bytes} bytes exceeds its buffers",
        op.name()
    );
    // SAFETY: both buffers are symmetric allocations of at least `bytes`; the grid
    // covers exactly `bytes` (checked again on the C side).
    check(
        unsafe {
            ffi::cs_launch_rma(
                dst.as_ptr(),
                src.as_ptr(),
                bytes,
                grid.chunk,
                grid.nblocks as i32,
                pe as i32,
                i32::from(op == Rma::Get),
                stream.cu_stream(),
            )
        },
        &format!("{} kernel", op.name()),
    )
}

/// A dispatch plan on the device: the three arrays `dispatch_kernel` reads.
pub struct DeviceItems {
    token: CudaSlice<i32>,
    pe: CudaSlice<i32>,
    offset: CudaSlice<u64>,
    len: usize,
    /// Bounds the items were checked against.
    max_token: usize,
    max_end: u64,
}

impl DeviceItems {
    /// Uploads `items` after checking that every token and destination range fits.
    pub fn upload(
        stream: &Arc<CudaStream>,
        items: &[SendItem],
        tokens: usize,
        token_bytes: usize,
        recv_bytes: usize,
        world: usize,
    ) -> anyhow::Result<Self> {
        for (i, it) in items.iter().enumerate() {
            ensure!(
                it.token >= 0 && (it.token as usize) < tokens,
                "dispatch item {i}: token {} out of range",
                it.token
            );
            ensure!(
                it.pe >= 0 && (it.pe as usize) < world,
                "dispatch item {i}: PE {} out of range",
                it.pe
            );
            ensure!(
                it.offset + token_bytes as u64 <= recv_bytes as u64,
                "dispatch item {i}: offset {} overruns the {recv_bytes}-byte receive buffer",
                it.offset
            );
        }
        let token: Vec<i32> = items.iter().map(|i| i.token).collect();
        let pe: Vec<i32> = items.iter().map(|i| i.pe).collect();
        let offset: Vec<u64> = items.iter().map(|i| i.offset).collect();
        let upload = |what| format!("uploading the dispatch {what} array");
        Ok(Self {
            token: stream.clone_htod(&token).with_context(|| upload("token"))?,
            pe: stream.clone_htod(&pe).with_context(|| upload("PE"))?,
            offset: stream
                .clone_htod(&offset)
                .with_context(|| upload("offset"))?,
            len: items.len(),
            max_token: tokens,
            max_end: recv_bytes as u64,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One MoE-style dispatch: every item's token from `send` to its PE's `recv`.
pub fn dispatch(
    stream: &CudaStream,
    recv: &SymmetricBuffer<'_>,
    send: &SymmetricBuffer<'_>,
    token_bytes: usize,
    items: &DeviceItems,
) -> anyhow::Result<()> {
    ensure!(
        recv.len() as u64 >= items.max_end,
        "receive buffer smaller than the plan assumes"
    );
    ensure!(
        send.len() >= items.max_token * token_bytes,
        "send buffer smaller than the plan assumes"
    );
    let nitems = i32::try_from(items.len).context("too many dispatch items")?;
    let (tok, _t) = items.token.device_ptr(stream);
    let (pe, _p) = items.pe.device_ptr(stream);
    let (off, _o) = items.offset.device_ptr(stream);
    // SAFETY: the item arrays were validated against these sizes in DeviceItems::upload
    // and the buffers are at least that large (checked above).
    check(
        unsafe {
            ffi::cs_launch_dispatch(
                recv.as_ptr(),
                send.as_ptr(),
                token_bytes,
                tok as *const i32,
                pe as *const i32,
                off as *const u64,
                nitems,
                stream.cu_stream(),
            )
        },
        "dispatch kernel",
    )
}

/// Device buffers the ping-pong kernel writes its timings to.
pub struct PingPongTimes {
    pub cycles: CudaSlice<i64>,
    pub span: CudaSlice<u64>,
}

impl PingPongTimes {
    pub fn new(stream: &Arc<CudaStream>, rounds: usize) -> anyhow::Result<Self> {
        Ok(Self {
            cycles: stream
                .alloc_zeros::<i64>(rounds)
                .context("allocating ping-pong timings")?,
            span: stream
                .alloc_zeros::<u64>(2)
                .context("allocating ping-pong timings")?,
        })
    }
}

/// `rounds` signal round trips with `peer` on the 8-byte symmetric word `sig`.
pub fn pingpong(
    stream: &CudaStream,
    sig: &SymmetricBuffer<'_>,
    peer: usize,
    rounds: usize,
    initiator: bool,
    times: &mut PingPongTimes,
) -> anyhow::Result<()> {
    ensure!(sig.len() >= 8, "signal buffer must hold a u64");
    if times.cycles.len() < rounds {
        bail!(
            "timing buffer holds {} rounds, {rounds} asked",
            times.cycles.len()
        );
    }
    let rounds_c = i32::try_from(rounds).context("too many ping-pong rounds")?;
    let (cycles, _c) = times.cycles.device_ptr_mut(stream);
    let (span, _s) = times.span.device_ptr_mut(stream);
    // SAFETY: sig is a symmetric u64; cycles holds >= rounds entries, span 2.
    check(
        unsafe {
            ffi::cs_launch_pingpong(
                sig.as_ptr().cast(),
                peer as i32,
                rounds_c,
                initiator as i32,
                cycles as *mut i64,
                span as *mut u64,
                stream.cu_stream(),
            )
        },
        "ping-pong kernel",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(bytes: usize, g: PutGrid) {
        assert!(
            g.nblocks >= 1 && g.chunk.is_multiple_of(16) && g.chunk > 0,
            "{bytes}: {g:?}"
        );
        assert!(
            (g.nblocks as usize - 1) * g.chunk < bytes,
            "{bytes}: empty last block {g:?}"
        );
        assert!(
            g.nblocks as usize * g.chunk >= bytes,
            "{bytes}: not covered {g:?}"
        );
    }

    #[test]
    fn put_grid_covers_every_size_without_empty_blocks() {
        for max_blocks in [1u32, 7, 132, 528, 1056] {
            for bytes in [
                1usize,
                15,
                16,
                17,
                4096,
                16 << 10,
                (16 << 10) + 1,
                1 << 20,
                3 << 20,
                256 << 20,
                (256 << 20) + 48,
            ] {
                let g = PutGrid::new(bytes, max_blocks);
                covers(bytes, g);
                assert!(g.nblocks <= max_blocks);
            }
        }
    }

    #[test]
    fn put_grid_fills_the_gpu_for_large_messages_only() {
        assert_eq!(
            PutGrid::new(4096, 528),
            PutGrid {
                nblocks: 1,
                chunk: 4096
            }
        );
        assert_eq!(PutGrid::new(1 << 20, 528).nblocks, 64);
        let big = PutGrid::new(256 << 20, 528);
        assert_eq!(big.nblocks, 528);
    }
}
