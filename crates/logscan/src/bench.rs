//! `cargo xtask bench logscan`: write a large synthetic log (real-looking NCCL INFO chatter with
//! every known signature sprinkled in), scan it, report MB/s.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde::{Deserialize, Serialize};

use crate::kb::KnowledgeBase;
use crate::scan::Scanner;

/// One signature line every this-many lines: rare, as in real logs.
const SIGNATURE_EVERY: u64 = 997;

/// What a generated log holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyntheticLog {
    pub path: PathBuf,
    pub bytes: u64,
    pub lines: u64,
    /// How many lines of each signature were written.
    pub injected: BTreeMap<String, u64>,
}

/// The measured throughput of one scan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub bytes: u64,
    pub lines: u64,
    pub generate_seconds: f64,
    pub scan_seconds: f64,
    /// Decimal megabytes (10^6 bytes) per second of scanning.
    pub mb_per_s: f64,
    pub signature_lines: u64,
}

impl BenchResult {
    /// One line for docs/benchmarks.md.
    pub fn summary(&self) -> String {
        format!(
            "logscan: {:.0} MB, {} lines in {:.2} s = {:.0} MB/s ({} signature lines found, all expected)",
            self.bytes as f64 / 1e6,
            self.lines,
            self.scan_seconds,
            self.mb_per_s,
            self.signature_lines
        )
    }
}

/// Generate a synthetic log of about `target_bytes` in a temporary directory under `dir`, scan it
/// with the built-in knowledge base, check every injected signature was found exactly, and
/// report the scan throughput. The log is deleted afterwards.
pub fn run(dir: &Path, target_bytes: u64) -> Result<BenchResult> {
    let tmp = tempfile::Builder::new()
        .prefix("logscan-bench-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a temporary directory in {}", dir.display()))?;
    let kb = KnowledgeBase::builtin();
    let started = Instant::now();
    let log = generate(kb, &tmp.path().join("synthetic.log"), target_bytes, 0x5eed)?;
    let generate_seconds = started.elapsed().as_secs_f64();

    let file = File::open(&log.path).with_context(|| format!("opening {}", log.path.display()))?;
    let started = Instant::now();
    let mut scanner = Scanner::new(kb);
    scanner
        .scan("synthetic.log", file)
        .with_context(|| format!("reading {}", log.path.display()))?;
    let report = scanner.finish();
    let scan_seconds = started.elapsed().as_secs_f64();

    ensure!(
        report.total_lines() == log.lines,
        "scanned {} lines, wrote {}",
        report.total_lines(),
        log.lines
    );
    for (id, expected) in &log.injected {
        let found = report.hit(id).map_or(0, |h| h.count);
        ensure!(
            found == *expected,
            "signature {id}: wrote {expected} lines, scan found {found}"
        );
    }
    ensure!(
        report.matches.len() == log.injected.len(),
        "scan found signatures that were not written"
    );
    Ok(BenchResult {
        bytes: log.bytes,
        lines: log.lines,
        generate_seconds,
        scan_seconds,
        mb_per_s: log.bytes as f64 / 1e6 / scan_seconds,
        signature_lines: log.injected.values().sum(),
    })
}

/// Write a log of about `target_bytes`: NCCL/NVSHMEM INFO lines shaped like those in public
/// DeepEP and NCCL issue reports, DeepEP test output, and every signature's examples in turn.
pub fn generate(
    kb: &KnowledgeBase,
    path: &Path,
    target_bytes: u64,
    seed: u64,
) -> Result<SyntheticLog> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let examples: Vec<(&str, &str)> = kb
        .signatures()
        .iter()
        .flat_map(|s| s.examples.iter().map(move |e| (s.id.as_str(), e.as_str())))
        .collect();
    let mut rng = XorShift(seed | 1);
    let mut injected = BTreeMap::new();
    let mut written = 0u64;
    let mut lines = 0u64;
    let mut line = String::with_capacity(256);
    let mut next_example = 0usize;
    while written < target_bytes {
        line.clear();
        if lines % SIGNATURE_EVERY == SIGNATURE_EVERY - 1 {
            let (id, text) = examples[next_example % examples.len()];
            next_example += 1;
            *injected.entry(id.to_string()).or_insert(0) += 1;
            line.push_str(text);
        } else {
            chatter(&mut rng, &mut line);
        }
        line.push('\n');
        out.write_all(line.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        written += line.len() as u64;
        lines += 1;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(SyntheticLog {
        path: path.to_path_buf(),
        bytes: written,
        lines,
        injected,
    })
}

/// One line of ordinary output, shaped like the INFO lines in DeepEP issues 41 and 143.
fn chatter(rng: &mut XorShift, line: &mut String) {
    use std::fmt::Write as _;
    let rank = rng.below(8);
    let host = ["msm-h200-2", "0bc8f5b83646", "gpu-node-17"][rng.below(3) as usize];
    let pid = 4009 + rank;
    let tid = 4500 + rng.below(200);
    let _ = write!(line, "{host}:{pid}:{tid} [{rank}] ");
    match rng.below(10) {
        0 => {
            let _ = write!(
                line,
                "NCCL INFO Channel {:02}/0 : {}[{}] -> {}[{}] via P2P/CUMEM",
                rng.below(32),
                8 + rank,
                rank,
                8 + (rank + 1) % 8,
                (rank + 1) % 8
            );
        }
        1 => {
            let _ = write!(line, "NCCL INFO misc/socket.cc:{} -> 3", [47, 550, 573, 621, 752][rng.below(5) as usize]);
        }
        2 => {
            let _ = write!(
                line,
                "NCCL INFO comm 0x{:x} rank {} nranks 16 cudaDev {rank} nvmlDev {rank} busId {:x}000 commId 0x982b74f14551db09 - Init START",
                0x5600_0000_0000u64 + rng.below(1 << 40),
                8 + rank,
                0x61 + 2 * rank
            );
        }
        // Rarer: INFO lines that hold a warning word ("No such file") and so reach the classifier.
        3 if rng.below(5) == 0 => line.push_str(
            "NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation",
        ),
        3 => {
            let _ = write!(line, "NCCL INFO Trees [0] {}/-1/-1->{rank}->{} [1] -1/-1/-1->{rank}->{}", rank + 1, rank.max(1) - 1, rank.max(1) - 1);
        }
        4 => {
            let _ = write!(line, "NCCL INFO Setting affinity for GPU {rank} to ffffffff,00000000,ffffffff");
        }
        5 => {
            let _ = write!(line, "NVSHMEM INFO cudaDriverVersion 13000");
        }
        6 => {
            line.clear();
            let _ = write!(
                line,
                "[testing] Running with {}, {} top-k (async={}, previous={}) ... passed",
                ["BF16", "FP8"][rng.below(2) as usize],
                ["with", "without"][rng.below(2) as usize],
                rng.below(2) == 1,
                rng.below(2) == 1
            );
        }
        7 => {
            let _ = write!(line, "NCCL INFO Connected all rings, use ring PXN 0 GDR 1");
        }
        _ => {
            let _ = write!(
                line,
                "NCCL INFO threadThresholds 8/8/64 | 128/8/64 | 512 | 512; {} coll channels, 0 nvls channels, 32 p2p channels",
                16 + rng.below(16)
            );
        }
    }
}

/// Deterministic and dependency-free; quality is irrelevant here.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
