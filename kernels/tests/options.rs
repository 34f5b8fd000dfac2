//! Command line: parsing, what a launcher passes to its ranks, mode detection.

use clap::Parser as _;

use commstack_kernels::options::*;

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("commstack-selftest").chain(args.iter().copied())).unwrap()
}

#[test]
fn defaults_match_the_issue() {
    let cli = parse(&[]);
    assert_eq!(cli.gpus, 1);
    let o = cli.test.resolve(1, || 7).unwrap();
    assert_eq!(o.seed, 7);
    assert_eq!((o.min_bytes, o.max_bytes), (4 << 10, 256 << 20));
    let sizes = o.put_sizes();
    assert_eq!(sizes.first(), Some(&4096));
    assert_eq!(sizes.last(), Some(&(256 << 20)));
    assert_eq!(sizes.len(), 17);
    assert_eq!(
        o.tests,
        vec![TestKind::Put, TestKind::Dispatch, TestKind::Pingpong]
    );
}

#[test]
fn options_survive_the_trip_to_a_rank() {
    let cli = parse(&[
        "--seed",
        "99",
        "--tests",
        "pingpong,put",
        "--min-bytes",
        "64K",
        "--max-bytes",
        "3M",
        "--trials",
        "2",
        "--dispatch-tokens",
        "77",
        "--token-bytes",
        "4096",
        "--topk",
        "2",
        "--experts-per-gpu",
        "3",
        "--pingpong-rounds",
        "50",
        "--pingpong-warmup",
        "0",
        "--rdzv-timeout",
        "9",
    ]);
    let opts = cli.test.resolve(2, || unreachable!("seed given")).unwrap();
    let child = parse(
        &opts
            .to_args()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let again = child
        .test
        .resolve(2, || unreachable!("seed passed on"))
        .unwrap();
    assert_eq!(again, opts);
    assert_eq!(
        opts.put_sizes(),
        vec![
            64 << 10,
            128 << 10,
            256 << 10,
            512 << 10,
            1 << 20,
            2 << 20,
            3 << 20
        ]
    );
}

#[test]
fn bad_values_are_rejected_with_the_option_named() {
    assert!(Cli::try_parse_from(["x", "--gpus", "0"]).is_err());
    assert!(Cli::try_parse_from(["x", "--max-bytes", "12Q"]).is_err());
    assert!(Cli::try_parse_from(["x", "--tests", "put,bogus"]).is_err());
    let e = parse(&["--min-bytes", "1M", "--max-bytes", "4K"])
        .test
        .resolve(1, || 1)
        .unwrap_err();
    assert!(e.contains("--min-bytes"), "{e}");
    let e = parse(&["--token-bytes", "100"])
        .test
        .resolve(1, || 1)
        .unwrap_err();
    assert!(e.contains("multiple of 16"), "{e}");
    // topk 8 needs 8 experts: 1 GPU x 4 is too few, 2 x 4 is enough.
    let cli = parse(&["--experts-per-gpu", "4"]);
    assert!(cli.test.resolve(1, || 1).is_err());
    assert!(cli.test.resolve(2, || 1).is_ok());
    // Without the dispatch test its shape does not matter.
    assert!(
        parse(&["--experts-per-gpu", "4", "--tests", "put"])
            .test
            .resolve(1, || 1)
            .is_ok()
    );
}

#[test]
fn sizes_parse_with_binary_units() {
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4K"), Ok(4096));
    assert_eq!(parse_size("4KiB"), Ok(4096));
    assert_eq!(parse_size("256M"), Ok(256 << 20));
    assert_eq!(parse_size("1G"), Ok(1 << 30));
    assert!(parse_size("").is_err());
    assert!(parse_size("M").is_err());
    assert!(parse_size("4T").is_err());
}

#[test]
fn mode_comes_from_rank_and_world_size() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(detect_mode(4, env(&[])), Ok(Mode::Launch { gpus: 4 }));
    assert_eq!(
        detect_mode(1, env(&[("RANK", "2"), ("WORLD_SIZE", "4")])),
        Ok(Mode::Worker {
            rank: 2,
            world: 4,
            local_rank: 2,
            report_to: None
        })
    );
    assert_eq!(
        detect_mode(
            1,
            env(&[
                ("RANK", "5"),
                ("WORLD_SIZE", "8"),
                ("LOCAL_RANK", "1"),
                ("COMMSTACK_SELFTEST_REPORT", "/tmp/r5.json")
            ])
        ),
        Ok(Mode::Worker {
            rank: 5,
            world: 8,
            local_rank: 1,
            report_to: Some("/tmp/r5.json".into())
        })
    );
    assert!(
        detect_mode(1, env(&[("RANK", "0")]))
            .unwrap_err()
            .contains("WORLD_SIZE")
    );
    assert!(
        detect_mode(1, env(&[("WORLD_SIZE", "2")]))
            .unwrap_err()
            .contains("RANK")
    );
    assert!(detect_mode(1, env(&[("RANK", "2"), ("WORLD_SIZE", "2")])).is_err());
    assert!(detect_mode(1, env(&[("RANK", "x"), ("WORLD_SIZE", "2")])).is_err());
}

#[test]
fn nvshmem_defaults_turn_nvls_off_and_size_the_heap() {
    let o = parse(&["--seed", "1"]).test.resolve(1, || 1).unwrap();
    let launcher = nvshmem_env_defaults(&o, 1, false);
    assert!(launcher.contains(&("NVSHMEM_DISABLE_NVLS", "1".to_string())));
    let heap: u64 = launcher
        .iter()
        .find(|(k, _)| *k == "NVSHMEM_SYMMETRIC_SIZE")
        .unwrap()
        .1
        .parse()
        .unwrap();
    assert!(heap >= 2 * (256 << 20) + 4096, "{heap}");
    let local = nvshmem_env_defaults(&o, 1, true);
    assert!(local.contains(&("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo".to_string())));
    assert!(local.contains(&("NVSHMEM_REMOTE_TRANSPORT", "none".to_string())));
    assert!(
        !launcher
            .iter()
            .any(|(k, _)| *k == "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME")
    );
}

/// The put test also runs get: it is named `put-get` on the command line and in reports,
/// and `put` (older scripts and reports) still means it.
#[test]
fn the_put_test_is_named_put_get_and_put_still_reads() {
    for name in ["put-get", "put"] {
        let cli = parse(&["--tests", name]);
        assert_eq!(cli.test.tests, [TestKind::Put], "{name}");
    }
    let old: Vec<TestKind> = serde_json::from_str(r#"["put","dispatch"]"#).unwrap();
    assert_eq!(old[0], TestKind::Put);
    assert_eq!(
        serde_json::to_string(&old).unwrap(),
        r#"["put-get","dispatch"]"#
    );
}

#[test]
fn several_pes_per_gpu_need_the_mps_daemon_and_get_its_variables() {
    assert_eq!(parse(&[]).pes_per_gpu, 1);
    assert_eq!(parse(&["--gpus", "1", "--pes-per-gpu", "2"]).pes_per_gpu, 2);
    assert!(
        Cli::try_parse_from(["commstack-selftest", "--pes-per-gpu", "0"]).is_err(),
        "at least one PE per GPU"
    );
    assert!(mps_env_defaults(1).is_empty());
    assert_eq!(
        mps_env_defaults(2),
        [
            (
                "NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                "1".to_string()
            ),
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50".to_string()),
        ]
    );
    // The daemon is found by its control pipe, where CUDA_MPS_PIPE_DIRECTORY says.
    let dir = tempfile::tempdir().unwrap();
    let pipes = dir.path().display().to_string();
    let env = |k: &str| (k == "CUDA_MPS_PIPE_DIRECTORY").then(|| pipes.clone());
    assert_eq!(mps_control_pipe(env), dir.path().join("control"));
    assert_eq!(require_mps(1, env), Ok(()));
    let err = require_mps(2, env).unwrap_err();
    assert!(
        err.contains("nvidia-cuda-mps-control -d") && err.contains(&pipes),
        "{err}"
    );
    std::fs::write(dir.path().join("control"), "").unwrap();
    assert_eq!(require_mps(2, env), Ok(()));
    assert_eq!(
        mps_control_pipe(|_| None),
        std::path::Path::new("/tmp/nvidia-mps/control")
    );
}
