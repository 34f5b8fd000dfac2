//! The preflight: this node against what one image needs, before a job runs on it.
//!
//! The image carries its expectations (`/opt/commstack/preflight.json`, written from the
//! lock and the build settings when the image is made): the CUDA version its libraries
//! need from the driver, the SMs its kernels are compiled for, NVSHMEM's fabric
//! transports built, DeepEP's API. `commstack-doctor preflight` reads the node's /proc and
//! /sys (below `--root`) and nvidia-smi, runs the doctor's checks that matter for them,
//! with "warn" made "fail" where the job cannot run without the thing, and gives one
//! verdict: pass or fail.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use commstack_stack::CudaArch;
use commstack_stack::deploy::Network;
use commstack_stack::manifest::DeepEpApi;
use serde::{Deserialize, Serialize};

use crate::checks::{Host, arch, driver, ibgda, kernel, memory, rdma};
use crate::host::HostFs;
use crate::nvidia_smi::{NvidiaSmiOutput, NvidiaSmiSource};
use crate::report::{Check, Status};
use crate::version::CudaVersion;

/// The version of preflight.json's shape.
pub const EXPECTATIONS_SCHEMA: u32 = 1;
/// The version of the verdict's JSON shape.
pub const VERDICT_SCHEMA: u32 = 1;
/// Where the image carries its expectations.
pub const IMAGE_EXPECTATIONS: &str = "/opt/commstack/preflight.json";
/// NVSHMEM's transports that need an RDMA fabric (stack.toml's `[nvshmem]` keys).
pub const FABRIC_TRANSPORTS: &[&str] = &["ibgda", "ibrc", "ibdevx", "ucx", "libfabric"];

/// What an image needs of a node: preflight.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    pub schema_version: u32,
    /// The CUDA `major.minor` of the image's libraries: the driver must run it.
    pub cuda: String,
    /// The architectures the image's kernels (NVSHMEM, DeepEP, the self-test) carry.
    pub cuda_archs: Vec<CudaArch>,
    /// NVSHMEM's fabric transports in the image's build ([`FABRIC_TRANSPORTS`] that are on).
    pub transports: Vec<String>,
    /// DeepEP's API: V2's ranks on a node share memory by `pidfd_getfd` (Linux >= 5.6).
    pub deepep_api: DeepEpApi,
}

impl Expectations {
    /// From the lock's CUDA version (`13.0.2`: its `major.minor` is kept), the archs
    /// built, the NVSHMEM switches that are on (any keys: the fabric ones are kept) and
    /// DeepEP's API.
    pub fn new(
        cuda: &str,
        cuda_archs: &[CudaArch],
        switches_on: &[&str],
        deepep_api: DeepEpApi,
    ) -> Result<Expectations> {
        let major_minor: Vec<&str> = cuda.split('.').take(2).collect();
        let cuda: CudaVersion = major_minor.join(".").parse()?;
        Ok(Expectations {
            schema_version: EXPECTATIONS_SCHEMA,
            cuda: cuda.to_string(),
            cuda_archs: cuda_archs.to_vec(),
            transports: FABRIC_TRANSPORTS
                .iter()
                .filter(|t| switches_on.contains(t))
                .map(|t| t.to_string())
                .collect(),
            deepep_api,
        })
    }

    /// preflight.json's bytes (pretty JSON, one trailing newline: the image's file).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plain data") + "\n"
    }

    /// Reads preflight.json; the error names the file and what is wrong.
    pub fn read(path: &std::path::Path) -> Result<Expectations> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the expectations {}", path.display()))?;
        let e: Expectations = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a commstack preflight.json (schema {EXPECTATIONS_SCHEMA}): the image's own is at {IMAGE_EXPECTATIONS}",
                path.display()
            )
        })?;
        if e.schema_version != EXPECTATIONS_SCHEMA {
            bail!(
                "{}: schema_version {}, this doctor reads {EXPECTATIONS_SCHEMA}: use the image's own doctor (/opt/commstack/bin/commstack-doctor)",
                path.display(),
                e.schema_version
            );
        }
        e.cuda
            .parse::<CudaVersion>()
            .with_context(|| format!("{}: `cuda` is not major.minor", path.display()))?;
        Ok(e)
    }

    /// The fabric a node is assumed to have when none is given: InfiniBand when the image
    /// has a fabric transport, none otherwise.
    pub fn default_network(&self) -> Network {
        match self.transports.is_empty() {
            true => Network::None,
            false => Network::Infiniband,
        }
    }
}

/// What the preflight examines.
#[derive(Debug, Clone)]
pub struct PreflightInput {
    /// /proc, /sys and /dev are read below this directory (`/` for the node itself).
    pub root: PathBuf,
    pub nvidia_smi: NvidiaSmiSource,
    /// The environment's PATH (where nvidia-smi is found).
    pub path: Option<String>,
    /// The node's fabric: `None` skips the RDMA checks (one node).
    pub network: Network,
}

/// The machine-readable verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightVerdict {
    pub schema_version: u32,
    /// `pass` or `fail`: fail when any check failed.
    pub verdict: Status,
    pub root: String,
    pub network: String,
    pub expectations: Expectations,
    /// The ids of the failed checks.
    pub failed: Vec<String>,
    pub checks: Vec<Check>,
}

impl PreflightVerdict {
    pub fn passed(&self) -> bool {
        self.verdict == Status::Pass
    }

    pub fn check(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }
}

/// A check the job cannot do without: its warning is a failure here.
fn required(mut check: Check, why: &str) -> Check {
    if check.status == Status::Warn {
        check.status = Status::Fail;
        check.details.push(format!("required: {why}"));
    }
    check
}

fn not_needed(id: &str, title: &str, why: String) -> Check {
    Check::new(id, title, Status::Skip, why)
}

/// Runs the preflight. Never fails: what cannot be read is a failed check.
pub fn run_preflight(input: &PreflightInput, expect: &Expectations) -> PreflightVerdict {
    let fs = HostFs::new(&input.root);
    let smi = NvidiaSmiOutput::collect(&input.nvidia_smi, input.path.as_deref());
    let cuda: CudaVersion = expect.cuda.parse().unwrap_or(CudaVersion::DEFAULT_STACK);
    let host = Host {
        fs: &fs,
        smi: &smi,
        env: &[],
        required_cuda: cuda,
    };
    let fabric = input.network != Network::None;
    let mut checks = vec![
        driver::check(&host),
        arch::check(&smi, &expect.cuda_archs),
        kernel::check(
            &fs,
            (expect.deepep_api == DeepEpApi::V2).then_some((
                (5, 6),
                "DeepEP V2 needs (pidfd_getfd between the ranks of a node)",
            )),
        ),
    ];
    let ibgda_built = expect.transports.iter().any(|t| t == "ibgda");
    if fabric {
        let devices = rdma::devices(&fs);
        let why = format!(
            "the node's fabric is {} and the image's NVSHMEM has {}",
            input.network.as_str(),
            if expect.transports.is_empty() {
                "no fabric transport".to_string()
            } else {
                expect.transports.join(", ")
            }
        );
        checks.push(required(rdma::check(&fs, &devices), &why));
        checks.push(rdma::gids(&fs, &devices, input.network == Network::Roce));
        checks.push(rdma::registration(&fs));
        if ibgda_built {
            // With gdrdrv, NVSHMEM's CPU-assisted IBGDA runs without the driver's
            // parameters (slower): then they stay warnings.
            let settings = ibgda::settings(&fs);
            let cpu_assisted = rdma::module_loaded(&fs, "gdrdrv");
            let why = "GPU-initiated IBGDA (DeepEP's internode and low-latency kernels across nodes), and no gdrdrv for CPU-assisted IBGDA";
            for check in [
                ibgda::stream_memops(&settings),
                ibgda::peer_mapping(&settings),
            ] {
                checks.push(match cpu_assisted {
                    true => check,
                    false => required(check, why),
                });
            }
        }
        checks.push(memory::memlock(&fs, true));
    } else {
        let why = || "--network none: one node, no RDMA".to_string();
        checks.push(not_needed("rdma-devices", "RDMA devices", why()));
        checks.push(memory::memlock(&fs, false));
    }
    checks.push(memory::dev_shm(&fs));
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.id.clone())
        .collect();
    PreflightVerdict {
        schema_version: VERDICT_SCHEMA,
        verdict: if failed.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        },
        root: input.root.display().to_string(),
        network: input.network.as_str().to_string(),
        expectations: expect.clone(),
        failed,
        checks,
    }
}

/// The verdict for a terminal (the doctor's report format, its verdict last).
pub fn render_verdict(v: &PreflightVerdict) -> String {
    let report = crate::report::DoctorReport {
        schema_version: crate::report::REPORT_SCHEMA_VERSION,
        root: v.root.clone(),
        nvidia_smi: String::new(),
        required_cuda: v.expectations.cuda.clone(),
        checks: v.checks.clone(),
    };
    let body = crate::report::render_human(&report);
    let archs: Vec<String> = v
        .expectations
        .cuda_archs
        .iter()
        .map(CudaArch::cmake)
        .collect();
    let mut out = format!(
        "commstack preflight — root {}, network {}; the image: CUDA {}, archs {}, transports {}, DeepEP {}\n",
        v.root,
        v.network,
        v.expectations.cuda,
        archs.join(","),
        if v.expectations.transports.is_empty() {
            "none".to_string()
        } else {
            v.expectations.transports.join(",")
        },
        v.expectations.deepep_api.as_str()
    );
    out.push_str(body.split_once('\n').map_or("", |(_, rest)| rest));
    out.push_str(&match v.failed.is_empty() {
        true => "PREFLIGHT PASS\n".to_string(),
        false => format!("PREFLIGHT FAIL: {}\n", v.failed.join(", ")),
    });
    out
}
