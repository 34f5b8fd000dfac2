//! `cargo xtask lock`: resolve a [`Stack`] into a [`Lock`].
//!
//! 1. The manifest-only rules run first (no network spent on a stack that cannot work).
//! 2. The target's Python closure is resolved from the index: torch at the exact version,
//!    plus the stack's extra requirements, for the target's CPython, arch and glibc.
//! 3. torch's own pins (CUDA toolkit, NCCL, NVSHMEM) are read from what resolved. With
//!    `[nccl] version = "X.Y.Z"`, torch's NCCL requirement is overridden in the resolution
//!    (as uv's override-dependencies): torch's pin is still read from its metadata, and the
//!    override's wheel's file list (its zip directory, by range requests) says which
//!    libnccl it ships (rule nccl-soname).
//! 4. The NVSHMEM and DeepEP sources (and DeepEP's submodules) come from the known
//!    table, or are fetched and hashed, trusted by the user's hash or on first use
//!    ([`sources`], docs/sources.md).
//! 5. The rules that need those facts run; any violation stops here with all diagnostics.
//! 6. The toolchain (nvcc and the CUDA headers at torch's CUDA version, cmake, ninja) is
//!    resolved for the build host.
//! 7. NVIDIA's NVSHMEM wheel is marked as replaced by the stack's own build.
//! 8. With `[image]`: the base's Debian packages, from the mirror's signed index
//!    (commstack-debian), as `[base]` and `[[deb]]`. The index must be current: not
//!    expired, not from the future, not older than `image.index-max-age-days`, and not
//!    older than the one the previous lock recorded for the same mirror and suite.

use std::path::Path;
use std::str::FromStr;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use commstack_debian::freshness::{Freshness, Recorded};
use commstack_debian::mirror::IndexBounds;
use commstack_pypi::{IndexClient, TargetPlatform};
use commstack_resolve::{Request, Resolution};
use commstack_stack::lock::{
    BaseLock, Deb, Inputs, LOCK_VERSION, NcclOverride, RecordedIndex, Resolved, RuleRecord, Wheel,
};
use commstack_stack::manifest::{NcclVersion, NvshmemVersion};
use commstack_stack::rules::{self, Facts, Status};
use commstack_stack::{Lock, Pin, Stack, known};
use pep440_rs::Version;
use pep508_rs::Requirement;

use commstack_stack::lock::{TOOLCHAIN_CUDA_EXTRAS, recipe};

pub mod sources;
pub use sources::{NoFetch, SeenFuture, SourceFetcher, SourceRequest, SourceSeen};

/// Progress lines for the caller to print (or not).
pub trait Progress {
    fn step(&self, message: &str);
}

impl<F: Fn(&str)> Progress for F {
    fn step(&self, message: &str) {
        self(message)
    }
}

/// What locking found, beside the lock itself: timings and counts for the summary.
pub struct Locked {
    pub lock: Lock,
    pub seconds: f64,
    pub requests: u64,
    /// Lines the caller must print whatever its verbosity: sources trusted on first use.
    pub warnings: Vec<String>,
}

/// The lock that is there before `lock` writes a new one: the base's index must not go
/// back from what it recorded.
#[derive(Clone, Copy, Debug)]
pub struct PreviousLock<'a> {
    pub path: &'a Path,
    pub text: &'a str,
}

/// [`lock_with`] for a caller that fetches nothing: the sources must be known or
/// recorded by `previous`.
pub async fn lock(
    stack: &Stack,
    metadata_cache: Option<std::path::PathBuf>,
    previous: Option<PreviousLock<'_>>,
    progress: &dyn Progress,
) -> Result<Locked> {
    lock_with(stack, metadata_cache, previous, progress, &sources::NoFetch).await
}

/// Resolve `stack` against its index. `metadata_cache` keeps wheel metadata by wheel hash;
/// `previous` is the lock being replaced, if any; `fetcher` brings and hashes the sources
/// neither the known table nor `previous` has hashes for.
pub async fn lock_with(
    stack: &Stack,
    metadata_cache: Option<std::path::PathBuf>,
    previous: Option<PreviousLock<'_>>,
    progress: &dyn Progress,
    fetcher: &dyn SourceFetcher,
) -> Result<Locked> {
    let started = Instant::now();
    fail_on_violations(&rules::check_manifest(stack))?;
    // Before any network: a stack that cannot name its base's mirror fails at once.
    let base_request = base_request(stack, previous)?;

    let client = IndexClient::new(&stack.resolve.index_url, metadata_cache)?;
    let target = TargetPlatform {
        python: stack.target.python,
        arch: stack.target.arch.as_str().to_string(),
        glibc: stack.target.glibc,
    };
    let closure = resolve_closure(stack, &client, &target, progress).await?;
    let mut facts = torch_facts(stack, &closure)?;
    if rules::nccl_override_may_stand(stack, &facts) {
        facts.nccl_wheel_libs = nccl_wheel_libs(stack, &client, &closure, progress).await?;
    }
    let outcomes = rules::check_resolved(stack, &facts);
    fail_on_violations(&outcomes)?;
    let nvshmem_version = facts.nvshmem_build.clone().expect("set by torch_facts");
    let previous_lock = previous.and_then(|p| Lock::parse(p.path, p.text).ok());
    let today = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
    let nccl_version = facts
        .nccl
        .as_ref()
        .map(|p| p.version.clone())
        .ok_or_else(|| {
            anyhow!("torch pins no nvidia-nccl-cuXX wheel: commstack needs torch's NCCL pin")
        })?;
    let (sources, warnings) = sources::lock_sources(
        stack,
        sources::SourceVersions {
            nvshmem: &nvshmem_version,
            nccl: &nccl_version,
        },
        previous_lock.as_ref(),
        fetcher,
        &today,
    )
    .await?;
    // The toolchain runs on the build host: same arch, the host's glibc floor.
    let cuda = facts
        .torch_cuda
        .clone()
        .expect("checked by rule torch-cuda-major");
    let toolchain = resolve_toolchain(stack, &client, &target, &cuda, progress).await?;
    let mut lock = lock_of(
        stack, &target, &facts, &outcomes, sources, &closure, &toolchain,
    )?;
    if let Some(request) = &base_request {
        progress.step(&format!(
            "resolving the base: {} {} {}, essential + {} (mirror {})",
            stack.target.base.name,
            request.suite,
            request.architecture,
            request.include.join(", "),
            request.mirror
        ));
        let (base, debs) = lock_base(stack, request).await?;
        progress.step(&format!("{} Debian packages in the base", debs.len()));
        lock.base = Some(base);
        lock.debs = debs;
    }
    let s = &client.stats;
    let requests = [&s.pages, &s.metadata_files, &s.metadata_from_wheel]
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    Ok(Locked {
        lock,
        seconds: started.elapsed().as_secs_f64(),
        requests,
        warnings,
    })
}

/// torch at the stack's version and the extra requirements, resolved for the target.
async fn resolve_closure(
    stack: &Stack,
    client: &IndexClient,
    target: &TargetPlatform,
    progress: &dyn Progress,
) -> Result<Resolution> {
    let mut requirements = vec![
        Requirement::from_str(&format!("torch=={}", stack.torch.version))
            .context("torch requirement")?,
    ];
    requirements.extend(stack.resolve.extra_requirements.iter().cloned());
    progress.step(&format!(
        "resolving torch=={} for {} {} (index {})",
        stack.torch.version,
        target.python_tag(),
        target.platform_tag(),
        stack.resolve.index_url
    ));
    check_torch_exists(stack, client).await?;
    let closure = commstack_resolve::resolve(
        client,
        &Request {
            requirements,
            target: target.clone(),
            python_full: stack.target.python_full(),
            exclude_newer: stack.resolve.exclude_newer,
            overrides: nccl_override_requirement(stack).into_iter().collect(),
        },
    )
    .await
    .with_context(|| format!("resolving the Python closure of {}", stack.path().display()))?;
    progress.step(&format!(
        "{} packages in the target closure",
        closure.packages.len()
    ));
    Ok(closure)
}

/// The build toolchain for the host: torch's CUDA compiler wheels, cmake and ninja.
async fn resolve_toolchain(
    stack: &Stack,
    client: &IndexClient,
    target: &TargetPlatform,
    cuda: &Version,
    progress: &dyn Progress,
) -> Result<Resolution> {
    let host = TargetPlatform {
        python: target.python,
        arch: target.arch.clone(),
        glibc: stack.toolchain.host_glibc,
    };
    let mut tool_reqs = vec![
        Requirement::from_str(&format!("cuda-toolkit[{TOOLCHAIN_CUDA_EXTRAS}]=={cuda}"))?,
        Requirement::from_str(&format!("cmake{}", stack.toolchain.cmake))?,
        Requirement::from_str(&format!("ninja{}", stack.toolchain.ninja))?,
    ];
    let cuda_major = cuda.release().first().copied().unwrap_or_default();
    if let Some(req) =
        commstack_stack::lock::jit_cuobjdump_requirement(stack.deepep.api, cuda_major)
    {
        progress.step(&format!(
            "DeepEP V2's JIT runs cuobjdump at run time: the toolchain adds {req}"
        ));
        tool_reqs.push(Requirement::from_str(&req)?);
    }
    progress.step(&format!(
        "resolving the toolchain: CUDA {cuda} compiler, cmake{}, ninja{}",
        stack.toolchain.cmake, stack.toolchain.ninja
    ));
    let toolchain = commstack_resolve::resolve(
        client,
        &Request {
            requirements: tool_reqs,
            target: host,
            python_full: stack.target.python_full(),
            exclude_newer: stack.resolve.exclude_newer,
            overrides: Vec::new(),
        },
    )
    .await
    .context("resolving the build toolchain")?;
    Ok(toolchain)
}

/// The lock of what was resolved (without its base).
fn lock_of(
    stack: &Stack,
    target: &TargetPlatform,
    facts: &Facts,
    outcomes: &[rules::Outcome],
    sources: Vec<commstack_stack::lock::Source>,
    closure: &Resolution,
    toolchain: &Resolution,
) -> Result<Lock> {
    let nvshmem_version = facts.nvshmem_build.clone().expect("set by torch_facts");
    let cuda = facts
        .torch_cuda
        .clone()
        .expect("checked by rule torch-cuda-major");
    let nvshmem_pin = facts.torch_nvshmem.clone();
    let packages = closure
        .packages
        .iter()
        .map(|p| {
            let mut w = wheel(p);
            if nvshmem_pin
                .as_ref()
                .is_some_and(|pin| p.name.as_ref() == pin.name)
            {
                w.replaced_by = Some("nvshmem".into());
            }
            w
        })
        .collect();
    let nccl = facts.nccl.clone().ok_or_else(|| {
        anyhow!(
            "torch {} pins no nvidia-nccl-cuXX wheel: commstack needs torch's NCCL pin",
            stack.torch.version
        )
    })?;
    let nccl_override = nccl_override_record(stack, closure, facts, &nccl)?;
    Ok(Lock {
        version: LOCK_VERSION,
        inputs: Inputs {
            stack: stack.fingerprint(),
            rules: rules::fingerprint(),
            resolver: recipe(),
            index_url: stack.resolve.index_url.clone(),
            exclude_newer: stack.resolve.exclude_newer.map(|t| t.to_string()),
        },
        resolved: Resolved {
            python_tag: target.python_tag(),
            platform: target.platform_tag(),
            torch: stack.torch.version.to_string(),
            cuda: cuda.to_string(),
            nccl,
            nccl_override,
            nvshmem_pin,
            nvshmem: nvshmem_version.to_string(),
            deepep_rev: sources
                .iter()
                .find(|s| s.name == "deepep")
                .and_then(|s| s.rev.clone())
                .unwrap_or_default(),
            deepep_api: stack.deepep.api,
        },
        manifest: stack.echo(),
        rules: outcomes
            .iter()
            .map(|o| RuleRecord {
                id: o.rule.as_str().into(),
                status: o.status.clone(),
                detail: o.detail.clone(),
            })
            .collect(),
        sources,
        packages,
        toolchain: toolchain.packages.iter().map(wheel).collect(),
        base: None,
        debs: Vec::new(),
    })
}

/// What to ask the Debian mirror for, or None for a stack without `[image]`. The index is
/// judged now, with the stack's `image.index-max-age-days`, and must not be older than
/// what `previous` recorded for the same mirror and suite.
pub fn base_request(
    stack: &Stack,
    previous: Option<PreviousLock<'_>>,
) -> Result<Option<commstack_debian::BaseRequest>> {
    let Some(image) = &stack.image else {
        return Ok(None);
    };
    let base = stack.target.base;
    let Some(mirror) = &image.mirror else {
        let loc = stack
            .locate("target.base")
            .map(|l| format!("{l}: "))
            .unwrap_or_default();
        bail!(
            "{loc}the base {} is an Ubuntu release and [image] names no mirror: commstack has no default \
             Ubuntu mirror because this network does not reach archive.ubuntu.com. Set image.mirror in {} to an \
             Ubuntu mirror you can reach (e.g. a local apt-cacher-ng or aptly mirror of {}), or use a Debian base \
             (target.base = \"debian-12\")",
            base.name,
            stack.path().display(),
            base.suite
        );
    };
    let suite = base.suite.to_string();
    let mut freshness = Freshness::now(image.index_max_age_days);
    freshness.recorded = previous.and_then(|p| recorded_index(p, mirror, &suite));
    Ok(Some(commstack_debian::BaseRequest {
        mirror: mirror.clone(),
        suite,
        architecture: debian_arch(stack.target.arch).to_string(),
        keyring: image.keyring.clone().into(),
        include: image.include.clone(),
        freshness,
        bounds: IndexBounds::default(),
    }))
}

/// The index date `previous` recorded when it was read from `mirror`'s `suite`. Another
/// mirror or suite sets no floor (its dates are its own); a date that does not read as a
/// time is no floor either, but it cannot come from `lock`, which writes RFC 3339.
fn recorded_index(previous: PreviousLock<'_>, mirror: &str, suite: &str) -> Option<Recorded> {
    let recorded = RecordedIndex::of_lock_text(previous.text)?;
    let same_mirror = recorded.mirror.trim_end_matches('/') == mirror.trim_end_matches('/');
    if !same_mirror || recorded.suite != suite {
        return None;
    }
    Some(Recorded {
        date: recorded.release_date.parse().ok()?,
        lock: previous.path.display().to_string(),
    })
}

/// Debian's name of an architecture.
pub fn debian_arch(arch: commstack_stack::manifest::Arch) -> &'static str {
    match arch {
        commstack_stack::manifest::Arch::X86_64 => "amd64",
        commstack_stack::manifest::Arch::Aarch64 => "arm64",
    }
}

/// `[base]` and `[[deb]]` (sorted by name) from the mirror's signed index.
async fn lock_base(
    stack: &Stack,
    request: &commstack_debian::BaseRequest,
) -> Result<(BaseLock, Vec<Deb>)> {
    let locked = commstack_debian::lock_base(request)
        .await
        .with_context(|| format!("locking the base of {} ([image])", stack.path().display()))?;
    // The image's time: exclude-newer when set (the lock's own reference time), else the
    // release's date, so that the same lock always gives the same SOURCE_DATE_EPOCH.
    let epoch = stack
        .resolve
        .exclude_newer
        .unwrap_or(locked.release_date)
        .as_second();
    let base = BaseLock {
        distribution: stack.target.base.distribution().as_str().to_string(),
        suite: request.suite.clone(),
        mirror: request.mirror.clone(),
        architecture: request.architecture.clone(),
        components: vec!["main".to_string()],
        variant: "essential".to_string(),
        include: request.include.clone(),
        release_date: locked.release_date.to_string(),
        packages_sha256: locked.packages_sha256.clone(),
        epoch: u64::try_from(epoch).context("the base's epoch is before 1970")?,
    };
    let mut debs: Vec<Deb> = locked
        .packages
        .iter()
        .map(|p| Deb {
            name: p.name.clone(),
            version: p.version.to_string(),
            architecture: p.architecture.clone(),
            filename: p.filename.clone(),
            url: commstack_debian::LockedBase::url(&request.mirror, p),
            sha256: p.sha256.clone(),
            size: p.size,
        })
        .collect();
    debs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((base, debs))
}

/// A torch version the index does not have is the most likely typo in a stack: say so at
/// the manifest's line, with the versions that exist, before resolving anything.
async fn check_torch_exists(stack: &Stack, client: &IndexClient) -> Result<()> {
    let name = pep508_rs::PackageName::from_str("torch").expect("a valid name");
    let loc = stack
        .locate("torch.version")
        .map(|l| format!("{l}: "))
        .unwrap_or_default();
    let Some(page) = client.project(&name).await? else {
        bail!(
            "{loc}the index {} has no torch at all",
            stack.resolve.index_url
        );
    };
    let wanted = &stack.torch.version;
    let mut versions: Vec<&Version> = page
        .files
        .iter()
        .filter_map(|f| f.wheel.as_ref().map(|w| &w.version))
        .collect();
    versions.sort();
    versions.dedup();
    if !versions.contains(&wanted) {
        let newest: Vec<String> = versions
            .iter()
            .rev()
            .filter(|v| !v.any_prerelease())
            .take(5)
            .map(|v| v.to_string())
            .collect();
        bail!(
            "{loc}torch {wanted} is not on the index {} (newest releases: {})",
            stack.resolve.index_url,
            newest.join(", ")
        );
    }
    Ok(())
}

fn wheel(p: &commstack_resolve::Resolved) -> Wheel {
    Wheel {
        name: p.name.to_string(),
        version: p.version.to_string(),
        filename: p.wheel.filename.clone(),
        url: p.wheel.url.clone(),
        sha256: p.wheel.sha256.clone().unwrap_or_default(),
        size: p.wheel.size.unwrap_or(0),
        requires: p.requires.iter().map(|n| n.to_string()).collect(),
        replaced_by: None,
    }
}

/// torch's pins, read from what resolved (torch pins them exactly).
pub fn torch_facts(stack: &Stack, closure: &Resolution) -> Result<Facts> {
    let find_prefix = |prefix: &str| {
        closure
            .packages
            .iter()
            .find(|p| p.name.as_ref().starts_with(prefix))
            .map(|p| Pin::new(p.name.to_string(), p.version.clone()))
    };
    let torch_cuda = closure
        .get("cuda-toolkit")
        .map(|p| p.version.clone())
        // torch < 2.11 pins the runtime directly (nvidia-cuda-runtime-cu12==12.8.90).
        .or_else(|| find_prefix("nvidia-cuda-runtime").map(|p| p.version));
    // torch's NCCL pin from its metadata: the overridden requirement when [nccl] replaced
    // it, else what resolved.
    let nccl = find_prefix("nvidia-nccl-cu");
    let torch_nccl = match torch_nccl_requirement(closure) {
        Some(o) => Some(pin_of(&o.original)?),
        None => nccl.clone(),
    };
    let torch_nvshmem = find_prefix("nvidia-nvshmem-cu");
    let nvshmem_build = match &stack.nvshmem.version {
        NvshmemVersion::Exact(v) => v.clone(),
        NvshmemVersion::MatchTorch => match &torch_nvshmem {
            Some(pin) => pin.version.clone(),
            None => {
                // Reported properly by rule nvshmem-version-matches-torch.
                let facts = Facts {
                    torch_cuda,
                    torch_nccl,
                    nccl,
                    ..Facts::default()
                };
                fail_on_violations(&rules::check_resolved(stack, &facts))?;
                unreachable!("rule nvshmem-version-matches-torch fails without a torch pin")
            }
        },
    };
    let deepep_rdc_fix = known::deepep_rev(&stack.deepep.rev).and_then(|r| r.rdc_fix);
    Ok(Facts {
        torch_cuda,
        torch_nccl,
        nccl,
        nccl_wheel_libs: None,
        torch_nvshmem,
        nvshmem_build: Some(nvshmem_build),
        deepep_rdc_fix,
    })
}

/// `[nccl] version = "X.Y.Z"` as the requirement that overrides torch's:
/// `nvidia-nccl-cu<torch.cuda>==X.Y.Z`. None for match-torch.
fn nccl_override_requirement(stack: &Stack) -> Option<Requirement> {
    let NcclVersion::Exact(v) = &stack.nccl.version else {
        return None;
    };
    let text = format!("nvidia-nccl-cu{}=={v}", stack.torch.cuda_major);
    Some(Requirement::from_str(&text).expect("a name and an exact version"))
}

/// torch's NCCL requirement that the `[nccl]` override replaced, if it did.
fn torch_nccl_requirement(closure: &Resolution) -> Option<&commstack_resolve::Overridden> {
    closure.overridden.iter().find(|o| {
        o.by.as_ref().is_some_and(|(n, _)| n.as_ref() == "torch")
            && o.original.name.as_ref().starts_with("nvidia-nccl-cu")
    })
}

/// `name==version` of an exact requirement (torch pins its NVIDIA wheels so).
fn pin_of(req: &Requirement) -> Result<Pin> {
    let exact = match &req.version_or_url {
        Some(pep508_rs::VersionOrUrl::VersionSpecifier(specs)) => specs
            .iter()
            .find(|s| *s.operator() == pep440_rs::Operator::Equal)
            .map(|s| s.version().clone()),
        _ => None,
    };
    let version = exact.ok_or_else(|| {
        anyhow!("torch's requirement `{req}` is not an exact pin: commstack needs torch's NCCL pin")
    })?;
    Ok(Pin::new(req.name.to_string(), version))
}

/// With an `[nccl]` override: the override's wheel and the `libnccl.so*` files its zip
/// directory lists (range requests: the wheel, 200+ MB, is not downloaded), for rule
/// nccl-soname. None for match-torch, or when no NCCL resolved (other rules say why).
async fn nccl_wheel_libs(
    stack: &Stack,
    client: &IndexClient,
    closure: &Resolution,
    progress: &dyn Progress,
) -> Result<Option<(String, Vec<String>)>> {
    if stack.nccl.version == NcclVersion::MatchTorch {
        return Ok(None);
    }
    let Some(p) = closure
        .packages
        .iter()
        .find(|p| p.name.as_ref().starts_with("nvidia-nccl-cu"))
    else {
        return Ok(None);
    };
    progress.step(&format!(
        "reading the file list of {} (rule nccl-soname)",
        p.wheel.filename
    ));
    let names = client.wheel_file_names(&p.wheel).await?;
    let libs = names
        .into_iter()
        .filter(|n| {
            n.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with("libnccl.so"))
        })
        .collect();
    Ok(Some((p.wheel.filename.clone(), libs)))
}

/// The lock's record of an `[nccl]` override: torch's pin, its requirement as written and
/// why the environment holds `nccl` instead. None for match-torch.
fn nccl_override_record(
    stack: &Stack,
    closure: &Resolution,
    facts: &Facts,
    nccl: &Pin,
) -> Result<Option<NcclOverride>> {
    let NcclVersion::Exact(v) = &stack.nccl.version else {
        return Ok(None);
    };
    let (Some(original), Some(torch_pin)) = (torch_nccl_requirement(closure), &facts.torch_nccl)
    else {
        bail!(
            "[nccl] version = \"{v}\" overrides nothing: torch {} has no nvidia-nccl-cu{} requirement",
            stack.torch.version,
            stack.torch.cuda_major
        );
    };
    Ok(Some(NcclOverride {
        torch_pin: torch_pin.clone(),
        replaces: original.original.to_string(),
        reason: format!(
            "[nccl] version = \"{v}\" replaces torch {}'s Requires-Dist `{}` (as uv's override-dependencies do): the environment holds exactly one NCCL, {nccl}, not older than torch's pin (rule {}) and shipping libnccl.so.{} (rule {})",
            stack.torch.version,
            original.original,
            rules::RuleId::NcclNotOlderThanTorch.as_str(),
            rules::NCCL_SONAME_MAJOR,
            rules::RuleId::NcclSoname.as_str(),
        ),
    }))
}

fn fail_on_violations(outcomes: &[rules::Outcome]) -> Result<()> {
    let bad: Vec<String> = outcomes
        .iter()
        .filter(|o| o.status == Status::Violated)
        .map(|o| {
            o.diagnostic
                .as_ref()
                .map(|d| d.to_string())
                .unwrap_or_else(|| o.detail.clone())
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    bail!(
        "the stack breaks {} compatibility rule(s):\n{}",
        bad.len(),
        bad.join("\n")
    )
}
