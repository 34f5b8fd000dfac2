//! Report handling: JSON round trip, verdicts (any wrong byte -> non-zero), the table.

use std::collections::BTreeMap;

use commstack_kernels::options::{TestKind, TestOptions};
use commstack_kernels::report::*;

fn options() -> TestOptions {
    TestOptions {
        seed: 12345,
        tests: vec![TestKind::Put, TestKind::Dispatch, TestKind::Pingpong],
        min_bytes: 4096,
        max_bytes: 256 << 20,
        trials: 5,
        dispatch_tokens: 1024,
        token_bytes: 14336,
        topk: 8,
        experts_per_gpu: 32,
        pingpong_rounds: 10_000,
        pingpong_warmup: 1000,
        rdzv_timeout: 120,
    }
}

fn rank(rank: usize, world: usize) -> RankReport {
    let mut put = Vec::new();
    let mut put_checks = Vec::new();
    let (mut get, mut get_checks) = (Vec::new(), Vec::new());
    let mut copy = Vec::new();
    for bytes in [4096u64, 256 << 20] {
        for k in 0..world {
            let dst = (rank + k) % world;
            put.push(PutResult {
                bytes,
                src_pe: rank,
                dst_pe: dst,
                iters: 10,
                gbps: 2000.0,
                gbps_best: 2050.0,
            });
            let src = (rank + world - k) % world;
            put_checks.push(PutCheck {
                bytes,
                src_pe: src,
                dst_pe: rank,
                wrong_bytes: 0,
                first_wrong_offset: None,
            });
            // This rank reads from `dst` (= rank + k).
            get.push(PutResult {
                bytes,
                src_pe: dst,
                dst_pe: rank,
                iters: 10,
                gbps: 1800.0,
                gbps_best: 1850.0,
            });
            get_checks.push(PutCheck {
                bytes,
                src_pe: dst,
                dst_pe: rank,
                wrong_bytes: 0,
                first_wrong_offset: None,
            });
        }
        copy.push(CopyResult {
            bytes,
            iters: 10,
            gbps: 2200.0,
            gbps_best: 2210.0,
            wrong_bytes: 0,
        });
    }
    RankReport {
        rank,
        local_rank: rank,
        hostname: "gpu-host".into(),
        device: DeviceInfo {
            ordinal: rank,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            sm_count: 132,
            total_memory_bytes: 150_000_000_000,
        },
        nvshmem: NvshmemInfo {
            header_version: "3.4.5".into(),
            loaded_version: "3.4.5".into(),
            loaded_library: Some("/bundle/lib/nvshmem/libnvshmem_host.so.3".into()),
            loaded_sha256: Some("0123456789abcdef".repeat(4)),
            loaded_use_nccl: Some("OFF".into()),
            env: BTreeMap::from([("NVSHMEM_DISABLE_NVLS".into(), "1".into())]),
        },
        put_grid_blocks: 528,
        put,
        put_checks,
        get,
        get_checks,
        copy,
        dispatch: Some(DispatchResult {
            tokens: 1024,
            token_bytes: 14336,
            topk: 8,
            experts: 32 * world,
            items_sent: 1024,
            bytes_sent: 1024 * 14336,
            tokens_received: 1024,
            gbps: 900.0,
            wrong_tokens: 0,
            wrong_bytes: 0,
            poison_overwritten_bytes: 0,
            first_error: None,
        }),
        pingpong: vec![PingPongResult {
            initiator: 0,
            responder: if world == 1 { 0 } else { 1 },
            role: if rank == 0 {
                Role::Initiator
            } else {
                Role::Responder
            },
            rounds: 10_000,
            signal_ok: true,
            round_trip: (rank == 0)
                .then(|| LatencyStats::from_ns(&[900.0, 1000.0, 1100.0]).unwrap()),
        }],
    }
}

fn report(world: usize) -> Report {
    let mut r = Report::new(12345, world, options());
    r.ranks = (0..world).map(|i| rank(i, world)).collect();
    r
}

#[test]
fn json_round_trip_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("selftest.json");
    let r = report(2);
    r.write_json(&path).unwrap();
    let back = Report::read_json(&path).unwrap();
    assert_eq!(back, r);
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn json_carries_the_schema_and_the_fields_tools_read() {
    let v: serde_json::Value = serde_json::to_value(report(1)).unwrap();
    assert_eq!(v["schema"], SCHEMA);
    assert_eq!(v["seed"], 12345);
    assert_eq!(v["world_size"], 1);
    assert_eq!(v["ranks"][0]["put"][1]["bytes"], 256u64 << 20);
    assert_eq!(v["ranks"][0]["copy"][1]["gbps"], 2200.0);
    assert_eq!(v["ranks"][0]["pingpong"][0]["role"], "initiator");
    assert!(v["ranks"][0]["pingpong"][0]["round_trip"]["p99_us"].is_number());
    assert_eq!(
        v["options"]["tests"],
        serde_json::json!(["put-get", "dispatch", "pingpong"])
    );
}

#[test]
fn a_clean_report_passes() {
    assert_eq!(report(1).verdict(1, None), Verdict::Ok);
    assert_eq!(report(4).verdict(4, None).exit_code(), exit_code::OK);
}

#[test]
fn any_wrong_byte_fails_the_run() {
    let mut r = report(2);
    r.ranks[1].put_checks[0].wrong_bytes = 1;
    assert_eq!(r.verdict(2, None).exit_code(), exit_code::WRONG_DATA);

    let mut r = report(2);
    r.ranks[0].get_checks[1].wrong_bytes = 1;
    assert_eq!(r.verdict(2, None), Verdict::WrongData);

    let mut r = report(2);
    r.ranks[0].copy[0].wrong_bytes = 1;
    assert_eq!(r.verdict(2, None), Verdict::WrongData);

    let mut r = report(1);
    r.ranks[0]
        .dispatch
        .as_mut()
        .unwrap()
        .poison_overwritten_bytes = 1;
    assert_eq!(r.verdict(1, None), Verdict::WrongData);

    let mut r = report(2);
    r.ranks[1].pingpong[0].signal_ok = false;
    assert_eq!(r.verdict(2, None), Verdict::WrongData);
}

#[test]
fn wrong_data_outranks_errors_and_a_missing_rank_is_an_error() {
    let mut r = report(2);
    r.ranks.pop();
    assert_eq!(r.verdict(2, None), Verdict::Error);
    r.errors.push("rank 1 was killed".into());
    r.ranks[0].dispatch.as_mut().unwrap().wrong_bytes = 3;
    assert_eq!(r.verdict(2, None), Verdict::WrongData);
}

#[test]
fn the_put_copy_ratio_is_checked_only_when_required() {
    let r = report(1);
    let ratios = r.put_copy_ratios();
    assert_eq!(ratios.len(), 1);
    assert_eq!(ratios[0].bytes, 256 << 20);
    assert!((ratios[0].ratio - 2000.0 / 2200.0).abs() < 1e-12);
    assert_eq!(r.verdict(1, Some(0.85)), Verdict::Ok);
    assert_eq!(r.verdict(1, Some(0.95)).exit_code(), exit_code::TOO_SLOW);
}

#[test]
fn latency_percentiles_use_nearest_rank() {
    let samples: Vec<f64> = (1..=100).map(|i| i as f64 * 1000.0).collect();
    let s = LatencyStats::from_ns(&samples).unwrap();
    assert_eq!(
        (s.p50_us, s.p99_us, s.min_us, s.max_us),
        (50.0, 99.0, 1.0, 100.0)
    );
    assert!((s.mean_us - 50.5).abs() < 1e-9);
    assert!(LatencyStats::from_ns(&[]).is_none());
    assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
}

#[test]
fn the_table_shows_bandwidth_latency_and_correctness() {
    let t = render_table(&report(2));
    for needle in [
        "put and get to self, rank 0",
        "256MiB",
        "2000.0",
        "1800.0",
        "2200.0",
        "90.9%",
        "0->1",
        "1->0",
        "0<->1",
        "MoE dispatch",
        "every byte checked is right",
        "(sha256 0123456789ab, NVSHMEM_USE_NCCL=OFF)",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in:\n{t}");
    }
    let mut bad = report(2);
    bad.ranks[1].put_checks[1].wrong_bytes = 7;
    let t = render_table(&bad);
    assert!(t.contains("7 WRONG"), "{t}");
    assert!(t.contains("7 wrong bytes"), "{t}");

    // A wrong byte read by get shows on the pair it moved along (1 read from 0: 0->1).
    let mut bad = report(2);
    bad.ranks[1].get_checks[1].wrong_bytes = 5;
    let t = render_table(&bad);
    let line = t
        .lines()
        .find(|l| l.trim_start().starts_with("0->1"))
        .unwrap();
    assert!(line.contains("5 WRONG"), "{t}");
}
