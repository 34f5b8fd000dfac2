//! `commstack-selftest`: NVSHMEM put bandwidth, MoE-style dispatch and signal
//! ping-pong on this machine's GPUs, checked byte by byte. See `--help`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow};
use clap::Parser as _;

use commstack_kernels::options::{Cli, Mode, detect_mode, nvshmem_env_defaults, require_mps};
use commstack_kernels::report::{Report, exit_code, render_table};
use commstack_kernels::selftest::{RankSpec, run_rank};
use commstack_kernels::{driver, report, rng, spawn};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("commstack-selftest: error: {e:#}");
            ExitCode::from(exit_code::ERROR as u8)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    let mode = detect_mode(cli.gpus, |k| std::env::var(k).ok()).map_err(|e| anyhow!(e))?;
    match mode {
        Mode::Launch { gpus } => launch(&cli, gpus),
        Mode::Worker {
            rank,
            world,
            local_rank,
            report_to,
        } => worker(&cli, rank, world, local_rank, report_to),
    }
}

fn launch(cli: &Cli, gpus: usize) -> anyhow::Result<i32> {
    let pes = cli.pes_per_gpu as usize;
    let world = gpus * pes;
    let opts = cli
        .test
        .resolve(world, rng::fresh_seed)
        .map_err(|e| anyhow!(e))?;
    // Before anything is started: a machine without a driver (or without the MPS daemon
    // that several PEs on one GPU need) gets one clear message.
    driver::require_driver()?;
    require_mps(cli.pes_per_gpu, |k| std::env::var(k).ok()).map_err(|e| anyhow!(e))?;
    eprintln!(
        "commstack-selftest: {gpus} GPU(s), {pes} PE(s) each, seed {} ({})",
        opts.seed,
        commstack_kernels::BUILD_INFO
    );
    let exe = std::env::current_exe().context("locating this executable")?;
    let report = spawn::run_local(&exe, &opts, gpus, pes, Duration::from_secs(cli.timeout))?;
    finish(cli, &report, world, cli.json.clone())
}

fn worker(
    cli: &Cli,
    rank: usize,
    world: usize,
    local_rank: usize,
    report_to: Option<std::path::PathBuf>,
) -> anyhow::Result<i32> {
    // Under a launcher each rank resolves its own seed; the rendezvous makes them one
    // (rank 0's), or refuses the run when ranks were given different ones.
    let mut opts = cli
        .test
        .resolve(world, rng::fresh_seed)
        .map_err(|e| anyhow!(e))?;
    if report_to.is_none() {
        // Started by an outside launcher: give NVSHMEM what `--gpus` would have.
        for (k, v) in nvshmem_env_defaults(&opts, world, false) {
            if std::env::var_os(k).is_none() {
                // SAFETY: no other thread exists yet (nothing has been started).
                unsafe { std::env::set_var(k, v) };
            }
        }
    }
    let spec = RankSpec {
        rank,
        world,
        local_rank,
        rdzv: cli.rdzv.clone(),
        seed_given: cli.test.seed.is_some(),
    };
    let rank_report = run_rank(&mut opts, &spec)?;
    let mut report = Report::new(opts.seed, world, opts);
    report.ranks.push(rank_report);
    match report_to {
        // Our own launcher merges the ranks; it reads the exit status as well.
        Some(path) => {
            report::write_json_atomic(&path, &report.ranks[0])?;
            Ok(report.verdict(1, None).exit_code())
        }
        None => {
            let json = cli
                .json
                .as_deref()
                .map(|j| spawn::rank_json_path(j, rank, world));
            finish(cli, &report, 1, json)
        }
    }
}

fn finish(
    cli: &Cli,
    report: &Report,
    expected_ranks: usize,
    json: Option<std::path::PathBuf>,
) -> anyhow::Result<i32> {
    print!("{}", render_table(report));
    if let Some(path) = json {
        report.write_json(&path)?;
        eprintln!("commstack-selftest: report written to {}", path.display());
    }
    Ok(report
        .verdict(expected_ranks, cli.require_put_copy_ratio)
        .exit_code())
}
