//! The `commstack-selftest` binary as a user meets it.

use std::process::Command;

use commstack_kernels::driver::driver_present;

fn selftest() -> Command {
    Command::new(env!("CARGO_BIN_EXE_commstack-selftest"))
}

#[test]
fn help_explains_modes_tests_and_exit_codes() {
    let out = selftest().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "--gpus",
        "--pes-per-gpu",
        "--json",
        "RANK",
        "WORLD_SIZE",
        "NVSHMEM_DISABLE_NVLS",
        "dispatch",
        "pingpong",
        "Exit status",
        "poison",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}");
    }
}

/// What a GPU-less machine (CI) sees. On a machine with a driver this cannot be checked:
/// it fails rather than passing untested; skip it there with `--skip without_a_driver`.
#[test]
fn without_a_driver_it_says_so_and_exits_2() {
    assert!(
        !driver_present(),
        "a CUDA driver is loadable here: this test checks GPU-less machines (skip it with --skip without_a_driver)"
    );
    for env in [&[][..], &[("RANK", "0"), ("WORLD_SIZE", "1")][..]] {
        let out = selftest()
            .envs(env.iter().copied())
            .args(["--seed", "1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no CUDA driver"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn bad_launcher_environment_is_an_error_not_a_panic() {
    let out = selftest()
        .env("RANK", "3")
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("WORLD_SIZE"), "{stderr}");
}

/// Runs the real thing on this machine's first GPU: `cargo test -- --ignored` on a GPU
/// machine (gpu/run.sh runs the same binary through its selftest steps).
#[test]
#[ignore = "needs a GPU and its driver: run with --ignored on a GPU machine"]
fn one_gpu_selftest_passes() {
    assert!(
        driver_present(),
        "no CUDA driver (libcuda.so.1 not loadable): this test needs a GPU machine"
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = selftest()
        .args([
            "--gpus",
            "1",
            "--max-bytes",
            "4M",
            "--trials",
            "2",
            "--pingpong-rounds",
            "1000",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = commstack_kernels::report::Report::read_json(&json).unwrap();
    assert_eq!(report.ranks.len(), 1);
    assert_eq!(report.wrong_bytes(), 0);
}
