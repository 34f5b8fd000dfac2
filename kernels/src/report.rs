//! The self-test's results: per-rank reports, the merged report (JSON), the table, and
//! the verdict that becomes the exit code.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::options::TestOptions;

/// Identifies the JSON layout; bump when a field changes meaning.
pub const SCHEMA: &str = "commstack-selftest/1";

/// Exit codes of `commstack-selftest`.
pub mod exit_code {
    /// Every check passed (and every required ratio was met).
    pub const OK: i32 = 0;
    /// At least one wrong byte (or a ping-pong signal with the wrong value).
    pub const WRONG_DATA: i32 = 1;
    /// Setup or run failure: no driver, a rank that failed or timed out, bad arguments.
    pub const ERROR: i32 = 2;
    /// Data correct, but `--require-put-copy-ratio` was not met.
    pub const TOO_SLOW: i32 = 3;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    pub tool_version: String,
    pub seed: u64,
    pub world_size: usize,
    pub options: TestOptions,
    /// One per rank that finished; a failed rank is listed in `errors` instead.
    pub ranks: Vec<RankReport>,
    /// Problems that kept a rank from reporting (crash, timeout, error message).
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    pub local_rank: usize,
    pub hostname: String,
    pub device: DeviceInfo,
    pub nvshmem: NvshmemInfo,
    /// Blocks of the put kernel resident at once (its largest grid).
    pub put_grid_blocks: u32,
    /// Put bandwidth measured by this rank as the sender.
    pub put: Vec<PutResult>,
    /// What this rank received from its put senders, checked byte by byte.
    pub put_checks: Vec<PutCheck>,
    /// Get bandwidth measured by this rank as the reader (src_pe: whose memory it read).
    #[serde(default)]
    pub get: Vec<PutResult>,
    /// What this rank read with get from each PE, checked byte by byte.
    #[serde(default)]
    pub get_checks: Vec<PutCheck>,
    /// Device-to-device copy baseline (cuMemcpyDtoDAsync) on this GPU, same run.
    pub copy: Vec<CopyResult>,
    pub dispatch: Option<DispatchResult>,
    pub pingpong: Vec<PingPongResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: String,
    pub sm_count: i32,
    pub total_memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvshmemInfo {
    /// Version of the headers the kernels were compiled with.
    pub header_version: String,
    /// Version reported by the libnvshmem_host that was loaded.
    pub loaded_version: String,
    /// Path of the loaded libnvshmem_host (from /proc/self/maps).
    pub loaded_library: Option<String>,
    /// sha256 of that file: a drop-in NVSHMEM sits at the same path as NVIDIA's, so the
    /// path alone cannot say which one ran.
    #[serde(default)]
    pub loaded_sha256: Option<String>,
    /// `NVSHMEM_USE_NCCL` as the loaded library's build-variable string records it (ours
    /// OFF, NVIDIA's wheel ON).
    #[serde(default)]
    pub loaded_use_nccl: Option<String>,
    /// NVSHMEM_* variables in this rank's environment.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutResult {
    pub bytes: u64,
    pub src_pe: usize,
    pub dst_pe: usize,
    pub iters: u32,
    /// Median over trials of bytes * iters / time, in 1e9 bytes per second.
    pub gbps: f64,
    pub gbps_best: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutCheck {
    pub bytes: u64,
    pub src_pe: usize,
    pub dst_pe: usize,
    /// Wrong bytes in the message plus bytes overwritten past its end.
    pub wrong_bytes: u64,
    pub first_wrong_offset: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyResult {
    pub bytes: u64,
    pub iters: u32,
    pub gbps: f64,
    pub gbps_best: f64,
    pub wrong_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DispatchResult {
    pub tokens: usize,
    pub token_bytes: usize,
    pub topk: usize,
    pub experts: usize,
    /// (token, destination) puts this rank issued, and their bytes.
    pub items_sent: u64,
    pub bytes_sent: u64,
    pub tokens_received: u64,
    /// Median over trials of bytes_sent / dispatch time.
    pub gbps: f64,
    pub wrong_tokens: u64,
    pub wrong_bytes: u64,
    pub poison_overwritten_bytes: u64,
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PingPongResult {
    pub initiator: usize,
    pub responder: usize,
    /// This rank's role in the pair.
    pub role: Role,
    pub rounds: u32,
    /// The signal word held the last round's value at the end.
    pub signal_ok: bool,
    /// Round-trip latency; measured by the initiator only.
    pub round_trip: Option<LatencyStats>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Initiator,
    Responder,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

impl LatencyStats {
    /// Statistics of `samples_ns` (nearest-rank percentiles). None if empty.
    pub fn from_ns(samples_ns: &[f64]) -> Option<Self> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut s = samples_ns.to_vec();
        s.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
            s[rank.clamp(1, s.len()) - 1] / 1e3
        };
        Some(Self {
            p50_us: pct(50.0),
            p99_us: pct(99.0),
            mean_us: s.iter().sum::<f64>() / s.len() as f64 / 1e3,
            min_us: s[0] / 1e3,
            max_us: s[s.len() - 1] / 1e3,
        })
    }
}

/// Median of a non-empty list of samples.
pub fn median(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The put/copy ratio the self-test's benchmark checks: a GPU's put to itself at the largest size
/// over its device-to-device copy at that size, both medians from the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutCopyRatio {
    pub rank: usize,
    pub bytes: u64,
    pub put_gbps: f64,
    pub copy_gbps: f64,
    pub ratio: f64,
}

/// The overall outcome, mapped to an exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    WrongData,
    Error,
    TooSlow,
}

impl Verdict {
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Ok => exit_code::OK,
            Verdict::WrongData => exit_code::WRONG_DATA,
            Verdict::Error => exit_code::ERROR,
            Verdict::TooSlow => exit_code::TOO_SLOW,
        }
    }
}

impl RankReport {
    /// Wrong bytes found by this rank, over all checks.
    pub fn wrong_bytes(&self) -> u64 {
        let put: u64 = self
            .put_checks
            .iter()
            .chain(&self.get_checks)
            .map(|c| c.wrong_bytes)
            .sum();
        let copy: u64 = self.copy.iter().map(|c| c.wrong_bytes).sum();
        let dispatch = self
            .dispatch
            .as_ref()
            .map_or(0, |d| d.wrong_bytes + d.poison_overwritten_bytes);
        put + copy + dispatch
    }

    pub fn bad_signals(&self) -> usize {
        self.pingpong.iter().filter(|p| !p.signal_ok).count()
    }

    /// The put-to-self over copy ratio at the largest size both were measured at.
    pub fn put_copy_ratio(&self) -> Option<PutCopyRatio> {
        let put = self
            .put
            .iter()
            .filter(|p| p.dst_pe == self.rank && p.src_pe == self.rank)
            .max_by_key(|p| p.bytes)?;
        let copy = self.copy.iter().find(|c| c.bytes == put.bytes)?;
        Some(PutCopyRatio {
            rank: self.rank,
            bytes: put.bytes,
            put_gbps: put.gbps,
            copy_gbps: copy.gbps,
            ratio: if copy.gbps > 0.0 {
                put.gbps / copy.gbps
            } else {
                0.0
            },
        })
    }
}

impl Report {
    pub fn new(seed: u64, world_size: usize, options: TestOptions) -> Self {
        Self {
            schema: SCHEMA.to_string(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            seed,
            world_size,
            options,
            ranks: Vec::new(),
            errors: Vec::new(),
        }
    }

    pub fn wrong_bytes(&self) -> u64 {
        self.ranks.iter().map(RankReport::wrong_bytes).sum()
    }

    pub fn put_copy_ratios(&self) -> Vec<PutCopyRatio> {
        self.ranks
            .iter()
            .filter_map(RankReport::put_copy_ratio)
            .collect()
    }

    /// Wrong data beats everything: it is the one thing the self-test exists to catch.
    /// `expected_ranks` are the ranks this report should cover.
    pub fn verdict(&self, expected_ranks: usize, required_ratio: Option<f64>) -> Verdict {
        let bad_signals: usize = self.ranks.iter().map(RankReport::bad_signals).sum();
        if self.wrong_bytes() > 0 || bad_signals > 0 {
            return Verdict::WrongData;
        }
        if !self.errors.is_empty() || self.ranks.len() != expected_ranks {
            return Verdict::Error;
        }
        if let Some(required) = required_ratio {
            let ratios = self.put_copy_ratios();
            if ratios.is_empty() || ratios.iter().any(|r| r.ratio < required) {
                return Verdict::TooSlow;
            }
        }
        Verdict::Ok
    }

    /// Writes the report as pretty JSON, atomically (temp file + rename).
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        write_json_atomic(path, self)
    }

    pub fn read_json(path: &Path) -> anyhow::Result<Self> {
        read_json(path)
    }
}

pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value).context("serialising the report")?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text.as_bytes() as &[u8])
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// (bytes, src_pe, dst_pe): the transfer a result or check is about.
type Transfer = (u64, usize, usize);

impl PutResult {
    fn transfer(&self) -> Transfer {
        (self.bytes, self.src_pe, self.dst_pe)
    }
}

impl PutCheck {
    fn transfer(&self) -> Transfer {
        (self.bytes, self.src_pe, self.dst_pe)
    }
}

/// Every rank's `items`, by the transfer each is about.
fn by_transfer<'a, T>(
    report: &'a Report,
    items: impl Fn(&'a RankReport) -> &'a Vec<T>,
    transfer: fn(&T) -> Transfer,
) -> BTreeMap<Transfer, &'a T> {
    report
        .ranks
        .iter()
        .flat_map(items)
        .map(|t| (transfer(t), t))
        .collect()
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{name}", bytes / unit);
        }
    }
    format!("{bytes}B")
}

fn ok_mark(wrong: u64) -> String {
    if wrong == 0 {
        "ok".to_string()
    } else {
        format!("{wrong} WRONG")
    }
}

/// The human-readable summary printed by `commstack-selftest`.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    let transfers = Transfers::of(report);
    write_ranks(&mut out, report);
    write_self_sweep(&mut out, report, &transfers);
    write_pairs(&mut out, report, &transfers);
    write_dispatch(&mut out, report);
    write_pingpong(&mut out, report);
    write_summary(&mut out, report);
    out
}

/// Every rank's results and checks, by the transfer each is about.
struct Transfers<'a> {
    checks: BTreeMap<Transfer, &'a PutCheck>,
    /// Data moving src -> dst by get: what rank dst read from src.
    get_checks: BTreeMap<Transfer, &'a PutCheck>,
    gets: BTreeMap<Transfer, &'a PutResult>,
}

impl<'a> Transfers<'a> {
    fn of(report: &'a Report) -> Self {
        Transfers {
            checks: by_transfer(report, |r| &r.put_checks, PutCheck::transfer),
            get_checks: by_transfer(report, |r| &r.get_checks, PutCheck::transfer),
            gets: by_transfer(report, |r| &r.get, PutResult::transfer),
        }
    }

    /// The get bandwidth of the same transfer as `p`.
    fn get_gbps(&self, p: &PutResult) -> f64 {
        self.gets.get(&p.transfer()).map_or(f64::NAN, |g| g.gbps)
    }

    /// Wrong bytes of the put and get checks of the same transfer as `p`; None if unchecked.
    fn wrong_bytes(&self, p: &PutResult) -> Option<u64> {
        let key = p.transfer();
        let put = self.checks.get(&key).map(|c| c.wrong_bytes);
        let get = self.get_checks.get(&key).map(|c| c.wrong_bytes);
        match (put, get) {
            (None, None) => None,
            (p, g) => Some(p.unwrap_or(0) + g.unwrap_or(0)),
        }
    }

    /// Wrong bytes of every check from `src` to `dst`, at all sizes.
    fn wrong_bytes_between(&self, src: usize, dst: usize) -> u64 {
        self.checks
            .values()
            .chain(self.get_checks.values())
            .filter(|c| c.src_pe == src && c.dst_pe == dst)
            .map(|c| c.wrong_bytes)
            .sum()
    }
}

/// The title line and one line per rank: its GPU and the NVSHMEM it loaded.
fn write_ranks(w: &mut String, report: &Report) {
    let _ = writeln!(
        w,
        "commstack-selftest {}: {} PE(s), seed {}",
        report.tool_version, report.world_size, report.seed
    );
    for r in &report.ranks {
        let _ = writeln!(
            w,
            "  rank {} on {} GPU {} ({}, sm_{}, {} SMs); NVSHMEM headers {}, loaded {} from {} (sha256 {}, NVSHMEM_USE_NCCL={})",
            r.rank,
            r.hostname,
            r.device.ordinal,
            r.device.name,
            r.device.compute_capability.replace('.', ""),
            r.device.sm_count,
            r.nvshmem.header_version,
            r.nvshmem.loaded_version,
            r.nvshmem.loaded_library.as_deref().unwrap_or("?"),
            r.nvshmem
                .loaded_sha256
                .as_deref()
                .map_or("?", |h| &h[..h.len().min(12)]),
            r.nvshmem.loaded_use_nccl.as_deref().unwrap_or("?")
        );
    }
}

/// Sweep: every GPU's put to itself next to its copy baseline.
fn write_self_sweep(w: &mut String, report: &Report, transfers: &Transfers<'_>) {
    for r in &report.ranks {
        let selfs: Vec<&PutResult> = r.put.iter().filter(|p| p.dst_pe == r.rank).collect();
        if selfs.is_empty() && r.copy.is_empty() {
            continue;
        }
        let _ = writeln!(
            w,
            "\nput and get to self, rank {} (GB/s, median of {} trials; copy = cuMemcpyDtoDAsync)",
            r.rank, report.options.trials
        );
        let _ = writeln!(
            w,
            "  {:>8} {:>10} {:>10} {:>10} {:>7} {:>6}  check",
            "size", "put", "get", "copy", "ratio", "iters"
        );
        for p in selfs {
            let copy = r.copy.iter().find(|c| c.bytes == p.bytes);
            let copy_gbps = copy.map_or(f64::NAN, |c| c.gbps);
            let wrong = transfers.wrong_bytes(p).unwrap_or(0) + copy.map_or(0, |c| c.wrong_bytes);
            let _ = writeln!(
                w,
                "  {:>8} {:>10.1} {:>10.1} {:>10.1} {:>6.1}% {:>6}  {}",
                human_bytes(p.bytes),
                p.gbps,
                transfers.get_gbps(p),
                copy_gbps,
                100.0 * p.gbps / copy_gbps,
                p.iters,
                ok_mark(wrong)
            );
        }
    }
}

/// Pairs: every measured (src, dst) at the largest size, plus its worst check.
fn write_pairs(w: &mut String, report: &Report, transfers: &Transfers<'_>) {
    let remote: Vec<&PutResult> = report
        .ranks
        .iter()
        .flat_map(|r| &r.put)
        .filter(|p| p.src_pe != p.dst_pe)
        .collect();
    let Some(max) = remote.iter().map(|p| p.bytes).max() else {
        return;
    };
    let _ = writeln!(
        w,
        "\nput and get between GPUs at {} (GB/s, median; get = dst reading src)",
        human_bytes(max)
    );
    let _ = writeln!(
        w,
        "  {:>9} {:>10} {:>10} {:>10}  check (all sizes)",
        "src->dst", "put", "put best", "get"
    );
    for p in remote.iter().filter(|p| p.bytes == max) {
        let _ = writeln!(
            w,
            "  {:>9} {:>10.1} {:>10.1} {:>10.1}  {}",
            format!("{}->{}", p.src_pe, p.dst_pe),
            p.gbps,
            p.gbps_best,
            transfers.get_gbps(p),
            ok_mark(transfers.wrong_bytes_between(p.src_pe, p.dst_pe))
        );
    }
}

/// The MoE dispatch, one line per rank.
fn write_dispatch(w: &mut String, report: &Report) {
    let dispatches: Vec<(usize, &DispatchResult)> = report
        .ranks
        .iter()
        .filter_map(|r| r.dispatch.as_ref().map(|d| (r.rank, d)))
        .collect();
    let Some((_, d0)) = dispatches.first() else {
        return;
    };
    let _ = writeln!(
        w,
        "\nMoE dispatch: {} tokens x {} bytes per GPU, top-{} of {} experts",
        d0.tokens, d0.token_bytes, d0.topk, d0.experts
    );
    let _ = writeln!(
        w,
        "  {:>5} {:>8} {:>10} {:>9} {:>10}  check",
        "rank", "sent", "MB sent", "received", "GB/s"
    );
    for (rank, d) in &dispatches {
        let wrong = d.wrong_bytes + d.poison_overwritten_bytes;
        let _ = writeln!(
            w,
            "  {:>5} {:>8} {:>10.1} {:>9} {:>10.1}  {}{}",
            rank,
            d.items_sent,
            d.bytes_sent as f64 / 1e6,
            d.tokens_received,
            d.gbps,
            ok_mark(wrong),
            d.first_error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    }
}

/// The signal ping-pong, one line per pair (timed by the initiator, checked on both sides).
fn write_pingpong(w: &mut String, report: &Report) {
    let all = || report.ranks.iter().flat_map(|r| &r.pingpong);
    let pings: Vec<&PingPongResult> = all().filter(|p| p.role == Role::Initiator).collect();
    if pings.is_empty() {
        return;
    }
    let _ = writeln!(w, "\nsignal ping-pong, round trip (us)");
    let _ = writeln!(
        w,
        "  {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}  signals",
        "pair", "p50", "p99", "mean", "min", "rounds"
    );
    for p in pings {
        let responder_ok = all()
            .filter(|q| {
                q.role == Role::Responder
                    && q.initiator == p.initiator
                    && q.responder == p.responder
            })
            .all(|q| q.signal_ok);
        let s = p.round_trip.as_ref();
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let _ = writeln!(
            w,
            "  {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}  {}",
            format!("{}<->{}", p.initiator, p.responder),
            f(s.map(|s| s.p50_us)),
            f(s.map(|s| s.p99_us)),
            f(s.map(|s| s.mean_us)),
            f(s.map(|s| s.min_us)),
            p.rounds,
            if p.signal_ok && responder_ok {
                "ok"
            } else {
                "WRONG"
            }
        );
    }
}

/// The put/copy ratios, the errors, and the correctness line.
fn write_summary(w: &mut String, report: &Report) {
    let ratios = report.put_copy_ratios();
    if !ratios.is_empty() {
        let _ = writeln!(w);
        for r in ratios {
            let _ = writeln!(
                w,
                "put/copy at {} on rank {}: {:.1}% ({:.1} / {:.1} GB/s)",
                human_bytes(r.bytes),
                r.rank,
                100.0 * r.ratio,
                r.put_gbps,
                r.copy_gbps
            );
        }
    }
    for e in &report.errors {
        let _ = writeln!(w, "ERROR: {e}");
    }
    let wrong = report.wrong_bytes();
    let bad_signals: usize = report.ranks.iter().map(RankReport::bad_signals).sum();
    let _ = writeln!(
        w,
        "\ncorrectness: {}",
        if wrong == 0 && bad_signals == 0 {
            "every byte checked is right".to_string()
        } else {
            format!("{wrong} wrong bytes, {bad_signals} wrong signals")
        }
    );
}
