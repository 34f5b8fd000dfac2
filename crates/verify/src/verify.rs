//! `verify` itself: run the requested levels against one Python environment and gather
//! them into a report. Levels not requested, or that cannot run here, are in the report
//! as not run, with why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use crate::check::Check;
use crate::environment::{PythonEnv, environment_key};
use crate::expect::Expectations;
use crate::process::{Exit, run_captured};
pub use crate::report::LayerRead;
use crate::report::{
    EnvironmentReport, ImageEnvironment, Level, LevelReport, REPORT_SCHEMA, Report, write_atomic,
};
use crate::runner::{TestRun, TestSpec, run_test};
use crate::runtime::{check_runtime, run_probe};
use crate::static_level::{check_gathered as check_static_gathered, check_static};

pub struct VerifyOptions {
    pub python: PathBuf,
    pub levels: Vec<Level>,
    pub expect: Expectations,
    /// Tests given by the user, run through the runner and the exit-clean gate.
    pub tests: Vec<TestSpec>,
    /// A DeepEP source tree: its tests/test_intranode.py runs with 2, 4 and 8 ranks where
    /// that many GPUs exist.
    pub deepep_source: Option<PathBuf>,
    pub probe_timeout: Duration,
    /// Where each test's full log goes (the report directory).
    pub log_dir: Option<PathBuf>,
    /// The kernel crate's `commstack-selftest` binary, for the selftest level. It runs
    /// against the environment's NVSHMEM (`<nvshmem_prefix>/lib` first on the library path).
    pub selftest: Option<PathBuf>,
    /// PEs per GPU in the self-test; more than 1 runs it under a CUDA MPS daemon of its
    /// own (NVSHMEM's multiple-PEs-per-GPU mode).
    pub selftest_pes_per_gpu: u32,
}

impl VerifyOptions {
    pub fn new(python: &Path, levels: Vec<Level>, expect: Expectations) -> VerifyOptions {
        VerifyOptions {
            python: python.to_path_buf(),
            levels,
            expect,
            tests: Vec::new(),
            deepep_source: None,
            probe_timeout: Duration::from_secs(600),
            log_dir: None,
            selftest: None,
            selftest_pes_per_gpu: 1,
        }
    }
}

pub fn verify_python(opts: &VerifyOptions) -> Result<Report> {
    let env = PythonEnv::describe(&opts.python)?;
    let key = environment_key(&env)?;
    let wants = |l: Level| opts.levels.contains(&l);
    let skipped = |l: Level| LevelReport::not_run(l, "not requested");

    let static_level = if wants(Level::Static) {
        let f = check_static(&env.site_packages, &opts.expect);
        LevelReport::ran(
            Level::Static,
            f.checks.clone(),
            json!({"roots": f.roots, "libraries": f.libraries, "needs": f.needs, "device_code": f.device_code}),
        )
    } else {
        skipped(Level::Static)
    };

    let runtime_level = if wants(Level::Runtime) {
        match run_probe(
            &opts.python,
            &opts.expect.import_modules,
            &[],
            opts.probe_timeout,
        ) {
            Ok(probe) => {
                let f = check_runtime(&probe, &opts.expect);
                LevelReport::ran(
                    Level::Runtime,
                    f.checks.clone(),
                    serde_json::to_value(&f).unwrap_or_default(),
                )
            }
            Err(e) => LevelReport::failed(Level::Runtime, &e),
        }
    } else {
        skipped(Level::Runtime)
    };

    let selftest_level = if wants(Level::Selftest) {
        match &opts.selftest {
            None => LevelReport::not_run(
                Level::Selftest,
                "no self-test binary given: build it with `cargo xtask build kernels` and pass --selftest PATH",
            ),
            Some(bin) => crate::selftest::run(
                bin,
                &opts.expect,
                opts.log_dir.as_deref(),
                opts.selftest_pes_per_gpu,
            ),
        }
    } else {
        skipped(Level::Selftest)
    };

    let (tests_level, exit_level) = if wants(Level::Tests) || wants(Level::ExitClean) {
        run_tests_levels(opts, &key.id)
    } else {
        (skipped(Level::Tests), skipped(Level::ExitClean))
    };
    let tests_level = if wants(Level::Tests) {
        tests_level
    } else {
        skipped(Level::Tests)
    };
    let exit_level = if wants(Level::ExitClean) {
        exit_level
    } else {
        skipped(Level::ExitClean)
    };

    Ok(Report {
        schema: REPORT_SCHEMA,
        tool: format!("commstack-verify {}", env!("CARGO_PKG_VERSION")),
        generated_at: jiff::Timestamp::now().to_string(),
        environment: EnvironmentReport {
            kind: "python",
            python: env,
            key,
            image: None,
        },
        expectations: opts.expect.clone(),
        requested: opts.levels.clone(),
        levels: vec![
            static_level,
            runtime_level,
            selftest_level,
            tests_level,
            exit_level,
        ],
    })
}

/// The static level over an image's files ([`crate::layers::ImageFiles`]), as a report
/// like [`verify_python`]'s with only that level run. `python` is the image's interpreter
/// and `site_packages` its roots; `image` names the image and how its layers were read.
pub fn verify_image_static(
    files: &crate::layers::ImageFiles,
    python: PythonEnv,
    image: ImageEnvironment,
    expect: &Expectations,
) -> Report {
    let f = check_static_gathered(&files.gather(&python.site_packages), expect);
    let level = LevelReport::ran(
        Level::Static,
        f.checks.clone(),
        json!({"roots": f.roots, "libraries": f.libraries, "needs": f.needs, "device_code": f.device_code}),
    );
    let mut levels = vec![level];
    levels.extend(
        [
            Level::Runtime,
            Level::Selftest,
            Level::Tests,
            Level::ExitClean,
        ]
        .map(|l| LevelReport::not_run(l, "not requested")),
    );
    Report {
        schema: REPORT_SCHEMA,
        tool: format!("commstack-verify {}", env!("CARGO_PKG_VERSION")),
        generated_at: jiff::Timestamp::now().to_string(),
        environment: EnvironmentReport {
            kind: "image",
            key: crate::environment::EnvironmentKey {
                id: image
                    .id
                    .trim_start_matches("sha256:")
                    .chars()
                    .take(16)
                    .collect(),
                files: Vec::new(),
            },
            python,
            image: Some(image),
        },
        expectations: expect.clone(),
        requested: vec![Level::Static],
        levels,
    }
}

/// DeepEP's own tests from its source tree, for the ranks this machine can hold:
/// test_intranode.py needs 2, 4 or 8 GPUs; test_low_latency.py runs on every GPU there is
/// (one H200 is enough: without RDMA NVSHMEM skips IBGDA and goes over NVLink/P2P).
fn deepep_tests(src: &Path, gpus: &Result<u32, String>) -> (Vec<TestSpec>, Vec<Check>) {
    let mut runs: Vec<(String, &str, u32)> = [2u32, 4, 8]
        .iter()
        .map(|&r| {
            (
                format!("deepep-intranode-{r}"),
                "tests/test_intranode.py",
                r,
            )
        })
        .collect();
    let low_latency_ranks = gpus.as_ref().map_or(1, |&n| n.clamp(1, 8));
    runs.push((
        format!("deepep-low-latency-{low_latency_ranks}"),
        "tests/test_low_latency.py",
        low_latency_ranks,
    ));
    let (mut specs, mut not_run) = (Vec::new(), Vec::new());
    for (name, script, ranks) in runs {
        match gpus {
            Ok(n) if *n >= ranks => {
                let n = ranks.to_string();
                let mut spec = TestSpec::script(&name, &src.join(script), &["--num-processes", &n]);
                spec.cwd = Some(src.to_path_buf());
                specs.push(spec);
            }
            Ok(n) => not_run.push(Check::not_run(
                &format!("tests.{name}"),
                format!("needs {ranks} GPUs; this machine has {n}"),
            )),
            Err(why) => not_run.push(Check::not_run(
                &format!("tests.{name}"),
                format!("cannot count GPUs: {why}"),
            )),
        }
    }
    (specs, not_run)
}

fn run_tests_levels(opts: &VerifyOptions, env_id: &str) -> (LevelReport, LevelReport) {
    let mut specs = opts.tests.clone();
    let mut not_run: Vec<Check> = Vec::new();
    if let Some(src) = &opts.deepep_source {
        let (deepep, skipped) = deepep_tests(src, &gpu_count(&opts.python));
        specs.extend(deepep);
        not_run.extend(skipped);
    }
    if specs.is_empty() && not_run.is_empty() {
        let why = "no tests given: pass --test FILE[:FUNCTION] or --deepep-source DIR";
        return (
            LevelReport::not_run(Level::Tests, why),
            LevelReport::not_run(Level::ExitClean, why),
        );
    }
    let mut test_checks = not_run.clone();
    let mut gate_checks: Vec<Check> = not_run
        .iter()
        .map(|c| {
            Check::not_run(
                &c.name.replacen("tests.", "exit-clean.", 1),
                "the test did not run",
            )
        })
        .collect();
    let mut runs = Vec::new();
    for spec in &specs {
        match run_test(&opts.python, spec) {
            Ok(run) => {
                write_log(opts, env_id, &run);
                let [t, g] = run.checks();
                test_checks.push(t);
                gate_checks.push(g);
                runs.push(json!({
                    "name": run.name,
                    "outcome": run.outcome,
                    "gate": run.gate,
                    "wall_ms": run.captured.wall_ms,
                    "bandwidth_lines": bandwidth_lines(&run),
                    "bandwidth": run.captured.lines.iter().filter_map(|l| parse_deepep_bandwidth(&l.text)).collect::<Vec<_>>(),
                }));
            }
            Err(e) => {
                let detail = e
                    .chain()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(": ");
                test_checks.push(Check::fail(
                    &format!("tests.{}", spec.name),
                    detail,
                    "check the interpreter and the test path",
                ));
                gate_checks.push(Check::not_run(
                    &format!("exit-clean.{}", spec.name),
                    "the test did not start",
                ));
            }
        }
    }
    let details = json!({ "runs": runs });
    (
        LevelReport::ran(Level::Tests, test_checks, details.clone()),
        LevelReport::ran(Level::ExitClean, gate_checks, details),
    )
}

/// DeepEP's tests print their bandwidth as `... GB/s ...`: kept for the report.
fn bandwidth_lines(run: &TestRun) -> Vec<String> {
    run.captured
        .lines
        .iter()
        .filter(|l| l.text.contains("GB/s"))
        .map(|l| l.text.clone())
        .collect()
}

/// One DeepEP tuning result: `[tuning] Best dispatch (BF16): SMs 24, NVL chunk 8, 153.23
/// GB/s (NVL), t: 312.45 us` (tests/test_intranode.py at 567632d; the internode test adds
/// an RDMA figure the same way).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeepEpBandwidth {
    /// "dispatch (BF16)", "dispatch (FP8)", "combine".
    pub op: String,
    /// (link, GB/s): ("NVL", 153.23), ("RDMA", 45.1).
    pub gbps: Vec<(String, f64)>,
    pub micros: Option<f64>,
}

pub fn parse_deepep_bandwidth(line: &str) -> Option<DeepEpBandwidth> {
    use std::sync::OnceLock;
    static HEAD: OnceLock<regex::Regex> = OnceLock::new();
    static RATE: OnceLock<regex::Regex> = OnceLock::new();
    static TIME: OnceLock<regex::Regex> = OnceLock::new();
    let head = HEAD.get_or_init(|| {
        regex::Regex::new(r"\[tuning\] Best (dispatch(?: \([A-Z0-9]+\))?|combine)").unwrap()
    });
    let rate = RATE.get_or_init(|| regex::Regex::new(r"([0-9.]+) GB/s \(([A-Za-z]+)\)").unwrap());
    let time = TIME.get_or_init(|| regex::Regex::new(r"t: ([0-9.]+) us").unwrap());
    let op = head.captures(line)?.get(1)?.as_str().to_string();
    let gbps: Vec<(String, f64)> = rate
        .captures_iter(line)
        .filter_map(|c| Some((c[2].to_string(), c[1].parse().ok()?)))
        .collect();
    if gbps.is_empty() {
        return None;
    }
    let micros = time.captures(line).and_then(|c| c[1].parse().ok());
    Some(DeepEpBandwidth { op, gbps, micros })
}

fn write_log(opts: &VerifyOptions, env_id: &str, run: &TestRun) {
    if let Some(dir) = &opts.log_dir {
        let path = dir.join(format!("verify-{env_id}-{}.log", run.name));
        if std::fs::create_dir_all(dir).is_ok() {
            let _ = write_atomic(&path, run.captured.transcript().as_bytes());
        }
    }
}

/// GPUs torch sees in the target environment.
fn gpu_count(python: &Path) -> Result<u32, String> {
    let mut cmd = Command::new(python);
    cmd.args(["-c", "import torch; print(torch.cuda.device_count())"]);
    let out = run_captured(cmd, Duration::from_secs(300)).map_err(|e| e.to_string())?;
    let last = out
        .lines
        .iter()
        .rev()
        .find(|l| !l.text.trim().is_empty())
        .map(|l| l.text.trim().to_string());
    match (out.exit, last.as_deref().and_then(|l| l.parse().ok())) {
        (Exit::Code { code: 0 }, Some(n)) => Ok(n),
        (exit, _) => Err(format!(
            "`import torch; torch.cuda.device_count()` ended with {exit}: {}",
            last.unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod bandwidth_tests {
    use super::*;

    #[test]
    fn parses_deepep_tuning_lines() {
        // Format strings of DeepEP 567632d tests/test_intranode.py lines 218 and 260.
        let d = parse_deepep_bandwidth(
            "[tuning] Best dispatch (BF16): SMs 24, NVL chunk 8, 153.23 GB/s (NVL), t: 312.45 us",
        )
        .unwrap();
        assert_eq!(d.op, "dispatch (BF16)");
        assert_eq!(d.gbps, vec![("NVL".to_string(), 153.23)]);
        assert_eq!(d.micros, Some(312.45));
        let c = parse_deepep_bandwidth(
            "[tuning] Best combine: SMs 24, NVL chunk 4: 158.01 GB/s (NVL), t: 301.00 us",
        )
        .unwrap();
        assert_eq!(c.op, "combine");
        let i = parse_deepep_bandwidth("[tuning] Best dispatch (FP8): SMs 24, NVL chunk 8, RDMA chunk 16: 45.10 GB/s (RDMA), 147.30 GB/s (NVL), t: 1.00 us").unwrap();
        assert_eq!(i.gbps.len(), 2);
        assert!(parse_deepep_bandwidth("[config] num_tokens=4096").is_none());
        assert!(parse_deepep_bandwidth("something 3 GB/s (NVL)").is_none());
    }
}

#[cfg(test)]
mod deepep_tests_tests {
    use super::*;
    use crate::runner::TestTarget;

    fn names(specs: &[TestSpec]) -> Vec<&str> {
        specs.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn one_gpu_runs_low_latency_with_one_rank_and_says_why_intranode_cannot() {
        let (specs, not_run) = deepep_tests(Path::new("/src"), &Ok(1));
        assert_eq!(names(&specs), ["deepep-low-latency-1"]);
        let TestTarget::Script { file, args } = &specs[0].target else {
            panic!("{:?}", specs[0].target)
        };
        assert_eq!(file, Path::new("/src/tests/test_low_latency.py"));
        assert_eq!(args, &["--num-processes", "1"]);
        assert_eq!(specs[0].cwd.as_deref(), Some(Path::new("/src")));
        assert_eq!(not_run.len(), 3);
        assert!(
            not_run[0]
                .detail
                .contains("needs 2 GPUs; this machine has 1")
        );
    }

    #[test]
    fn eight_gpus_run_everything_and_no_gpu_count_runs_nothing() {
        let (specs, not_run) = deepep_tests(Path::new("/src"), &Ok(8));
        assert_eq!(
            names(&specs),
            [
                "deepep-intranode-2",
                "deepep-intranode-4",
                "deepep-intranode-8",
                "deepep-low-latency-8"
            ]
        );
        assert!(not_run.is_empty());
        let (specs, not_run) = deepep_tests(Path::new("/src"), &Err("no torch".into()));
        assert!(specs.is_empty());
        assert_eq!(not_run.len(), 4);
    }
}
