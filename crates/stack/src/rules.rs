//! Compatibility rules between the parts of a stack. Each rule has an id (for
//! `--allow RULE` / `resolve.allow`), a revision (part of the lock's rules fingerprint, so
//! changing a rule invalidates locks made under the old one), the reason it exists, and a
//! check that names both sides of a conflict and the ways out.

use std::str::FromStr;

use pep440_rs::Version;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::diag::Diagnostic;
use crate::manifest::{DeepEpApi, Stack};
use crate::pin::Pin;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RuleId {
    PythonMatchesBase,
    GlibcWithinBase,
    TorchCudaMajor,
    NvshmemCudaFamily,
    NvshmemMatchesTorch,
    DeepEpV2Nccl,
    DeepEpV2Torch,
    DeepEpV1RdcFix,
    DeepEpV1Cccl,
    DeepEpNeedsIbgda,
}

/// NCCL version DeepEP V2's NCCL device API needs (ncclGetLsaDevicePointer and friends).
pub const DEEPEP_V2_MIN_NCCL: &str = "2.30.4";
pub const DEEPEP_V2_MIN_TORCH: &str = "2.10";
/// First NVSHMEM whose device library defines nvshmemi_ibgda_device_state_d itself.
pub const NVSHMEM_RDC_SENSITIVE: &str = "3.3.20";

impl RuleId {
    pub const ALL: [RuleId; 10] = [
        RuleId::PythonMatchesBase,
        RuleId::GlibcWithinBase,
        RuleId::TorchCudaMajor,
        RuleId::NvshmemCudaFamily,
        RuleId::NvshmemMatchesTorch,
        RuleId::DeepEpV2Nccl,
        RuleId::DeepEpV2Torch,
        RuleId::DeepEpV1RdcFix,
        RuleId::DeepEpV1Cccl,
        RuleId::DeepEpNeedsIbgda,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RuleId::PythonMatchesBase => "python-matches-base",
            RuleId::GlibcWithinBase => "glibc-within-base",
            RuleId::TorchCudaMajor => "torch-cuda-major",
            RuleId::NvshmemCudaFamily => "nvshmem-cuda-family",
            RuleId::NvshmemMatchesTorch => "nvshmem-version-matches-torch",
            RuleId::DeepEpV2Nccl => "deepep-v2-nccl",
            RuleId::DeepEpV2Torch => "deepep-v2-torch",
            RuleId::DeepEpV1RdcFix => "deepep-v1-rdc-fix",
            RuleId::DeepEpV1Cccl => "deepep-v1-cccl",
            RuleId::DeepEpNeedsIbgda => "deepep-needs-ibgda",
        }
    }

    /// Bumped whenever a rule's meaning changes.
    pub fn revision(self) -> u32 {
        self.rule().revision
    }

    pub fn reason(self) -> &'static str {
        self.rule().reason
    }

    /// This rule's entry in [`RULES`].
    pub fn rule(self) -> &'static Rule {
        RULES
            .iter()
            .find(|r| r.id == self)
            .expect("every RuleId has an entry in RULES")
    }
}

impl FromStr for RuleId {
    type Err = ();
    fn from_str(s: &str) -> Result<RuleId, ()> {
        RuleId::ALL.into_iter().find(|r| r.as_str() == s).ok_or(())
    }
}

/// The fingerprint of the rule set and the known-source table, stored in the lock: a lock
/// made under other rules or other known hashes is stale.
pub fn fingerprint() -> String {
    let rules: Vec<serde_json::Value> = RULES
        .iter()
        .map(|r| serde_json::json!({"id": r.id.as_str(), "revision": r.revision}))
        .collect();
    let params = serde_json::json!({
        "rules": rules,
        "deepep-v2-min-nccl": DEEPEP_V2_MIN_NCCL,
        "deepep-v2-min-torch": DEEPEP_V2_MIN_TORCH,
        "nvshmem-rdc-sensitive": NVSHMEM_RDC_SENSITIVE,
        // The known-source table decides the sources' URLs and hashes: a new table makes
        // old locks stale just as a changed rule does.
        "known-sources": hex::encode(Sha256::digest(crate::known::TABLE_TEXT)),
    });
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(commstack_digest::canonical_json(&params)))
    )
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The rule holds.
    Ok,
    /// The rule does not concern this stack.
    NotApplicable,
    /// The rule holds and requires something of a later step (recorded for it).
    Applies,
    /// The rule is violated and the user allowed it.
    Allowed,
    /// The rule could not be decided yet (e.g. the source is not fetched); decided later.
    Deferred,
    /// The rule is violated.
    Violated,
}

#[derive(Clone, Debug)]
pub struct Outcome {
    pub rule: RuleId,
    pub status: Status,
    /// One line: what was compared and what was found.
    pub detail: String,
    /// For violations: the full error, pointing into stack.toml, with the ways out.
    pub diagnostic: Option<Diagnostic>,
}

/// What resolution found out, the input of the rules that need more than the manifest.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// CUDA version torch's wheels are built for (from its `cuda-toolkit==X` pin or the
    /// `-cuXX` suffix of its NVIDIA dependencies).
    pub torch_cuda: Option<Version>,
    /// `nvidia-nccl-cuXX` pin of torch.
    pub torch_nccl: Option<Pin>,
    /// `nvidia-nvshmem-cuXX` pin of torch.
    pub torch_nvshmem: Option<Pin>,
    /// The NVSHMEM version the stack builds.
    pub nvshmem_build: Option<Version>,
    /// Whether the DeepEP sources force RDC (see [`deepep_v1_has_rdc_fix`]); None when the
    /// source contents are not available.
    pub deepep_rdc_fix: Option<bool>,
}

/// One compatibility rule, all of it in one place: adding a rule is a [`RuleId`] and one
/// entry in [`RULES`].
pub struct Rule {
    pub id: RuleId,
    /// Bumped whenever the rule's meaning changes (part of [`fingerprint`]).
    pub revision: u32,
    /// Why the rule exists; every violation's hint ends with it.
    pub reason: &'static str,
    /// Needs only the manifest: also run at parse time, by [`check_manifest`].
    pub manifest_only: bool,
    pub check: fn(&Stack, &Facts) -> Outcome,
}

/// Every rule, in [`RuleId::ALL`]'s order: the order of the outcomes (and of the lock's
/// `[[rule]]` entries) and of the fingerprint.
pub const RULES: &[Rule] = &[
    Rule {
        id: RuleId::PythonMatchesBase,
        revision: 1,
        reason: "wheels are built for one CPython; a second interpreter in the image would carry a second copy of every library",
        manifest_only: true,
        check: python_matches_base,
    },
    Rule {
        id: RuleId::GlibcWithinBase,
        revision: 1,
        reason: "a wheel needing a newer glibc than the base image has fails to load there",
        manifest_only: true,
        check: glibc_within_base,
    },
    Rule {
        id: RuleId::TorchCudaMajor,
        revision: 1,
        reason: "torch's wheels are built for one CUDA major; NVSHMEM, nvcc and DeepEP must use the same",
        manifest_only: false,
        check: torch_cuda_major,
    },
    Rule {
        id: RuleId::NvshmemCudaFamily,
        revision: 1,
        reason: "NVSHMEM wheels come in cuXX families; the drop-in must replace the family torch pins",
        manifest_only: false,
        check: nvshmem_cuda_family,
    },
    Rule {
        id: RuleId::NvshmemMatchesTorch,
        revision: 1,
        reason: "torch loads libnvshmem_host by SONAME and its Triton kernels use libnvshmem_device.bc: another version than the one torch was built against is untested by PyTorch and fails `pip check`",
        manifest_only: false,
        check: nvshmem_matches_torch,
    },
    Rule {
        id: RuleId::DeepEpV2Nccl,
        revision: 1,
        reason: "DeepEP V2 uses NCCL's device API (ncclGetLsaDevicePointer), added in NCCL 2.30.4; installing a newer NCCL beside torch's pin loads two libnccl or downgrades silently (DeepEP issue 710)",
        manifest_only: false,
        check: deepep_v2_nccl,
    },
    Rule {
        id: RuleId::DeepEpV2Torch,
        revision: 1,
        reason: "DeepEP V2 needs torch >= 2.10",
        manifest_only: false,
        check: deepep_v2_torch,
    },
    Rule {
        id: RuleId::DeepEpV1RdcFix,
        revision: 1,
        reason: "NVSHMEM >= 3.3.20 defines nvshmemi_ibgda_device_state_d in its device library; DeepEP V1 sources that do not force RDC (fixed in DeepEP 29d31c0) fail to link with `multiple definition of nvshmemi_ibgda_device_state_d`",
        manifest_only: false,
        check: deepep_v1_rdc_fix,
    },
    Rule {
        id: RuleId::DeepEpV1Cccl,
        revision: 1,
        reason: "CUDA 13 moved libcu++ under include/cccl: DeepEP V1 needs that directory on its include path (`cuda/std/tuple` not found otherwise)",
        manifest_only: false,
        check: deepep_v1_cccl,
    },
    Rule {
        id: RuleId::DeepEpNeedsIbgda,
        revision: 1,
        reason: "DeepEP's V1 kernels (and V2's legacy ones) use NVSHMEM's IBGDA device state: an NVSHMEM built without IBGDA leaves `nvshmemi_ibgda_device_state_d` undefined and DeepEP's device link fails, after NVSHMEM's whole build",
        manifest_only: true,
        check: deepep_needs_ibgda,
    },
];

/// The static rules (manifest only). Run at parse time by `lock` and `lock --check`.
pub fn check_manifest(stack: &Stack) -> Vec<Outcome> {
    RULES
        .iter()
        .filter(|r| r.manifest_only)
        .map(|r| (r.check)(stack, &Facts::default()))
        .collect()
}

/// Every rule, given what resolution found.
pub fn check_resolved(stack: &Stack, facts: &Facts) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = RULES.iter().map(|r| (r.check)(stack, facts)).collect();
    // Apply resolve.allow: a violation the user allowed is recorded as such, not hidden.
    for o in &mut out {
        if o.status == Status::Violated && stack.is_allowed(o.rule) {
            o.status = Status::Allowed;
            o.detail = format!("allowed by resolve.allow: {}", o.detail);
        }
    }
    out
}

fn python_matches_base(stack: &Stack, _: &Facts) -> Outcome {
    let t = &stack.target;
    let base_py = (t.base.python.0, t.base.python.1);
    if base_py == t.python {
        return ok(
            RuleId::PythonMatchesBase,
            format!(
                "python {}.{} is {}'s python",
                t.python.0, t.python.1, t.base.name
            ),
        );
    }
    violation(
        stack,
        RuleId::PythonMatchesBase,
        "target.python",
        format!(
            "target.python is {}.{} but the base image {} has Python {}.{}",
            t.python.0, t.python.1, t.base.name, base_py.0, base_py.1
        ),
        Some(("target.base", format!("{} is chosen here", t.base.name))),
        format!(
            "set target.python = \"{}.{}\", or pick a base whose Python is {}.{} ({}), or allow rule {}",
            base_py.0,
            base_py.1,
            t.python.0,
            t.python.1,
            crate::bases::BASES
                .iter()
                .filter(|b| (b.python.0, b.python.1) == t.python)
                .map(|b| b.name)
                .collect::<Vec<_>>()
                .join(", "),
            RuleId::PythonMatchesBase.as_str()
        ),
    )
}

fn glibc_within_base(stack: &Stack, _: &Facts) -> Outcome {
    let t = &stack.target;
    if t.glibc <= t.base.glibc {
        return ok(
            RuleId::GlibcWithinBase,
            format!(
                "glibc {}.{} <= {}'s {}.{}",
                t.glibc.0, t.glibc.1, t.base.name, t.base.glibc.0, t.base.glibc.1
            ),
        );
    }
    violation(
        stack,
        RuleId::GlibcWithinBase,
        "target.glibc",
        format!(
            "target.glibc is {}.{} but the base image {} has glibc {}.{}",
            t.glibc.0, t.glibc.1, t.base.name, t.base.glibc.0, t.base.glibc.1
        ),
        Some(("target.base", format!("{} is chosen here", t.base.name))),
        format!(
            "lower target.glibc to {}.{} or below, or pick a newer base",
            t.base.glibc.0, t.base.glibc.1
        ),
    )
}

/// torch's CUDA major vs the stack's.
fn torch_cuda_major(stack: &Stack, facts: &Facts) -> Outcome {
    let torch = &stack.torch.version;
    match &facts.torch_cuda {
        Some(cuda) if same_cuda_major(cuda, stack.torch.cuda_major) => {
            ok(RuleId::TorchCudaMajor, format!("torch {torch} is built for CUDA {cuda}"))
        }
        Some(cuda) => violation(
            stack,
            RuleId::TorchCudaMajor,
            "torch.cuda",
            format!("torch.cuda is {} but torch {torch} from the index is built for CUDA {cuda}", stack.torch.cuda_major),
            Some(("torch.version", format!("torch {torch} is chosen here"))),
            format!(
                "set torch.cuda = {}, or choose a torch whose default wheels use CUDA {}",
                cuda.release()[0],
                stack.torch.cuda_major
            ),
        ),
        None => Outcome {
            rule: RuleId::TorchCudaMajor,
            status: Status::Violated,
            detail: "torch's metadata names no CUDA version".into(),
            diagnostic: Some(
                stack
                    .diag("torch.version", format!("torch {torch}'s metadata pins no cuda-toolkit and no nvidia-*-cuXX package: is this a CPU-only build?"))
                    .with_hint("commstack needs a CUDA build of torch; check resolve.index-url"),
            ),
        },
    }
}

/// The NVSHMEM family torch pins vs the stack's CUDA major.
fn nvshmem_cuda_family(stack: &Stack, facts: &Facts) -> Outcome {
    let (torch, major) = (&stack.torch.version, stack.torch.cuda_major);
    let Some(pin) = &facts.torch_nvshmem else {
        return not_applicable(
            RuleId::NvshmemCudaFamily,
            format!("torch {torch} pins no NVSHMEM wheel"),
        );
    };
    let name = &pin.name;
    if name.ends_with(&format!("-cu{major}")) {
        return ok(
            RuleId::NvshmemCudaFamily,
            format!("torch pins {name}, CUDA {major}"),
        );
    }
    violation(
        stack,
        RuleId::NvshmemCudaFamily,
        "torch.cuda",
        format!("torch {torch} pins {pin}, not the cu{major} family of the stack"),
        None,
        format!("set torch.cuda to match {name}, or choose another torch"),
    )
}

/// The NVSHMEM version the stack builds vs torch's pin.
fn nvshmem_matches_torch(stack: &Stack, facts: &Facts) -> Outcome {
    let torch = &stack.torch.version;
    let Some(pin) = &facts.torch_nvshmem else {
        return match &stack.nvshmem.version {
            crate::manifest::NvshmemVersion::MatchTorch => Outcome {
                rule: RuleId::NvshmemMatchesTorch,
                status: Status::Violated,
                detail: format!("torch {torch} pins no NVSHMEM"),
                diagnostic: Some(
                    stack
                        .diag("nvshmem.version", format!("nvshmem.version is \"match-torch\" but torch {torch} pins no nvidia-nvshmem wheel"))
                        .with_hint("torch pins NVSHMEM from 2.9 on; for older torch set nvshmem.version to an exact version"),
                ),
            },
            crate::manifest::NvshmemVersion::Exact(v) => {
                ok(RuleId::NvshmemMatchesTorch, format!("torch pins no NVSHMEM; building {v}"))
            }
        };
    };
    match facts
        .nvshmem_build
        .as_ref()
        .map(|b| (b, nvshmem_matches_torch_pin(b, pin)))
    {
        Some((b, Ok(()))) => ok(
            RuleId::NvshmemMatchesTorch,
            format!("NVSHMEM {b} is torch's pin {pin}"),
        ),
        Some((b, Err(conflict))) => violation(
            stack,
            RuleId::NvshmemMatchesTorch,
            "nvshmem.version",
            conflict,
            Some(("torch.version", format!("torch {torch} is chosen here"))),
            format!(
                "use nvshmem.version = \"match-torch\", or a torch that pins {b}, or allow rule {} if you accept what it breaks",
                RuleId::NvshmemMatchesTorch.as_str()
            ),
        ),
        None => deferred(RuleId::NvshmemMatchesTorch, "no NVSHMEM version decided"),
    }
}

/// DeepEP V2's NCCL floor vs torch's NCCL pin.
fn deepep_v2_nccl(stack: &Stack, facts: &Facts) -> Outcome {
    let torch = &stack.torch.version;
    let min_nccl: Version = DEEPEP_V2_MIN_NCCL.parse().unwrap();
    match (&facts.torch_nccl, stack.deepep.api == DeepEpApi::V2) {
        (_, false) => not_applicable(
            RuleId::DeepEpV2Nccl,
            "DeepEP V1 does not use NCCL's device API".into(),
        ),
        (Some(nccl), true) if nccl.version >= min_nccl => ok(
            RuleId::DeepEpV2Nccl,
            format!("torch pins {nccl} >= {min_nccl}"),
        ),
        (nccl, true) => violation(
            stack,
            RuleId::DeepEpV2Nccl,
            "deepep.api",
            format!(
                "DeepEP V2 needs NCCL >= {min_nccl} but torch {torch} pins {}",
                nccl.as_ref()
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "no NCCL".into())
            ),
            Some(("torch.version", format!("torch {torch} is chosen here"))),
            format!(
                "use a torch that pins NCCL >= {min_nccl} (torch 2.14.1 pins 2.30.7), or deepep.api = \"v1\" with rev 567632d, or allow rule {} (two libnccl in one process: DeepEP issue 710)",
                RuleId::DeepEpV2Nccl.as_str()
            ),
        ),
    }
}

/// DeepEP V2's torch floor.
fn deepep_v2_torch(stack: &Stack, _: &Facts) -> Outcome {
    let torch = &stack.torch.version;
    let min_torch: Version = DEEPEP_V2_MIN_TORCH.parse().unwrap();
    if stack.deepep.api != DeepEpApi::V2 {
        not_applicable(RuleId::DeepEpV2Torch, "DeepEP V1".into())
    } else if *torch >= min_torch {
        ok(
            RuleId::DeepEpV2Torch,
            format!("torch {torch} >= {min_torch}"),
        )
    } else {
        violation(
            stack,
            RuleId::DeepEpV2Torch,
            "deepep.api",
            format!("DeepEP V2 needs torch >= {min_torch}, the stack has torch {torch}"),
            Some(("torch.version", format!("torch {torch} is chosen here"))),
            "use torch >= 2.10 or deepep.api = \"v1\"".into(),
        )
    }
}

/// DeepEP V1 against NVSHMEM >= 3.3.20 needs the RDC fix, decided from the sources.
fn deepep_v1_rdc_fix(stack: &Stack, facts: &Facts) -> Outcome {
    let v2 = stack.deepep.api == DeepEpApi::V2;
    let nv = facts.nvshmem_build.as_ref();
    match (v2, nv, facts.deepep_rdc_fix) {
        (true, _, _) => not_applicable(RuleId::DeepEpV1RdcFix, "DeepEP V2".into()),
        (false, Some(nv), _) if !nvshmem_needs_rdc_fix(Some(nv)) => ok(
            RuleId::DeepEpV1RdcFix,
            format!(
                "NVSHMEM {nv} < {NVSHMEM_RDC_SENSITIVE} does not define the IBGDA state itself"
            ),
        ),
        (false, _, Some(true)) => ok(
            RuleId::DeepEpV1RdcFix,
            "DeepEP sources force RDC (csrc/kernels/configs.cuh)".into(),
        ),
        (false, nv, Some(false)) => violation(
            stack,
            RuleId::DeepEpV1RdcFix,
            "deepep.rev",
            missing_rdc_fix(&format!("DeepEP {}", stack.deepep.rev), nv),
            Some((
                "nvshmem.version",
                "the NVSHMEM version is chosen here".into(),
            )),
            format!(
                "{}, or allow rule {}",
                rdc_fix_ways_out(),
                RuleId::DeepEpV1RdcFix.as_str()
            ),
        ),
        (false, _, None) => deferred(
            RuleId::DeepEpV1RdcFix,
            "DeepEP sources not available yet: decided when they are fetched",
        ),
    }
}

/// DeepEP V1 on CUDA 13 needs libcu++'s new include directory; recorded for the build.
fn deepep_v1_cccl(stack: &Stack, _: &Facts) -> Outcome {
    if stack.deepep.api != DeepEpApi::V2 && libcxx_under_cccl(stack.torch.cuda_major) {
        Outcome {
            rule: RuleId::DeepEpV1Cccl,
            status: Status::Applies,
            detail: "DeepEP V1 on CUDA 13: the build adds <cuda>/include/cccl to CPATH".into(),
            diagnostic: None,
        }
    } else {
        not_applicable(RuleId::DeepEpV1Cccl, "not DeepEP V1 on CUDA 13".into())
    }
}

// ---- Decided here, asked again where a build meets the real thing -----------------------
// The lock checks the rules on what resolution found; the builds check the same rules on
// what they are given (a source, an environment, a toolchain). Each rule's decision, and
// the words for a conflict, live here once.

/// Rule `torch-cuda-major`: is `cuda` (torch's CUDA, `13.0`) of the CUDA major `major`?
pub fn same_cuda_major(cuda: &Version, major: u64) -> bool {
    cuda.release().first() == Some(&major)
}

/// Rule `nvshmem-version-matches-torch`, decided and worded once (the lock's check and the
/// drop-in wheel's build ask it): `Err` with the conflict when NVSHMEM `build` is not the
/// version of torch's pin `pin` (release segments compared).
pub fn nvshmem_matches_torch_pin(build: &Version, pin: &Pin) -> Result<(), String> {
    if build.release() == pin.version.release() {
        return Ok(());
    }
    Err(format!(
        "the stack builds NVSHMEM {build} but torch pins {pin}: torch's NVSHMEM users (symmetric memory, Triton NVSHMEM kernels) would run against an NVSHMEM PyTorch did not build with, and `pip check` fails"
    ))
}

/// Rule `deepep-v1-rdc-fix`: does DeepEP V1 built against NVSHMEM `nvshmem` need the RDC fix?
/// An unknown version is taken to be a new one.
pub fn nvshmem_needs_rdc_fix(nvshmem: Option<&Version>) -> bool {
    let sensitive: Version = NVSHMEM_RDC_SENSITIVE.parse().expect("a version");
    nvshmem.is_none_or(|v| *v >= sensitive)
}

/// Rule `deepep-v1-rdc-fix`'s conflict, for `deepep` (`DeepEP 1a2b3c4`, or the path of
/// its configs.cuh) without the fix against NVSHMEM `nvshmem`.
pub fn missing_rdc_fix(deepep: &str, nvshmem: Option<&Version>) -> String {
    format!(
        "{deepep} does not force RDC (no `#define __CUDACC_RDC__` under `#ifndef DISABLE_NVSHMEM` in csrc/kernels/configs.cuh), and NVSHMEM {} defines nvshmemi_ibgda_device_state_d itself: the link fails with `multiple definition of nvshmemi_ibgda_device_state_d`",
        nvshmem.map_or_else(|| "(unknown version)".to_string(), |v| v.to_string())
    )
}

/// Rule `deepep-v1-rdc-fix`'s ways out (but allowing it).
pub fn rdc_fix_ways_out() -> String {
    format!(
        "use DeepEP 567632d (the last V1 commit, includes the fix of 29d31c0), or NVSHMEM < {NVSHMEM_RDC_SENSITIVE}"
    )
}

/// Rule `deepep-v1-cccl`: from CUDA 13 on, libcu++ (`cuda/std/...`) is under
/// `include/cccl`, which a DeepEP build must add to its include path.
pub fn libcxx_under_cccl(cuda_major: u64) -> bool {
    cuda_major >= 13
}

/// Does a DeepEP V1 source tree force RDC, so that NVSHMEM's device symbols are declared
/// `extern` (DeepEP 29d31c0)? Decided from `csrc/kernels/configs.cuh`: `__CUDACC_RDC__` must
/// be defined inside an `#ifndef DISABLE_NVSHMEM` block.
pub fn deepep_v1_has_rdc_fix(configs_cuh: &str) -> bool {
    let mut depth_in_block: Option<usize> = None;
    let mut depth = 0usize;
    for line in configs_cuh.lines() {
        let l = line.trim_start();
        let directive = l.strip_prefix('#').map(|d| d.trim_start());
        let Some(d) = directive else { continue };
        if d.starts_with("if") {
            depth += 1;
            if depth_in_block.is_none()
                && d.split_whitespace().collect::<Vec<_>>() == ["ifndef", "DISABLE_NVSHMEM"]
            {
                depth_in_block = Some(depth);
            }
        } else if d.starts_with("endif") {
            if depth_in_block == Some(depth) {
                depth_in_block = None;
            }
            depth = depth.saturating_sub(1);
        } else if depth_in_block.is_some()
            && d.starts_with("define")
            && d.split_whitespace().nth(1) == Some("__CUDACC_RDC__")
        {
            return true;
        }
    }
    false
}

/// DeepEP needs an NVSHMEM built with IBGDA (stack.toml's `nvshmem.ibgda`).
fn deepep_needs_ibgda(stack: &Stack, _: &Facts) -> Outcome {
    let rev = &stack.deepep.rev;
    if stack.nvshmem.transports.get("ibgda") {
        return ok(
            RuleId::DeepEpNeedsIbgda,
            format!("NVSHMEM is built with IBGDA, which DeepEP {rev} links"),
        );
    }
    violation(
        stack,
        RuleId::DeepEpNeedsIbgda,
        "nvshmem.ibgda",
        deepep_without_ibgda(rev),
        Some((
            "deepep.rev",
            format!("DeepEP {rev} is built from this stack"),
        )),
        ibgda_ways_out(),
    )
}

/// Rule `deepep-needs-ibgda`'s conflict, for DeepEP `rev` (also said by a build whose
/// `--no-ibgda` turns IBGDA off).
pub fn deepep_without_ibgda(rev: &str) -> String {
    format!(
        "NVSHMEM would be built without IBGDA, but DeepEP {rev}'s kernels use its IBGDA device state: its device link would fail with `Undefined reference to 'nvshmemi_ibgda_device_state_d'`"
    )
}

/// Rule `deepep-needs-ibgda`'s ways out (but allowing it).
pub fn ibgda_ways_out() -> String {
    "keep IBGDA on (`nvshmem.ibgda = true`, no `--no-ibgda`); an IBGDA build runs on hosts without IBGDA too (NVSHMEM falls back to P2P/other transports at run time); to build NVSHMEM alone without it, `cargo xtask build nvshmem --no-ibgda`".into()
}

fn ok(rule: RuleId, detail: String) -> Outcome {
    Outcome {
        rule,
        status: Status::Ok,
        detail,
        diagnostic: None,
    }
}

fn not_applicable(rule: RuleId, detail: String) -> Outcome {
    Outcome {
        rule,
        status: Status::NotApplicable,
        detail,
        diagnostic: None,
    }
}

fn deferred(rule: RuleId, detail: &str) -> Outcome {
    Outcome {
        rule,
        status: Status::Deferred,
        detail: detail.into(),
        diagnostic: None,
    }
}

fn violation(
    stack: &Stack,
    rule: RuleId,
    field: &str,
    message: String,
    other: Option<(&str, String)>,
    way_out: String,
) -> Outcome {
    let mut d = stack.diag(field, format!("{message} [rule {}]", rule.as_str()));
    if let Some((other_field, note)) = other
        && let Some(loc) = stack.locate(other_field)
    {
        d = d.with_related(loc, note);
    }
    let d = d.with_hint(format!("{way_out}. Why the rule exists: {}", rule.reason()));
    Outcome {
        rule,
        status: Status::Violated,
        detail: message,
        diagnostic: Some(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdc_fix_is_read_from_the_source() {
        // The shape of csrc/kernels/configs.cuh after DeepEP 29d31c0.
        let fixed = "#pragma once\n#ifndef DISABLE_NVSHMEM\n#ifndef __CUDACC_RDC__\n#define __CUDACC_RDC__  // NOLINT\n#endif\n#endif\n";
        assert!(deepep_v1_has_rdc_fix(fixed));
        // Before: __CUDACC_RDC__ only defined for clangd, not under DISABLE_NVSHMEM.
        let before = "#pragma once\n#ifdef __CLION_IDE__\n#define __CUDACC_RDC__\n#endif\n#ifndef DISABLE_NVSHMEM\n#include <nvshmem.h>\n#endif\n";
        assert!(!deepep_v1_has_rdc_fix(before));
        assert!(!deepep_v1_has_rdc_fix(""));
    }

    #[test]
    fn rule_ids_round_trip_and_fingerprint_is_stable() {
        for r in RuleId::ALL {
            assert_eq!(RuleId::from_str(r.as_str()), Ok(r));
        }
        assert_eq!(fingerprint(), fingerprint());
        assert!(fingerprint().starts_with("sha256:"));
    }

    #[test]
    fn the_table_has_every_rule_once_in_id_order() {
        let ids: Vec<RuleId> = RULES.iter().map(|r| r.id).collect();
        assert_eq!(ids, RuleId::ALL);
    }

    #[test]
    fn the_shared_decisions() {
        let v = |s: &str| -> Version { s.parse().unwrap() };
        assert!(same_cuda_major(&v("13.0"), 13) && !same_cuda_major(&v("12.8"), 13));
        let pin = Pin::new("nvidia-nvshmem-cu13", v("3.4.5"));
        assert!(nvshmem_matches_torch_pin(&v("3.4.5"), &pin).is_ok());
        assert_eq!(
            nvshmem_matches_torch_pin(&v("3.3.24"), &pin)
                .unwrap_err()
                .split(':')
                .next(),
            Some("the stack builds NVSHMEM 3.3.24 but torch pins nvidia-nvshmem-cu13==3.4.5")
        );
        assert!(nvshmem_needs_rdc_fix(Some(&v("3.3.20"))) && nvshmem_needs_rdc_fix(None));
        assert!(!nvshmem_needs_rdc_fix(Some(&v("3.3.9"))));
        assert!(missing_rdc_fix("DeepEP abc", None).contains("NVSHMEM (unknown version)"));
        assert!(libcxx_under_cccl(13) && !libcxx_under_cccl(12));
    }
}
