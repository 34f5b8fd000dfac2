//! Command-line options of `commstack-selftest` and how a launching process passes
//! them on to the per-GPU processes it starts.

use std::path::PathBuf;

use clap::{Args, Parser, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::routing::DispatchShape;

const ABOUT: &str = "NVSHMEM self-test: put bandwidth, MoE-style dispatch, signal ping-pong";

const LONG_ABOUT: &str = "\
NVSHMEM self-test for one machine: one process per GPU, bootstrapped with an NVSHMEM \
unique id that rank 0 hands out over a TCP rendezvous.

Tests (all inputs are seeded random bytes, never zeros; every result is compared with a \
CPU reference):
  put       nvshmemx_putmem_block bandwidth over message sizes (default 4 KiB..256 MiB),
            from every GPU to every GPU including itself, next to a device-to-device
            copy (cuMemcpyDtoDAsync) baseline measured on each GPU in the same run;
            each received message is checked byte by byte, and the bytes after it
            must still hold the poison value.
  dispatch  an all-to-all token dispatch shaped like MoE dispatch: each token picks
            top-k experts at random and goes once to each GPU hosting one; receive
            buffers are poisoned first and checked token by token afterwards.
  pingpong  signal ping-pong latency (nvshmemx_signal_op + nvshmem_signal_wait_until),
            p50/p99 round trip, between GPU 0 and every other GPU (1 GPU: itself).

Modes:
  --gpus N            start N processes of this program (RANK, WORLD_SIZE, LOCAL_RANK
                      set; GPU i = LOCAL_RANK i), merge their reports, print a table;
                      with --pes-per-gpu K, N*K processes, K on each GPU (CUDA MPS).
  RANK + WORLD_SIZE   set by a launcher: run as that rank (GPU LOCAL_RANK, default
                      RANK); rendezvous at --rdzv / COMMSTACK_RDZV_ADDR when WORLD_SIZE>1,
                      where rank 0 hands out its seed: ranks without --seed take it, ranks
                      given another --seed make every rank refuse to run (exit 2).

Environment given to the processes it starts, unless already set: NVSHMEM_DISABLE_NVLS=1
(shared multi-GPU machines need NVLink multicast off), NVSHMEM_SYMMETRIC_SIZE (enough for
the largest message), NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo and NVSHMEM_REMOTE_TRANSPORT=none
(all processes are on this machine). Under a launcher only the first two are defaulted.

Output: the table on stdout; with --json FILE the full report (schema commstack-selftest/1;
under a launcher with WORLD_SIZE>1 each rank writes FILE.rank<R>).

Exit status: 0 all checks passed; 1 a wrong byte or signal was found; 2 error (no CUDA
driver, a rank failed or timed out, bad arguments); 3 data right but
--require-put-copy-ratio not met.";

#[derive(Debug, Parser)]
#[command(name = "commstack-selftest", version, about = ABOUT, long_about = LONG_ABOUT)]
pub struct Cli {
    /// Number of GPUs (processes) to start; ignored when RANK and WORLD_SIZE are set.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus: u32,

    /// PEs (processes) per GPU with --gpus: PE r runs on GPU r / N. More than 1 is
    /// NVSHMEM's multiple-PEs-per-GPU mode, which needs the CUDA MPS daemon running
    /// (`nvidia-cuda-mps-control -d`, found through CUDA_MPS_PIPE_DIRECTORY); the ranks get
    /// NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 and
    /// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/N unless set.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub pes_per_gpu: u32,

    /// Write the full report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Wall-clock limit for the whole run, in seconds (the processes are killed after it).
    #[arg(long, default_value_t = 900, value_name = "SECONDS")]
    pub timeout: u64,

    /// Fail with exit status 3 unless every GPU's put to itself at the largest size
    /// reaches this fraction of its device-to-device copy (gpu runs ask 0.85; unset: reported only).
    #[arg(long, value_name = "FRACTION")]
    pub require_put_copy_ratio: Option<f64>,

    /// Rendezvous address HOST:PORT where rank 0 listens (launcher mode, WORLD_SIZE > 1).
    #[arg(long, env = "COMMSTACK_RDZV_ADDR", value_name = "HOST:PORT")]
    pub rdzv: Option<String>,

    #[command(flatten)]
    pub test: TestArgs,
}

/// The options that shape the measurement; passed verbatim to every rank.
#[derive(Debug, Clone, Args)]
pub struct TestArgs {
    /// Seed of all random inputs (default: a fresh one, printed and recorded). Under a
    /// launcher (WORLD_SIZE > 1) rank 0's is every rank's, handed out at the rendezvous;
    /// ranks started with different --seed values refuse to run.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Tests to run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "put-get,dispatch,pingpong"
    )]
    pub tests: Vec<TestKind>,

    /// Smallest put message (bytes; K/M/G suffixes are binary: 4K = 4096).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub min_bytes: u64,

    /// Largest put message; sizes double from --min-bytes up to it.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub max_bytes: u64,

    /// Timed trials per measurement (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub trials: u32,

    /// Tokens per GPU in the dispatch test.
    #[arg(long, default_value_t = 1024)]
    pub dispatch_tokens: usize,

    /// Bytes per token (default: hidden size 7168 in bf16); a multiple of 16.
    #[arg(long, default_value_t = 14336)]
    pub token_bytes: usize,

    /// Experts each token is routed to.
    #[arg(long, default_value_t = 8)]
    pub topk: usize,

    /// Experts hosted per GPU.
    #[arg(long, default_value_t = 32)]
    pub experts_per_gpu: usize,

    /// Timed ping-pong rounds per pair.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub pingpong_rounds: u32,

    /// Untimed ping-pong rounds before them.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub pingpong_warmup: u32,

    /// Seconds to wait for all ranks at the rendezvous.
    #[arg(long, default_value_t = 120)]
    pub rdzv_timeout: u64,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum TestKind {
    /// nvshmemx_putmem_block and nvshmemx_getmem_block, swept together over the sizes:
    /// named `put-get` (reports and --tests); `put` is still read as its old name.
    #[value(name = "put-get", alias = "put")]
    #[serde(rename = "put-get", alias = "put")]
    Put,
    Dispatch,
    Pingpong,
}

/// [`TestArgs`] with the seed decided; recorded in the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestOptions {
    pub seed: u64,
    pub tests: Vec<TestKind>,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub trials: u32,
    pub dispatch_tokens: usize,
    pub token_bytes: usize,
    pub topk: usize,
    pub experts_per_gpu: usize,
    pub pingpong_rounds: u32,
    pub pingpong_warmup: u32,
    pub rdzv_timeout: u64,
}

impl TestArgs {
    /// The options with the seed decided, validated for a run on `world` GPUs.
    pub fn resolve(
        &self,
        world: usize,
        fresh_seed: impl FnOnce() -> u64,
    ) -> Result<TestOptions, String> {
        let mut tests = self.tests.clone();
        tests.sort();
        tests.dedup();
        let opts = TestOptions {
            seed: self.seed.unwrap_or_else(fresh_seed),
            tests,
            min_bytes: self.min_bytes,
            max_bytes: self.max_bytes,
            trials: self.trials,
            dispatch_tokens: self.dispatch_tokens,
            token_bytes: self.token_bytes,
            topk: self.topk,
            experts_per_gpu: self.experts_per_gpu,
            pingpong_rounds: self.pingpong_rounds,
            pingpong_warmup: self.pingpong_warmup,
            rdzv_timeout: self.rdzv_timeout,
        };
        opts.validate(world)?;
        Ok(opts)
    }
}

impl TestOptions {
    pub fn validate(&self, world: usize) -> Result<(), String> {
        if self.tests.is_empty() {
            return Err("--tests is empty".into());
        }
        if self.min_bytes == 0 || self.min_bytes > self.max_bytes {
            return Err(format!(
                "--min-bytes {} must be at least 1 and at most --max-bytes {}",
                self.min_bytes, self.max_bytes
            ));
        }
        if self.max_bytes > 1 << 36 {
            return Err(format!(
                "--max-bytes {} is more than 64 GiB",
                self.max_bytes
            ));
        }
        if self.runs(TestKind::Dispatch) {
            self.dispatch_shape(world).validate()?;
        }
        Ok(())
    }

    pub fn runs(&self, kind: TestKind) -> bool {
        self.tests.contains(&kind)
    }

    /// Put message sizes: min, 2*min, 4*min, ... and max.
    pub fn put_sizes(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        let mut s = self.min_bytes;
        while s < self.max_bytes {
            sizes.push(s);
            s = s.saturating_mul(2);
        }
        sizes.push(self.max_bytes);
        sizes
    }

    pub fn dispatch_shape(&self, world: usize) -> DispatchShape {
        DispatchShape {
            world,
            tokens: self.dispatch_tokens,
            token_bytes: self.token_bytes,
            experts_per_pe: self.experts_per_gpu,
            topk: self.topk,
        }
    }

    /// Symmetric heap this run needs per GPU, with headroom for NVSHMEM's own use.
    pub fn symmetric_heap_bytes(&self, world: usize) -> u64 {
        const GUARD: u64 = 4096;
        const HEADROOM: u64 = 256 << 20;
        let put = if self.runs(TestKind::Put) {
            2 * self.max_bytes + GUARD
        } else {
            0
        };
        let shape = self.dispatch_shape(world);
        let dispatch = if self.runs(TestKind::Dispatch) {
            (shape.send_bytes() + shape.recv_bytes()) as u64
        } else {
            0
        };
        let need = put.max(dispatch) + HEADROOM;
        need.div_ceil(64 << 20) * (64 << 20)
    }

    /// Arguments that make a child process parse exactly these options.
    pub fn to_args(&self) -> Vec<String> {
        let tests: Vec<&str> = self
            .tests
            .iter()
            .map(|t| match t {
                TestKind::Put => "put-get",
                TestKind::Dispatch => "dispatch",
                TestKind::Pingpong => "pingpong",
            })
            .collect();
        vec![
            format!("--seed={}", self.seed),
            format!("--tests={}", tests.join(",")),
            format!("--min-bytes={}", self.min_bytes),
            format!("--max-bytes={}", self.max_bytes),
            format!("--trials={}", self.trials),
            format!("--dispatch-tokens={}", self.dispatch_tokens),
            format!("--token-bytes={}", self.token_bytes),
            format!("--topk={}", self.topk),
            format!("--experts-per-gpu={}", self.experts_per_gpu),
            format!("--pingpong-rounds={}", self.pingpong_rounds),
            format!("--pingpong-warmup={}", self.pingpong_warmup),
            format!("--rdzv-timeout={}", self.rdzv_timeout),
        ]
    }
}

/// "4096", "4K", "4KiB", "256M", "1G" -> bytes (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 4096, 4K, 256M)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("{text:?}: unknown unit {other:?} (use K, M or G)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// How this process was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Start `gpus` workers and merge their reports.
    Launch { gpus: usize },
    /// Run as one rank. `report_to` is set when our own launcher started us.
    Worker {
        rank: usize,
        world: usize,
        local_rank: usize,
        report_to: Option<PathBuf>,
    },
}

/// Environment variables of the worker protocol.
pub mod env_names {
    pub const RANK: &str = "RANK";
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// Set by `--gpus` launching: where a worker writes its rank report.
    pub const REPORT: &str = "COMMSTACK_SELFTEST_REPORT";
    pub const RDZV_ADDR: &str = "COMMSTACK_RDZV_ADDR";
}

/// Decides the mode from RANK/WORLD_SIZE/LOCAL_RANK (via `get`) and `--gpus`.
pub fn detect_mode(gpus: u32, get: impl Fn(&str) -> Option<String>) -> Result<Mode, String> {
    let num = |name: &str| -> Result<Option<usize>, String> {
        match get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<usize>()
                .map(Some)
                .map_err(|_| format!("{name}={v:?} is not a non-negative integer")),
        }
    };
    match (num(env_names::RANK)?, num(env_names::WORLD_SIZE)?) {
        (None, None) => Ok(Mode::Launch {
            gpus: gpus as usize,
        }),
        (Some(rank), Some(world)) => {
            if world == 0 || rank >= world {
                return Err(format!("RANK={rank} must be below WORLD_SIZE={world}"));
            }
            let local_rank = num(env_names::LOCAL_RANK)?.unwrap_or(rank);
            let report_to = get(env_names::REPORT).map(PathBuf::from);
            Ok(Mode::Worker {
                rank,
                world,
                local_rank,
                report_to,
            })
        }
        (Some(_), None) => {
            Err("RANK is set but WORLD_SIZE is not: set both, or neither (then use --gpus)".into())
        }
        (None, Some(_)) => {
            Err("WORLD_SIZE is set but RANK is not: set both, or neither (then use --gpus)".into())
        }
    }
}

/// Where the CUDA MPS daemon's control pipe is (`CUDA_MPS_PIPE_DIRECTORY`, default
/// `/tmp/nvidia-mps`), from the environment `get` reads.
pub fn mps_control_pipe(get: impl Fn(&str) -> Option<String>) -> PathBuf {
    PathBuf::from(get("CUDA_MPS_PIPE_DIRECTORY").unwrap_or_else(|| "/tmp/nvidia-mps".into()))
        .join("control")
}

/// More than one PE per GPU needs the MPS daemon: an error saying how to start it when
/// its control pipe is not there.
pub fn require_mps(pes_per_gpu: u32, get: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let pipe = mps_control_pipe(get);
    if pes_per_gpu <= 1 || pipe.exists() {
        return Ok(());
    }
    Err(format!(
        "--pes-per-gpu {pes_per_gpu} needs the CUDA MPS daemon (NVSHMEM's multiple-PEs-per-GPU \
         mode), but there is no control pipe at {}: start it with `nvidia-cuda-mps-control -d` \
         (CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY the same for it and this run), \
         stop it after with `echo quit | nvidia-cuda-mps-control`",
        pipe.display()
    ))
}

/// The variables of NVSHMEM's multiple-PEs-per-GPU mode under MPS, for `pes_per_gpu` > 1
/// (none otherwise): each PE may use 100/N of the GPU's threads, and NVSHMEM is told not
/// to refuse the shared GPU over that percentage.
pub fn mps_env_defaults(pes_per_gpu: u32) -> Vec<(&'static str, String)> {
    if pes_per_gpu <= 1 {
        return Vec::new();
    }
    vec![
        (
            "NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            "1".to_string(),
        ),
        (
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
            (100 / pes_per_gpu).to_string(),
        ),
    ]
}

/// NVSHMEM variables a worker needs, each with its default; applied only where unset.
/// `local` adds the ones that hold when every process runs on this machine.
pub fn nvshmem_env_defaults(
    opts: &TestOptions,
    world: usize,
    local: bool,
) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("NVSHMEM_DISABLE_NVLS", "1".to_string()),
        (
            "NVSHMEM_SYMMETRIC_SIZE",
            opts.symmetric_heap_bytes(world).to_string(),
        ),
    ];
    if local {
        vars.push(("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo".to_string()));
        vars.push(("NVSHMEM_REMOTE_TRANSPORT", "none".to_string()));
    }
    vars
}
