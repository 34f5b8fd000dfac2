//! One rank of the self-test: CUDA context, NVSHMEM bootstrap, then the put sweep, the
//! MoE-style dispatch and the signal ping-pong, each checked against the CPU reference.
//!
//! Every phase that writes into another PE's memory is framed by
//! [`sync_barrier`] (stream synchronised, then an NVSHMEM barrier): before it so that
//! nobody is still reading the target buffer, after it so that every put has landed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cudarc::driver::{CudaContext, CudaStream, result};

use crate::driver;
use crate::ffi;
use crate::launch::{self, DeviceItems, PingPongTimes, PutGrid, Rma};
use crate::nvshmem::{Nvshmem, SymmetricBuffer, UniqueId};
use crate::options::{TestKind, TestOptions};
use crate::rendezvous;
use crate::report::{
    CopyResult, DeviceInfo, DispatchResult, LatencyStats, NvshmemInfo, PingPongResult, PutCheck,
    PutResult, RankReport, Role, median,
};
use crate::rng::{ByteStream, Purpose};
use crate::routing::{self, POISON};

/// Bytes after each put message that must keep the poison value (overrun check).
pub const PUT_GUARD: usize = 4096;
/// Bytes one timed batch of puts or copies aims to move.
const BATCH_BYTES: u64 = 2 << 30;

/// Who this process is in the job.
#[derive(Debug, Clone)]
pub struct RankSpec {
    pub rank: usize,
    pub world: usize,
    /// CUDA device ordinal to use.
    pub local_rank: usize,
    /// Where rank 0 listens; needed when `world > 1`.
    pub rdzv: Option<String>,
    /// The seed of the options was given on the command line (`--seed`), not drawn here:
    /// a rank other than 0 then refuses to run with another seed than rank 0's, instead of
    /// taking rank 0's.
    pub seed_given: bool,
}

macro_rules! log {
    ($rank:expr, $($arg:tt)*) => { eprintln!("[rank {}] {}", $rank, format_args!($($arg)*)) };
}

/// Runs every selected test as rank `spec.rank` and returns its report. `opts.seed`
/// becomes the seed the ranks agreed on at the rendezvous (rank 0's).
pub fn run_rank(opts: &mut TestOptions, spec: &RankSpec) -> anyhow::Result<RankReport> {
    driver::require_driver()?;
    let ctx = CudaContext::new(spec.local_rank).with_context(|| {
        format!(
            "creating the primary CUDA context of GPU {}",
            spec.local_rank
        )
    })?;
    let device = device_info(&ctx)?;
    check_arch(&device)?;
    log!(
        spec.rank,
        "GPU {} {} (sm_{}), rank {} of {}",
        device.ordinal,
        device.name,
        device.compute_capability.replace('.', ""),
        spec.rank,
        spec.world
    );

    let id = exchange_id(&ctx, spec, opts)?;
    let shmem = Nvshmem::init(ctx.clone(), spec.rank, spec.world, &id)
        .context("initialising NVSHMEM (NVSHMEM_DEBUG=INFO shows why it failed)")?;
    let result = run_tests(&shmem, opts, device);
    if let Err(e) = &result {
        // Said before finalising: finalize is collective and may wait for other ranks.
        log!(spec.rank, "failed: {e:#}");
        log!(spec.rank, "finalising NVSHMEM");
    }
    drop(shmem);
    result
}

/// The NVSHMEM unique id from rank 0, and the seed of every rank's inputs agreed on
/// (into `opts.seed`): see [`rendezvous::agree`].
fn exchange_id(
    ctx: &Arc<CudaContext>,
    spec: &RankSpec,
    opts: &mut TestOptions,
) -> anyhow::Result<UniqueId> {
    let agreed = rendezvous::agree(
        spec.rdzv.as_deref(),
        spec.rank,
        spec.world,
        opts.seed,
        spec.seed_given,
        || Ok(UniqueId::generate(ctx)?.0),
        Duration::from_secs(opts.rdzv_timeout),
    )?;
    if agreed.seed != opts.seed {
        log!(spec.rank, "seed {} (rank 0's)", agreed.seed);
        opts.seed = agreed.seed;
    }
    Ok(UniqueId(agreed.id))
}

fn run_tests(
    shmem: &Nvshmem,
    opts: &TestOptions,
    device: DeviceInfo,
) -> anyhow::Result<RankReport> {
    let stream = shmem
        .context()
        .new_stream()
        .context("creating a CUDA stream")?;
    let put_grid_blocks = launch::put_max_resident_blocks()?;
    let mut report = RankReport {
        rank: shmem.rank(),
        local_rank: device.ordinal,
        hostname: hostname(),
        device,
        nvshmem: nvshmem_info(),
        put_grid_blocks,
        put: Vec::new(),
        put_checks: Vec::new(),
        get: Vec::new(),
        get_checks: Vec::new(),
        copy: Vec::new(),
        dispatch: None,
        pingpong: Vec::new(),
    };
    if opts.runs(TestKind::Put) {
        put_sweep(shmem, &stream, opts, &mut report)?;
    }
    if opts.runs(TestKind::Dispatch) {
        report.dispatch = Some(dispatch_test(shmem, &stream, opts)?);
    }
    if opts.runs(TestKind::Pingpong) {
        report.pingpong = pingpong_test(shmem, &stream, opts)?;
    }
    sync_barrier(shmem, &stream)?;
    Ok(report)
}

/// The bytes rank `pe` sends in the put test.
fn put_source(seed: u64, pe: usize) -> ByteStream {
    ByteStream::new(seed, Purpose::PutSource, pe as u64)
}

fn put_sweep(
    shmem: &Nvshmem,
    stream: &Arc<CudaStream>,
    opts: &TestOptions,
    report: &mut RankReport,
) -> anyhow::Result<()> {
    let max = usize::try_from(opts.max_bytes).context("--max-bytes")?;
    let mut sweep = PutSweep::new(shmem, stream, opts.seed, max)?;
    for bytes in opts.put_sizes() {
        let step = Step::new(bytes as usize, report.put_grid_blocks);
        sweep.warm_up(step)?;
        let timings = sweep.time(step, opts.trials)?;
        let put_checks = sweep.check_puts(step)?;
        report.put_checks.extend(put_checks);
        let get_checks = sweep.check_gets(step)?;
        report.get_checks.extend(get_checks);
        let copy_wrong = sweep.check_copy(step)?;
        sweep.record_bandwidths(step, &timings, report);
        let copy = timings.copy_result(step, copy_wrong);
        log_put_step(report, step, &copy);
        report.copy.push(copy);
    }
    sync_barrier(shmem, stream)?;
    sweep.free();
    Ok(())
}

/// One size of the put sweep.
#[derive(Clone, Copy)]
struct Step {
    bytes: usize,
    grid: PutGrid,
    /// Transfers per timed batch.
    iters: u32,
}

impl Step {
    fn new(bytes: usize, grid_blocks: u32) -> Self {
        Step {
            bytes,
            grid: PutGrid::new(bytes, grid_blocks),
            iters: (BATCH_BYTES / bytes as u64).clamp(10, 1000) as u32,
        }
    }
}

/// Milliseconds per batch of one size, one list of trials per peer offset k.
struct Timings {
    put_ms: Vec<Vec<f64>>,
    get_ms: Vec<Vec<f64>>,
    copy_ms: Vec<f64>,
}

impl Timings {
    fn copy_result(&self, step: Step, wrong_bytes: u64) -> CopyResult {
        CopyResult {
            bytes: step.bytes as u64,
            iters: step.iters,
            gbps: gbps(step.bytes, step.iters, median(&self.copy_ms)),
            gbps_best: gbps(step.bytes, step.iters, min(&self.copy_ms)),
            wrong_bytes,
        }
    }
}

/// What every size of the sweep shares: `src` holds this rank's put source, `dst`
/// receives (with [`PUT_GUARD`] bytes after the largest message), `host` stages checks.
struct PutSweep<'s> {
    shmem: &'s Nvshmem,
    stream: &'s Arc<CudaStream>,
    seed: u64,
    src: SymmetricBuffer<'s>,
    dst: SymmetricBuffer<'s>,
    host: Vec<u8>,
}

impl<'s> PutSweep<'s> {
    fn new(
        shmem: &'s Nvshmem,
        stream: &'s Arc<CudaStream>,
        seed: u64,
        max: usize,
    ) -> anyhow::Result<Self> {
        let src = shmem.alloc(max)?;
        let dst = shmem.alloc(max + PUT_GUARD)?;
        let mut host = vec![0u8; max + PUT_GUARD];
        put_source(seed, shmem.rank()).fill(0, &mut host[..max]);
        upload(stream, &src, &host[..max])?;
        Ok(PutSweep {
            shmem,
            stream,
            seed,
            src,
            dst,
            host,
        })
    }

    /// Collective, like the allocations.
    fn free(self) {
        self.dst.free();
        self.src.free();
    }

    /// The PE at offset `k` from this rank.
    fn peer(&self, k: usize) -> usize {
        (self.shmem.rank() + k) % self.shmem.world()
    }

    fn barrier(&self) -> anyhow::Result<()> {
        sync_barrier(self.shmem, self.stream)
    }

    fn rma(&self, op: Rma, step: Step, k: usize) -> anyhow::Result<()> {
        let (dst, src) = (&self.dst, &self.src);
        launch::rma(
            op,
            self.stream,
            dst,
            src,
            step.bytes,
            self.peer(k),
            step.grid,
        )
    }

    fn copy(&self, step: Step) -> anyhow::Result<()> {
        copy_dtod(self.stream, &self.dst, &self.src, step.bytes)
    }

    fn poison(&self, step: Step) -> anyhow::Result<()> {
        poison(self.stream, &self.dst, step.bytes + PUT_GUARD)
    }

    /// Warm-up: one of each, untimed.
    fn warm_up(&self, step: Step) -> anyhow::Result<()> {
        for k in 0..self.shmem.world() {
            self.barrier()?;
            self.rma(Rma::Put, step, k)?;
        }
        self.barrier()?;
        self.copy(step)
    }

    /// Timed: trials interleave every offset, both directions and the copy, so drift
    /// hits all alike. Nobody writes `src`, so gets read what was uploaded.
    fn time(&self, step: Step, trials: u32) -> anyhow::Result<Timings> {
        let world = self.shmem.world();
        let mut put_ms = vec![Vec::new(); world];
        let mut get_ms = vec![Vec::new(); world];
        let mut copy_ms = Vec::new();
        for _ in 0..trials {
            for (op, ms) in [(Rma::Put, &mut put_ms), (Rma::Get, &mut get_ms)] {
                for (k, samples) in ms.iter_mut().enumerate() {
                    self.barrier()?;
                    samples.push(timed(self.stream, || {
                        (0..step.iters).try_for_each(|_| self.rma(op, step, k))
                    })?);
                }
            }
            self.barrier()?;
            copy_ms.push(timed(self.stream, || {
                (0..step.iters).try_for_each(|_| self.copy(step))
            })?);
        }
        Ok(Timings {
            put_ms,
            get_ms,
            copy_ms,
        })
    }

    /// Checks: poison everywhere, one put, then what arrived from (rank - k).
    fn check_puts(&mut self, step: Step) -> anyhow::Result<Vec<PutCheck>> {
        let (rank, world) = (self.shmem.rank(), self.shmem.world());
        let mut checks = Vec::new();
        for k in 0..world {
            let from = (rank + world - k) % world;
            self.barrier()?;
            self.poison(step)?;
            self.barrier()?;
            self.rma(Rma::Put, step, k)?;
            self.barrier()?;
            checks.push(self.received(step, from)?);
        }
        Ok(checks)
    }

    /// Get checks: poison the local buffer, fetch from peer(k), compare with its bytes.
    fn check_gets(&mut self, step: Step) -> anyhow::Result<Vec<PutCheck>> {
        let mut checks = Vec::new();
        for k in 0..self.shmem.world() {
            self.barrier()?;
            self.poison(step)?;
            self.rma(Rma::Get, step, k)?;
            checks.push(self.received(step, self.peer(k))?);
        }
        Ok(checks)
    }

    /// The copy baseline's wrong bytes: this rank's own bytes, copied on the GPU.
    fn check_copy(&mut self, step: Step) -> anyhow::Result<u64> {
        self.barrier()?;
        self.poison(step)?;
        self.copy(step)?;
        Ok(self.received(step, self.shmem.rank())?.wrong_bytes)
    }

    /// `dst` against what PE `from` sends, and its guard against the poison.
    fn received(&mut self, step: Step, from: usize) -> anyhow::Result<PutCheck> {
        let bytes = step.bytes;
        let host = &mut self.host[..bytes + PUT_GUARD];
        download(self.stream, &self.dst, host)?;
        let mut m = put_source(self.seed, from).compare(0, &host[..bytes]);
        m.add_fill_check(bytes as u64, POISON, &host[bytes..]);
        Ok(PutCheck {
            bytes: bytes as u64,
            src_pe: from,
            dst_pe: self.shmem.rank(),
            wrong_bytes: m.wrong_bytes,
            first_wrong_offset: m.first_offset,
        })
    }

    /// Data moves from the owner of `src` to the owner of `dst`: for put that is this
    /// rank to peer(k), for get peer(k) to this rank.
    fn record_bandwidths(&self, step: Step, timings: &Timings, report: &mut RankReport) {
        let rank = self.shmem.rank();
        for (op, ms, results) in [
            (Rma::Put, &timings.put_ms, &mut report.put),
            (Rma::Get, &timings.get_ms, &mut report.get),
        ] {
            for (k, samples) in ms.iter().enumerate() {
                let (src_pe, dst_pe) = match op {
                    Rma::Put => (rank, self.peer(k)),
                    Rma::Get => (self.peer(k), rank),
                };
                results.push(PutResult {
                    bytes: step.bytes as u64,
                    src_pe,
                    dst_pe,
                    iters: step.iters,
                    gbps: gbps(step.bytes, step.iters, median(samples)),
                    gbps_best: gbps(step.bytes, step.iters, min(samples)),
                });
            }
        }
    }
}

/// One line per size: this rank's put and get to itself, the copy, and the wrong bytes.
fn log_put_step(report: &RankReport, step: Step, copy: &CopyResult) {
    let (rank, bytes) = (report.rank, step.bytes);
    let self_put = report
        .put
        .iter()
        .rev()
        .find(|p| p.dst_pe == rank)
        .map_or(f64::NAN, |p| p.gbps);
    let self_get = report
        .get
        .iter()
        .rev()
        .find(|p| p.src_pe == rank)
        .map_or(f64::NAN, |p| p.gbps);
    let wrong: u64 = report
        .put_checks
        .iter()
        .chain(&report.get_checks)
        .filter(|c| c.bytes == bytes as u64)
        .map(|c| c.wrong_bytes)
        .sum();
    log!(
        rank,
        "put/get {bytes:>10} B: self put {self_put:8.1} GB/s, get {self_get:8.1} GB/s, copy {:8.1} GB/s, {} blocks, wrong bytes {}",
        copy.gbps,
        step.grid.nblocks,
        wrong + copy.wrong_bytes
    );
}

fn dispatch_test(
    shmem: &Nvshmem,
    stream: &Arc<CudaStream>,
    opts: &TestOptions,
) -> anyhow::Result<DispatchResult> {
    let (rank, world) = (shmem.rank(), shmem.world());
    let shape = opts.dispatch_shape(world);
    shape.validate().map_err(anyhow::Error::msg)?;
    let send = shmem.alloc(shape.send_bytes())?;
    let recv = shmem.alloc(shape.recv_bytes())?;
    upload(
        stream,
        &send,
        &routing::send_buffer(&shape, opts.seed, rank),
    )?;
    let plan = routing::send_plan(&shape, opts.seed, rank);
    let items = DeviceItems::upload(
        stream,
        &plan,
        shape.tokens,
        shape.token_bytes,
        shape.recv_bytes(),
        world,
    )?;
    stream
        .synchronize()
        .context("uploading the dispatch plan")?;

    // Trial 0 is the warm-up; every trial starts from a poisoned receive buffer and
    // the last one is checked.
    let mut ms = Vec::new();
    for trial in 0..=opts.trials {
        sync_barrier(shmem, stream)?;
        poison(stream, &recv, shape.recv_bytes())?;
        sync_barrier(shmem, stream)?;
        let t = timed(stream, || {
            launch::dispatch(stream, &recv, &send, shape.token_bytes, &items)
        })?;
        if trial > 0 {
            ms.push(t);
        }
    }
    sync_barrier(shmem, stream)?;
    let mut host = vec![0u8; shape.recv_bytes()];
    download(stream, &recv, &mut host)?;
    let check = routing::check_receive_buffer(&shape, opts.seed, rank, &host);
    let bytes_sent = (plan.len() * shape.token_bytes) as u64;
    let result = DispatchResult {
        tokens: shape.tokens,
        token_bytes: shape.token_bytes,
        topk: shape.topk,
        experts: shape.experts(),
        items_sent: plan.len() as u64,
        bytes_sent,
        tokens_received: check.expected_tokens,
        gbps: bytes_sent as f64 / (median(&ms) * 1e-3) / 1e9,
        wrong_tokens: check.wrong_tokens,
        wrong_bytes: check.wrong_bytes,
        poison_overwritten_bytes: check.poison_overwritten,
        first_error: check.first_error.clone(),
    };
    log!(
        rank,
        "dispatch: sent {} tokens ({:.1} MB) in {:.3} ms, received {}, wrong tokens {}, poison overwritten {}",
        result.items_sent,
        bytes_sent as f64 / 1e6,
        median(&ms),
        result.tokens_received,
        result.wrong_tokens,
        result.poison_overwritten_bytes
    );
    sync_barrier(shmem, stream)?;
    recv.free();
    send.free();
    Ok(result)
}

fn pingpong_test(
    shmem: &Nvshmem,
    stream: &Arc<CudaStream>,
    opts: &TestOptions,
) -> anyhow::Result<Vec<PingPongResult>> {
    let (rank, world) = (shmem.rank(), shmem.world());
    let warmup = opts.pingpong_warmup as usize;
    let total = warmup + opts.pingpong_rounds as usize;
    let sig = shmem.alloc(8)?;
    let mut times = PingPongTimes::new(stream, total)?;
    let pairs: Vec<(usize, usize)> = if world == 1 {
        vec![(0, 0)]
    } else {
        (1..world).map(|p| (0, p)).collect()
    };
    let mut results = Vec::new();
    for (a, b) in pairs {
        sync_barrier(shmem, stream)?;
        // SAFETY: sig is an 8-byte symmetric allocation.
        unsafe { result::memset_d8_async(sig.device_ptr(), 0, 8, stream.cu_stream()) }
            .context("cuMemsetD8Async (clearing the signal word)")?;
        sync_barrier(shmem, stream)?;
        let role = if rank == a {
            Some(Role::Initiator)
        } else if rank == b {
            Some(Role::Responder)
        } else {
            None
        };
        if let Some(role) = role {
            let peer = if role == Role::Initiator { b } else { a };
            launch::pingpong(
                stream,
                &sig,
                peer,
                total,
                role == Role::Initiator,
                &mut times,
            )?;
        }
        stream
            .synchronize()
            .with_context(|| format!("waiting for the ping-pong kernel ({a} <-> {b})"))?;
        sync_barrier(shmem, stream)?;
        let Some(role) = role else { continue };

        let mut word = [0u8; 8];
        download(stream, &sig, &mut word)?;
        let signal_ok = u64::from_le_bytes(word) == total as u64;
        let round_trip = if role == Role::Initiator {
            let cycles = stream
                .clone_dtoh(&times.cycles)
                .context("reading ping-pong timings")?;
            let span = stream
                .clone_dtoh(&times.span)
                .context("reading ping-pong timings")?;
            ensure!(span[1] > 0, "ping-pong kernel recorded no cycles");
            let ns_per_cycle = span[0] as f64 / span[1] as f64;
            let samples: Vec<f64> = cycles[warmup..total]
                .iter()
                .map(|&c| c as f64 * ns_per_cycle)
                .collect();
            LatencyStats::from_ns(&samples)
        } else {
            None
        };
        if let Some(s) = &round_trip {
            log!(
                rank,
                "ping-pong {a}<->{b}: p50 {:.2} us, p99 {:.2} us, signal {}",
                s.p50_us,
                s.p99_us,
                if signal_ok { "ok" } else { "WRONG" }
            );
        }
        results.push(PingPongResult {
            initiator: a,
            responder: b,
            role,
            rounds: opts.pingpong_rounds,
            signal_ok,
            round_trip,
        });
    }
    sync_barrier(shmem, stream)?;
    sig.free();
    Ok(results)
}

/// Waits for this rank's stream, then for every PE to get here.
fn sync_barrier(shmem: &Nvshmem, stream: &CudaStream) -> anyhow::Result<()> {
    stream
        .synchronize()
        .context("synchronising the stream (a kernel failed?)")?;
    shmem.barrier_all();
    Ok(())
}

/// Milliseconds the work `f` enqueues takes on `stream`, from CUDA events.
fn timed(stream: &Arc<CudaStream>, f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let start = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .context("recording a CUDA event")?;
    f()?;
    let end = stream
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .context("recording a CUDA event")?;
    let ms = start
        .elapsed_ms(&end)
        .context("timing with CUDA events (a kernel failed?)")?;
    Ok(f64::from(ms))
}

fn poison(stream: &CudaStream, buf: &SymmetricBuffer<'_>, bytes: usize) -> anyhow::Result<()> {
    ensure!(
        bytes <= buf.len(),
        "poisoning {bytes} bytes of a {}-byte buffer",
        buf.len()
    );
    // SAFETY: the range lies inside the allocation.
    unsafe { result::memset_d8_async(buf.device_ptr(), POISON, bytes, stream.cu_stream()) }
        .context("cuMemsetD8Async (poisoning a receive buffer)")
}

fn copy_dtod(
    stream: &CudaStream,
    dst: &SymmetricBuffer<'_>,
    src: &SymmetricBuffer<'_>,
    bytes: usize,
) -> anyhow::Result<()> {
    ensure!(
        bytes <= dst.len() && bytes <= src.len(),
        "copy of {bytes} bytes exceeds its buffers"
    );
    // SAFETY: both ranges lie inside their allocations, which do not overlap.
    unsafe {
        result::memcpy_dtod_async(
            dst.device_ptr(),
            src.device_ptr(),
            bytes,
            stream.cu_stream(),
        )
    }
    .context("cuMemcpyDtoDAsync")
}

fn upload(stream: &CudaStream, buf: &SymmetricBuffer<'_>, data: &[u8]) -> anyhow::Result<()> {
    ensure!(
        data.len() <= buf.len(),
        "uploading {} bytes into a {}-byte buffer",
        data.len(),
        buf.len()
    );
    // SAFETY: the range lies inside the allocation; `data` outlives the copy because
    // we synchronise before returning.
    unsafe { result::memcpy_htod_async(buf.device_ptr(), data, stream.cu_stream()) }
        .context("cuMemcpyHtoDAsync")?;
    stream
        .synchronize()
        .context("waiting for a host-to-device copy")
}

fn download(stream: &CudaStream, buf: &SymmetricBuffer<'_>, out: &mut [u8]) -> anyhow::Result<()> {
    ensure!(
        out.len() <= buf.len(),
        "downloading {} bytes from a {}-byte buffer",
        out.len(),
        buf.len()
    );
    // SAFETY: as in upload.
    unsafe { result::memcpy_dtoh_async(out, buf.device_ptr(), stream.cu_stream()) }
        .context("cuMemcpyDtoHAsync")?;
    stream
        .synchronize()
        .context("waiting for a device-to-host copy")
}

fn gbps(bytes: usize, iters: u32, ms: f64) -> f64 {
    bytes as f64 * f64::from(iters) / (ms * 1e-3) / 1e9
}

fn min(samples: &[f64]) -> f64 {
    samples.iter().copied().fold(f64::INFINITY, f64::min)
}

fn device_info(ctx: &Arc<CudaContext>) -> anyhow::Result<DeviceInfo> {
    let (major, minor) = ctx
        .compute_capability()
        .context("cuDeviceGetAttribute (compute capability)")?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name: ctx.name().context("cuDeviceGetName")?,
        compute_capability: format!("{major}.{minor}"),
        sm_count: ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .context("cuDeviceGetAttribute (SM count)")?,
        total_memory_bytes: ctx.total_mem().context("cuDeviceTotalMem")? as u64,
    })
}

/// The binary carries SASS only for the archs it was built for: say so plainly
/// instead of failing at the first launch with "no kernel image".
fn check_arch(device: &DeviceInfo) -> anyhow::Result<()> {
    let cc = device.compute_capability.replace('.', "");
    let built = crate::BUILT_ARCHS;
    if built.split(';').any(|a| a.trim_end_matches('a') == cc) {
        return Ok(());
    }
    bail!(
        "GPU {} ({}) is sm_{cc}, but this binary carries GPU code for sm_{{{built}}} only: rebuild with \
         COMMSTACK_CUDA_ARCHS including {cc}",
        device.ordinal,
        device.name
    )
}

fn nvshmem_info() -> NvshmemInfo {
    let library = loaded_library("libnvshmem_host");
    let layout = ffi::abi_layout();
    let (a, b, c) = Nvshmem::loaded_version();
    NvshmemInfo {
        header_version: format!(
            "{}.{}.{}",
            layout.header_major, layout.header_minor, layout.header_patch
        ),
        loaded_version: format!("{a}.{b}.{c}"),
        loaded_library: library.clone(),
        loaded_sha256: library.as_deref().and_then(|p| file_sha256(p.as_ref())),
        loaded_use_nccl: library
            .as_deref()
            .and_then(|p| build_variable(p.as_ref(), "NVSHMEM_USE_NCCL")),
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("NVSHMEM_"))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn file_sha256(path: &std::path::Path) -> Option<String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    std::io::copy(&mut std::fs::File::open(path).ok()?, &mut hasher).ok()?;
    Some(hex::encode(hasher.finalize()))
}

/// `KEY=VALUE` from NVSHMEM's build-variable string embedded in the library (the string
/// `nvshmem-info -a` prints): the value of the first `KEY=` in the file's bytes.
pub fn build_variable(path: &std::path::Path, key: &str) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let needle = format!("{key}=");
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_bytes())?;
    let value: Vec<u8> = bytes[at + needle.len()..]
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric())
        .copied()
        .collect();
    String::from_utf8(value).ok()
}

/// Path of the first mapped file whose name contains `needle` (from /proc/self/maps).
pub fn loaded_library(needle: &str) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|path| {
            path.rsplit('/')
                .next()
                .is_some_and(|name| name.contains(needle))
        })
        .map(str::to_string)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod library_identity_tests {
    use super::*;

    #[test]
    fn build_variable_reads_the_embedded_string() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libnvshmem_host.so.3");
        std::fs::write(
            &lib,
            b"\x7fELF..NVSHMEM_IBGDA_SUPPORT=ON NVSHMEM_USE_NCCL=OFF NCCL_HOME=/x\0",
        )
        .unwrap();
        assert_eq!(
            build_variable(&lib, "NVSHMEM_USE_NCCL").as_deref(),
            Some("OFF")
        );
        assert_eq!(build_variable(&lib, "NVSHMEM_MPI_SUPPORT"), None);
        assert_eq!(file_sha256(&lib).unwrap().len(), 64);
    }
}
