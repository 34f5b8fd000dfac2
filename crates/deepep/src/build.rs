//! The DeepEP build step: `python setup.py bdist_wheel` in the computed environment, in a
//! store step keyed by everything the wheel depends on.
//!
//! Step layout (`<store>/steps/deepep-<hash>/`):
//! ```text
//! dist/deep_ep-<version>-<tags>.whl   the wheel (canonical: see crate::reproducible)
//! logs/build.log                       setup.py's output, with the environment and command
//! build-report.json                    inputs, environment (and why), timings, wheel facts
//!                                      (the sha256 of the wheel and of each file in it)
//! ```
//! The key: the source tree hash, the NVSHMEM build step (or prefix tree hash), the
//! Python environment (managed: the venv step; adopted: Python and torch exactly), the
//! TORCH_CUDA_ARCH_LIST, the toolchain identity, SOURCE_DATE_EPOCH, the recipe revision.
//! No path that differs between machines (the store, COMMSTACK_HOME): the same key gives
//! the same wheel, byte for byte. Not the job count.
//!
//! setup.py runs in [`FixedDir`] (`/var/tmp/commstack-build/deepep-<hash>`), with its
//! inputs seen through links in it (`deps/nvshmem`, `deps/toolchain`, `deps/python`,
//! ...); the results go to the store step as before.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_stack::CudaArch;
use commstack_stack::manifest::DeepEpApi;
use commstack_stack::rules::{self, RuleId};
use commstack_store::{FixedDir, Outcome, StepKey, Store};
use commstack_toolchain::Toolchain;
use serde::{Deserialize, Serialize};

use crate::archs::torch_cuda_arch_list;
use crate::env::{BuildEnv, EnvInputs, build_env};
use crate::nvshmem::{NvshmemInput, RdmaHeaders, check_v1_prefix, rdma_core_for};
use crate::python::PythonEnv;
use crate::reproducible::{
    Relocated, RpathRewrite, needles, nvcc_has_objtemp, prefix_maps, real_ld, relocate, set_times,
    through, write_canonical, write_ld_wrapper,
};
use crate::run::run_logged;
use crate::source::{SourceInput, check_rdc_fix, declared_version, detect_api};
use crate::wheel_check::{Expect, WheelFacts, check_contents, wheel_facts};
use commstack_exec::CommandFailed;
use commstack_wheel::Wheel;

pub const BUILD_REPORT_FILE: &str = "build-report.json";
/// The store step name of DeepEP's wheel build.
pub const STEP: &str = "deepep";
/// Bumped when the recipe changes what it produces.
pub const RECIPE: &str = "deepep-setup-py-4";
/// Written into the DeepEP wheel's dist-info: the NVSHMEM its extension was built against
/// (V1 links NVSHMEM's device library statically), so verify can check, from the files
/// alone, that the environment's host library is of the same build.
pub const BUILD_RECORD_FILE: &str = "commstack-build.json";

/// The Python environment that builds (its torch is the one the wheel is built for).
#[derive(Clone, Debug)]
pub struct PythonTarget {
    pub env: PythonEnv,
    /// `managed` (a venv step from the lock) or `adopt` (an existing environment).
    pub mode: String,
    /// What keys builds made in it.
    pub identity: serde_json::Value,
}

impl PythonTarget {
    /// A managed venv: keyed by its step (which is keyed by every wheel's sha256).
    pub fn managed(venv: &crate::venv::ManagedVenv) -> Result<PythonTarget> {
        let env = PythonEnv::probe(&venv.python)?;
        Ok(PythonTarget {
            identity: serde_json::json!({ "managed_venv": venv.key.hash, "python": env.version }),
            env,
            mode: "managed".into(),
        })
    }

    /// An existing environment: keyed by its Python and torch, exactly.
    pub fn adopted(python: &Path) -> Result<PythonTarget> {
        let env = PythonEnv::probe(python)?;
        Ok(PythonTarget {
            identity: env.identity(),
            env,
            mode: "adopt".into(),
        })
    }
}

/// Everything one build needs.
pub struct BuildRequest<'a> {
    pub api: DeepEpApi,
    pub source: &'a SourceInput,
    pub nvshmem: &'a NvshmemInput,
    pub python: &'a PythonTarget,
    pub toolchain: &'a Toolchain,
    /// As the stack writes them (`90`).
    pub cuda_archs: &'a [CudaArch],
    /// Parallel compile jobs (MAX_JOBS; does not change the output, so not in the key).
    pub jobs: usize,
    /// The stack allows rule deepep-v1-rdc-fix to be violated.
    pub allow_missing_rdc_fix: bool,
    /// V2: an NCCL root to build against instead of the environment's own.
    pub nccl_override: Option<&'a Path>,
    /// Accept `nccl_override` although it puts a second libnccl into the process.
    pub allow_second_nccl: bool,
    /// V2: the stack's NCCL built from source (its drop-in wheel's prefix), which `adopt`
    /// installs in place of the environment's own: built against, and found at run time
    /// where the environment's NCCL is (`nvidia/nccl/lib`), so still one NCCL.
    pub nccl_dropin: Option<&'a Path>,
    /// rdma-core (`/`, or a `dpkg -x` tree) for NVSHMEM headers that include
    /// infiniband/mlx5dv.h; default: the NVSHMEM build's own, else the system's.
    pub rdma_core: Option<&'a Path>,
    /// SOURCE_DATE_EPOCH: the lock's `[base] epoch`, else
    /// [`crate::reproducible::DEFAULT_SOURCE_DATE_EPOCH`]. In the key (the wheel's times).
    pub source_date_epoch: u64,
    /// COMMSTACK_HOME, when there is one: no shipped file may name it (nor the store, the
    /// build directory or an input's real path; checked).
    pub home: Option<&'a Path>,
    /// Called with one line per phase.
    pub progress: &'a dyn Fn(&str),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvshmemFacts {
    pub prefix: PathBuf,
    pub identity: serde_json::Value,
    pub version: Option<String>,
    pub host_soname: String,
    pub use_nccl: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PythonFacts {
    pub mode: String,
    pub executable: PathBuf,
    pub version: String,
    pub torch: Option<String>,
    pub torch_cuda: Option<String>,
    pub identity: serde_json::Value,
}

/// `build-report.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildReport {
    pub schema: u32,
    pub step: String,
    pub api: String,
    pub source: SourceInput,
    pub declared_version: Option<String>,
    /// Whether csrc/kernels/configs.cuh forces RDC (V1), read from the source at build time.
    pub rdc_fix: Option<bool>,
    pub nvshmem: NvshmemFacts,
    pub nccl_root: Option<PathBuf>,
    pub rdma_core: Option<RdmaHeaders>,
    pub python: PythonFacts,
    pub toolchain: String,
    pub toolchain_identity: serde_json::Value,
    pub torch_cuda_arch_list: String,
    pub environment: BuildEnv,
    pub command: Vec<String>,
    pub jobs: usize,
    pub build_seconds: f64,
    /// Seconds of each phase of the step, in order (source, views, setup.py, canonical
    /// wheel, checks, cleanup): where a build's time goes besides setup.py (`bench
    /// deepep` prints them).
    #[serde(default)]
    pub phase_seconds: Vec<(String, f64)>,
    pub reproducibility: Reproducibility,
    pub wheel: WheelFacts,
}

/// How the build was kept independent of the machine (crate::reproducible).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reproducibility {
    /// Where setup.py ran: the same for the same key on every machine.
    pub fixed_build_dir: PathBuf,
    pub source_date_epoch: u64,
    /// The inputs as setup.py saw them: links in the fixed directory.
    pub relocated: Vec<Relocated>,
    pub prefix_maps: Vec<String>,
    pub nvcc_objtemp: bool,
    /// The linker the wrapper runs, and the rpaths it rewrites.
    pub ld: PathBuf,
    pub rpath_rewrites: Vec<RpathRewrite>,
    /// The wheel as bdist_wheel wrote it, before the canonical rewrite.
    pub bdist_wheel_sha256: String,
}

/// The result of [`build`].
#[derive(Debug)]
pub struct Built {
    pub key: StepKey,
    pub outcome: Outcome,
    pub wheel: PathBuf,
    pub report: BuildReport,
}

/// Everything decided before the step runs (cheap: also done when the step is cached).
struct Prepared {
    key: StepKey,
    inputs: serde_json::Value,
    arch_list: String,
    host_soname: String,
    nccl_root: Option<PathBuf>,
    rdma: Option<RdmaHeaders>,
    /// Include directories for the CUDA library headers the toolchain lacks.
    cuda_lib_include: Vec<PathBuf>,
}

/// The step key of `req`, after the checks that need no compiler: the NVSHMEM is built
/// without NCCL and (V1) has the unversioned link; the environment has torch for the
/// toolchain's CUDA major and a setuptools that builds wheels; (V2) one NCCL.
pub fn build_key(req: &BuildRequest<'_>) -> Result<(StepKey, serde_json::Value)> {
    let p = prepare(req)?;
    Ok((p.key, p.inputs))
}

fn prepare(req: &BuildRequest<'_>) -> Result<Prepared> {
    let arch_list = torch_cuda_arch_list(req.cuda_archs)?;
    req.nvshmem.require_nccl_off()?;
    if req.api == DeepEpApi::V1 {
        check_v1_prefix(&req.nvshmem.prefix)?;
    }
    let host_soname = req.nvshmem.host_soname()?;
    check_python(&req.python.env, req.toolchain)?;
    let nccl_root = match req.api {
        DeepEpApi::V1 => None,
        DeepEpApi::V2 => Some(match req.nccl_dropin {
            Some(dropin) => dropin.to_path_buf(),
            None => v2_nccl_root(&req.python.env, req.nccl_override, req.allow_second_nccl)?,
        }),
    };
    let rdma = rdma_core_for(req.nvshmem, req.rdma_core)?;
    let (cuda_lib_include, cuda_lib_headers) =
        cuda_library_headers(req.toolchain, &req.python.env)?;
    // Content, never paths: a path names the machine (the store, COMMSTACK_HOME), and the
    // same key must give the same bytes anywhere.
    let nccl = nccl_root.as_deref().map(nccl_identity).transpose()?;
    let inputs = serde_json::json!({
        "recipe": RECIPE,
        "cuda_library_headers": cuda_lib_headers,
        "rdma_core": rdma.as_ref().map(|r| serde_json::json!({ "system": r.system, "mlx5dv_h_sha256": r.mlx5dv_h_sha256 })),
        "api": req.api.as_str(),
        "source": { "tree_sha256": req.source.tree_sha256, "rev": req.source.rev },
        "nvshmem": { "identity": req.nvshmem.identity, "version": req.nvshmem.version() },
        "python": req.python.identity,
        "torch_cuda_arch_list": arch_list,
        "toolchain": req.toolchain.identity(),
        "nccl": nccl,
        "source_date_epoch": req.source_date_epoch,
    });
    Ok(Prepared {
        key: StepKey::new(STEP, &inputs),
        inputs,
        arch_list,
        host_soname,
        nccl_root,
        rdma,
        cuda_lib_include,
    })
}

/// What keys the NCCL a V2 build links: its header (NCCL_VERSION_CODE and the API) and
/// the library's size, not where it is.
fn nccl_identity(root: &Path) -> Result<serde_json::Value> {
    let header = root.join("include/nccl.h");
    let lib = root.join("lib/libnccl.so.2");
    Ok(serde_json::json!({
        "nccl_h_sha256": commstack_digest::sha256_file(&header)
            .with_context(|| format!("hashing {}", header.display()))?,
        "libnccl_so_2_bytes": fs::metadata(&lib)
            .with_context(|| format!("cannot read {}", lib.display()))?
            .len(),
    }))
}

/// torch must be there, for the toolchain's CUDA major; setup.py must be able to write
/// a wheel (setuptools >= 70.1 has bdist_wheel, older ones need the `wheel` package).
fn check_python(env: &PythonEnv, tc: &Toolchain) -> Result<()> {
    let python = env.python.display();
    let Some(torch) = env.torch_version() else {
        bail!(
            "{python} has no torch: DeepEP builds against the environment's torch (managed mode makes one from the lock)"
        );
    };
    let cuda_major = u64::from(tc.cuda_major());
    match env.torch_cuda() {
        Some(cuda)
            if cuda
                .parse()
                .is_ok_and(|v| rules::same_cuda_major(&v, cuda_major)) => {}
        Some(cuda) => bail!(
            "torch {torch} in {python} is built for CUDA {cuda}, the toolchain is CUDA {} ({}) [rule {}]: {}",
            tc.versions.cuda,
            tc.nvcc.display(),
            RuleId::TorchCudaMajor.as_str(),
            RuleId::TorchCudaMajor.reason()
        ),
        None => bail!(
            "torch {torch} in {python} is a CPU build (torch.version.cuda is None): DeepEP needs a CUDA torch"
        ),
    }
    let setuptools = env.dist("setuptools").map(|d| d.version.clone());
    let has_bdist_wheel = setuptools
        .as_deref()
        .and_then(|v| v.parse::<pep440_rs::Version>().ok())
        .is_some_and(|v| v >= "70.1".parse().expect("a version"))
        || env.dist("wheel").is_some();
    if !has_bdist_wheel {
        bail!(
            "{python} has setuptools {} without bdist_wheel: install setuptools >= 70.1 (torch's own pin is newer) or the `wheel` package",
            setuptools.as_deref().unwrap_or("(none)")
        );
    }
    Ok(())
}

/// The CUDA library headers torch's ATen/cuda headers include. A full CUDA toolkit has
/// them; the compiler wheels do not, and then they come from the environment's own NVIDIA
/// wheels (`nvidia/cu13/include`, or `nvidia/<lib>/include` for CUDA 12), the very
/// libraries torch loads. Returns the directories to add and, for the key, each header's
/// sha256.
pub const TORCH_CUDA_LIBRARY_HEADERS: [&str; 4] =
    ["cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h"];

fn cuda_library_headers(
    tc: &Toolchain,
    env: &PythonEnv,
) -> Result<(Vec<PathBuf>, serde_json::Value)> {
    let in_toolchain = |h: &str| tc.cuda_include_dirs.iter().any(|d| d.join(h).is_file());
    let missing: Vec<&str> = TORCH_CUDA_LIBRARY_HEADERS
        .iter()
        .copied()
        .filter(|h| !in_toolchain(h))
        .collect();
    if missing.is_empty() {
        return Ok((Vec::new(), serde_json::Value::Null));
    }
    let nvidia = env.site_packages().join("nvidia");
    let mut candidates: Vec<PathBuf> = fs::read_dir(&nvidia)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path().join("include")))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut hashes = serde_json::Map::new();
    for h in &missing {
        let Some(dir) = candidates.iter().find(|d| d.join(h).is_file()) else {
            bail!(
                "torch's ATen headers include {h}, which neither the toolchain ({}) nor the environment's NVIDIA wheels ({}) have: use a CUDA toolkit with the math libraries' headers, or an environment with torch's nvidia-* wheels",
                tc.cuda_home.display(),
                nvidia.display()
            );
        };
        let sha = commstack_digest::sha256_file(&dir.join(h))?;
        hashes.insert(h.to_string(), serde_json::Value::String(sha));
        if !dirs.contains(dir) {
            dirs.push(dir.clone());
        }
    }
    Ok((dirs, serde_json::Value::Object(hashes)))
}

/// V2 links NCCL: the environment's own (the one torch loads). Another one would put a
/// second libnccl into the process (DeepEP issue 710).
pub fn v2_nccl_root(
    env: &PythonEnv,
    override_root: Option<&Path>,
    allow_second: bool,
) -> Result<PathBuf> {
    let own = env.site_packages().join("nvidia/nccl");
    let own_ok = own.join("include/nccl.h").is_file() && own.join("lib/libnccl.so.2").is_file();
    match override_root {
        None if own_ok => Ok(own),
        None => bail!(
            "{} has no NCCL with headers ({} lacks include/nccl.h or lib/libnccl.so.2): DeepEP V2 builds against the environment's nvidia-nccl wheel",
            env.python.display(),
            own.display()
        ),
        Some(other) if own_ok && same_dir(other, &own) => Ok(own),
        Some(other) if allow_second => Ok(other.to_path_buf()),
        Some(other) => bail!(
            "DeepEP V2 would link NCCL from {} while torch loads {}: one process would hold two libnccl (or one silently replaces the other: DeepEP issue 710) [rule {}]. \
             Use the environment's one NCCL: set [nccl] version = \"{}\" in stack.toml (it replaces torch's pin), or a torch whose nvidia-nccl pin is >= {}; or allow rule {} (resolve.allow in stack.toml, or --allow-second-nccl) if you accept what it breaks",
            other.display(),
            own.display(),
            RuleId::DeepEpV2Nccl.as_str(),
            rules::DEEPEP_V2_NCCL_SUGGESTED,
            rules::DEEPEP_V2_MIN_NCCL,
            RuleId::DeepEpV2Nccl.as_str()
        ),
    }
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Build (or find) DeepEP for `req`. On failure the log and its first error lines are in
/// the error, and the step's directory is kept under `failed/`.
pub fn build(store: &Store, req: &BuildRequest<'_>, force: bool) -> Result<Built> {
    let p = prepare(req)?;
    let result = store.run(&p.key, &p.inputs, force, |dir| {
        let report = run_build(&dir.out, &dir.logs, &p, req, store.root())?;
        let path = dir.out.join(BUILD_REPORT_FILE);
        fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    });
    let outcome = match result {
        Ok(o) => o,
        Err(err) => {
            let log = CommandFailed::in_chain(&err)
                .and_then(|f| f.log.as_ref()?.file_name().map(PathBuf::from));
            return Err(match log {
                Some(name) => err.context(format!(
                    "full log: {}",
                    store.failed_path(&p.key).join("logs").join(name).display()
                )),
                None => err,
            });
        }
    };
    let report = load_report(outcome.path())?;
    Ok(Built {
        wheel: outcome.path().join("dist").join(&report.wheel.filename),
        key: p.key,
        outcome,
        report,
    })
}

pub fn load_report(step: &Path) -> Result<BuildReport> {
    commstack_store::read_json(&step.join(BUILD_REPORT_FILE), "a DeepEP build report")
}

/// The toolchain as seen in its view `deps/toolchain` (of the wheel toolchain's store
/// step, or a system CUDA's home): every path under it mapped there; the host compilers
/// (/usr/bin) stay where they are.
fn toolchain_view(
    tc: &Toolchain,
    deps: &Path,
    epoch: u64,
    relocated: &mut Vec<Relocated>,
) -> Result<Toolchain> {
    let root = match &tc.source {
        commstack_toolchain::ToolchainSource::Wheels { step, .. } => step.clone(),
        commstack_toolchain::ToolchainSource::System => tc.cuda_home.clone(),
    };
    let view = relocate(deps, "toolchain", &root, epoch)?;
    let map = |p: &PathBuf| through(&view, &root, p);
    let seen = Toolchain {
        source: tc.source.clone(),
        cuda_home: map(&tc.cuda_home),
        nvcc: map(&tc.nvcc),
        cuda_include_dirs: tc.cuda_include_dirs.iter().map(map).collect(),
        cudart_lib_dir: map(&tc.cudart_lib_dir),
        cuda_stubs_dir: tc.cuda_stubs_dir.as_ref().map(map),
        cmake: map(&tc.cmake),
        ninja: map(&tc.ninja),
        cc: map(&tc.cc),
        cxx: map(&tc.cxx),
        versions: tc.versions.clone(),
    };
    relocated.push(view);
    Ok(seen)
}

fn run_build(
    out: &Path,
    logs: &Path,
    p: &Prepared,
    req: &BuildRequest<'_>,
    store_root: &Path,
) -> Result<BuildReport> {
    // Results go to the store step; setup.py runs at a path that depends on the key only.
    let (out, logs) = (std::path::absolute(out)?, std::path::absolute(logs)?);
    let mut phases = Phases::start();
    let fixed = FixedDir::acquire(&p.key)?;
    let dirs = BuildDirs::make(fixed.path(), &out)?;
    let rdc_fix = prepare_source(req, &dirs.src, &dirs.root)?;
    phases.end("source");
    let views = Views::make(p, req, &dirs)?;
    let link = LinkSetup::make(p, req, &views, &dirs.root)?;
    phases.end("views");
    let run = run_setup_py(p, req, &views, &link, &dirs, &logs);
    // torch's build_ext compiles through ninja (build/temp.*/.ninja_log): its jobs' times
    // are kept with the logs, also after a failure.
    commstack_exec::logged::keep_ninja_logs(&dirs.src.join("build"), &logs);
    let run = run?;
    phases.end("setup.py bdist_wheel");
    let (raw, facts) = ship_output(p, req, &views, &dirs, store_root)?;
    let declared = declared_version(&dirs.src);
    let bdist_wheel_sha256 = commstack_digest::sha256_file(&raw)?;
    phases.end("canonical wheel and checks");
    drop(fixed);
    phases.end("cleanup");
    Ok(BuildReport {
        schema: 2,
        step: p.key.dir_name(),
        api: req.api.as_str().into(),
        source: req.source.clone(),
        declared_version: declared,
        rdc_fix,
        nvshmem: NvshmemFacts {
            prefix: req.nvshmem.prefix.clone(),
            identity: req.nvshmem.identity.clone(),
            version: req.nvshmem.version(),
            host_soname: p.host_soname.clone(),
            use_nccl: req.nvshmem.host.build_vars.use_nccl(),
        },
        nccl_root: p.nccl_root.clone(),
        rdma_core: p.rdma.clone(),
        python: python_facts(req),
        toolchain: req.toolchain.describe(),
        toolchain_identity: req.toolchain.identity(),
        torch_cuda_arch_list: p.arch_list.clone(),
        environment: run.env,
        command: std::iter::once(views.python.display().to_string())
            .chain(run.args)
            .collect(),
        jobs: req.jobs,
        build_seconds: run.seconds,
        phase_seconds: phases.done,
        reproducibility: Reproducibility {
            fixed_build_dir: dirs.root,
            source_date_epoch: req.source_date_epoch,
            relocated: views.relocated,
            prefix_maps: views.maps,
            nvcc_objtemp: link.objtemp,
            ld: link.ld,
            rpath_rewrites: link.rewrites,
            bdist_wheel_sha256,
        },
        wheel: facts,
    })
}

/// The seconds of each phase of a build, as they end.
struct Phases {
    at: std::time::Instant,
    done: Vec<(String, f64)>,
}

impl Phases {
    fn start() -> Phases {
        Phases {
            at: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    fn end(&mut self, name: &str) {
        let now = std::time::Instant::now();
        self.done
            .push((name.to_string(), (now - self.at).as_secs_f64()));
        self.at = now;
    }
}

/// The directories of one build: under the fixed directory `root` (the same for the same
/// key), and the step's `dist/`.
struct BuildDirs {
    root: PathBuf,
    src: PathBuf,
    home: PathBuf,
    tmp: PathBuf,
    raw_dist: PathBuf,
    deps: PathBuf,
    dist: PathBuf,
}

impl BuildDirs {
    fn make(root: &Path, out: &Path) -> Result<BuildDirs> {
        let dirs = BuildDirs {
            root: root.to_path_buf(),
            src: root.join("src"),
            home: root.join("home"),
            tmp: root.join("tmp"),
            raw_dist: root.join("dist"),
            deps: root.join("deps"),
            dist: out.join("dist"),
        };
        for d in [
            &dirs.home,
            &dirs.tmp,
            &dirs.raw_dist,
            &dirs.deps,
            &dirs.dist,
        ] {
            fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        Ok(dirs)
    }
}

/// The source copied into `src` (in the fixed directory `root`), of the API the stack
/// says; for V1, whether it has the RDC fix (an error when it is needed and absent).
fn prepare_source(req: &BuildRequest<'_>, src: &Path, root: &Path) -> Result<Option<bool>> {
    (req.progress)(&format!(
        "preparing the source {} in {} ...",
        req.source.path.display(),
        root.display()
    ));
    req.source.materialize(src)?;
    let found = detect_api(src)?;
    if found != req.api {
        bail!(
            "the source {} (tree {}) is DeepEP {}, the stack says deepep.api = {:?}",
            req.source.path.display(),
            req.source.tree_sha256,
            found.as_str(),
            req.api.as_str()
        );
    }
    Ok(match req.api {
        DeepEpApi::V1 => Some(check_rdc_fix(
            src,
            req.nvshmem.version().as_deref(),
            req.allow_missing_rdc_fix,
        )?),
        DeepEpApi::V2 => None,
    })
}

/// Every input through a view in the fixed directory (crate::reproducible): the paths
/// the compilers see, and the times of the headers they read, are the same for the same
/// key on any machine.
struct Views {
    relocated: Vec<Relocated>,
    nvshmem: Relocated,
    /// The toolchain as seen through its view.
    tc: Toolchain,
    /// The venv's view (deps/python), None for an interpreter's own prefix.
    python_link: Option<Relocated>,
    /// The interpreter setup.py runs with, through its view.
    python: PathBuf,
    nccl_root: Option<PathBuf>,
    extra_include: Vec<(PathBuf, String)>,
    maps: Vec<String>,
}

impl Views {
    fn make(p: &Prepared, req: &BuildRequest<'_>, dirs: &BuildDirs) -> Result<Views> {
        // The source copy gets the same times as the views' headers.
        let (deps, epoch) = (&dirs.deps, req.source_date_epoch);
        set_times(&dirs.src, epoch)?;
        let mut relocated: Vec<Relocated> = Vec::new();
        let nvshmem = relocate(deps, "nvshmem", &req.nvshmem.prefix, epoch)?;
        relocated.push(nvshmem.clone());
        let tc = toolchain_view(req.toolchain, deps, epoch, &mut relocated)?;
        let py = &req.python.env;
        // A venv is seen through deps/python (its python finds pyvenv.cfg there, so
        // sys.prefix, torch's include path, site-packages are all under it); an
        // interpreter's own prefix (/usr) is the same on every machine of its kind.
        let python_link = if py.prefix != py.base_prefix && py.python.starts_with(&py.prefix) {
            let r = relocate(deps, "python", &py.prefix, epoch)?;
            relocated.push(r.clone());
            Some(r)
        } else {
            None
        };
        let mut views = Views {
            relocated,
            nvshmem,
            tc,
            python_link,
            python: PathBuf::new(),
            nccl_root: None,
            extra_include: Vec::new(),
            maps: Vec::new(),
        };
        views.python = views.py_path(req, &py.python);
        views.nccl_root = match &p.nccl_root {
            Some(n) if views.py_path(req, n) != *n => Some(views.py_path(req, n)),
            Some(n) => {
                let r = relocate(deps, "nccl", n, epoch)?;
                views.relocated.push(r.clone());
                Some(r.link)
            }
            None => None,
        };
        if let Some(r) = p.rdma.as_ref().filter(|r| !r.system) {
            let view = relocate(deps, "rdma-core", &r.include_dir, epoch)?;
            views.relocated.push(view.clone());
            views.extra_include.push((
                view.link,
                "NVSHMEM's IBGDA headers include infiniband/mlx5dv.h".into(),
            ));
        }
        for dir in &p.cuda_lib_include {
            views.extra_include.push((views.py_path(req, dir), "torch's ATen headers include the CUDA library headers (cusparse.h, cublas_v2.h, ...) the toolchain lacks: the environment's NVIDIA wheels".into()));
        }
        views.maps = prefix_maps(&dirs.src, &views.relocated);
        Ok(views)
    }

    /// `path` of the Python environment, as seen through its view.
    fn py_path(&self, req: &BuildRequest<'_>, path: &Path) -> PathBuf {
        match &self.python_link {
            Some(r) => through(r, &req.python.env.prefix, path),
            None => path.to_path_buf(),
        }
    }
}

/// The linker wrapper that rewrites the build's rpaths to the drop-in wheels' places.
struct LinkSetup {
    ld: PathBuf,
    ld_dir: PathBuf,
    rewrites: Vec<RpathRewrite>,
    objtemp: bool,
}

impl LinkSetup {
    fn make(p: &Prepared, req: &BuildRequest<'_>, v: &Views, root: &Path) -> Result<LinkSetup> {
        // The extension finds the drop-in wheels relative to itself: V1's deep_ep_cpp sits
        // at site-packages' top, V2's deep_ep/_C one level down.
        let up = match req.api {
            DeepEpApi::V1 => "",
            DeepEpApi::V2 => "../",
        };
        let mut rewrites: Vec<RpathRewrite> = [&v.nvshmem.link, &v.nvshmem.target]
            .into_iter()
            .map(|prefix| RpathRewrite {
                from: prefix.join("lib").display().to_string(),
                to: format!("$ORIGIN/{up}nvidia/nvshmem/lib"),
            })
            .collect();
        // The environment's NCCL, or the drop-in adopt puts in its place: either way the
        // extension finds it where the environment keeps NCCL.
        if let (Some(seen), Some(real)) = (&v.nccl_root, &p.nccl_root)
            && (v.py_path(req, real) == *seen || req.nccl_dropin.is_some())
        {
            for root in [seen, real] {
                rewrites.push(RpathRewrite {
                    from: root.join("lib").display().to_string(),
                    to: format!("$ORIGIN/{up}nvidia/nccl/lib"),
                });
            }
        }
        let mut search: Vec<PathBuf> = vec![PathBuf::from("/usr/bin"), PathBuf::from("/bin")];
        search.extend(v.tc.bin_dirs());
        let ld = real_ld(&v.tc.cc, &search)?;
        let ld_dir = root.join("ld");
        write_ld_wrapper(&ld_dir, &ld, &rewrites)?;
        Ok(LinkSetup {
            ld,
            ld_dir,
            rewrites,
            objtemp: nvcc_has_objtemp(&v.tc.nvcc),
        })
    }
}

/// What setup.py ran with, and how long it took.
struct SetupPyRun {
    env: BuildEnv,
    args: Vec<String>,
    seconds: f64,
}

/// `setup.py bdist_wheel` in the source copy, with exactly the build environment, its
/// output in `logs/build.log`.
fn run_setup_py(
    p: &Prepared,
    req: &BuildRequest<'_>,
    v: &Views,
    link: &LinkSetup,
    dirs: &BuildDirs,
    logs: &Path,
) -> Result<SetupPyRun> {
    let mut env = build_env(&EnvInputs {
        api: req.api,
        python_bin_dir: &v.py_path(req, &req.python.env.bin_dir()),
        toolchain: &v.tc,
        nvshmem_prefix: &v.nvshmem.link,
        nccl_root: v.nccl_root.as_deref(),
        extra_include: &v.extra_include,
        torch_cuda_arch_list: &p.arch_list,
        jobs: req.jobs,
        home: &dirs.home,
        tmp: &dirs.tmp,
        git_ceiling: &dirs.root,
        prefix_maps: &v.maps,
        nvcc_objtemp: link.objtemp,
        ld_wrapper_dir: Some(&link.ld_dir),
        source_date_epoch: req.source_date_epoch,
    })?;
    crate::schedule::install_ninja_front(&mut env, &dirs.root, &v.python)?;
    let args: Vec<String> = vec![
        "setup.py".into(),
        "bdist_wheel".into(),
        "--dist-dir".into(),
        dirs.raw_dist.display().to_string(),
    ];
    let log = logs.join("build.log");
    (req.progress)(&format!(
        "building (setup.py bdist_wheel, MAX_JOBS={}); log: {}",
        req.jobs,
        log.display()
    ));
    let seconds = run_logged(
        &v.python,
        &args,
        &dirs.src,
        &env.vars,
        &log,
        "setup.py bdist_wheel",
        Some(req.progress),
    )?;
    Ok(SetupPyRun { env, args, seconds })
}

/// The one wheel bdist_wheel left (its path and bytes' sha256), rewritten canonically
/// into `dist` (with the build record for V1: bdist_wheel's zip keeps the umask's modes
/// and its own order) while the same bytes are checked: what it links, its search paths,
/// no path of this machine.
fn ship_output(
    p: &Prepared,
    req: &BuildRequest<'_>,
    v: &Views,
    dirs: &BuildDirs,
    store_root: &Path,
) -> Result<(PathBuf, WheelFacts)> {
    let wheels: Vec<PathBuf> = fs::read_dir(&dirs.raw_dist)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"))
        .collect();
    let [raw] = &wheels[..] else {
        bail!(
            "setup.py bdist_wheel left {} wheel(s) in {}, expected one (see logs/build.log)",
            wheels.len(),
            dirs.raw_dist.display()
        );
    };
    let extra = build_record(p, req)?;
    let extra_refs: Vec<(&str, &[u8])> = extra.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    let wheel = dirs
        .dist
        .join(raw.file_name().context("a wheel file name")?);
    let raw_wheel = Wheel::open(raw)?;
    // One inflate of the wheel: the rewrite compresses these bytes on one thread while
    // the checks read the same bytes on this one (in series they were 2.7 s of 75).
    let files = raw_wheel
        .read_verified()
        .with_context(|| format!("{} does not verify before it is rewritten", raw.display()))?;
    let expect = expectations(p, req, v, dirs, store_root);
    let dist_prefix = format!("{}/", raw_wheel.dist_info);
    let extra_paths: Vec<String> = extra_refs
        .iter()
        .map(|(n, _)| format!("{dist_prefix}{n}"))
        .collect();
    let epoch = req.source_date_epoch;
    let (written, content) = std::thread::scope(|scope| {
        let writer =
            scope.spawn(|| write_canonical(&raw_wheel, &files, &wheel, epoch, &extra_refs));
        // What ships: bdist_wheel's files (RECORD vouched for them) and the build record.
        let mut shipped = crate::reproducible::refs(&files);
        shipped.extend(
            extra_paths
                .iter()
                .zip(&extra_refs)
                .map(|(path, (_, bytes))| (path.as_str(), *bytes)),
        );
        let content = check_contents(&wheel, &shipped, &expect.expect(), &dirs.tmp);
        let written = writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (written, content)
    });
    // A failed check says more about the build than a failed rewrite: it goes first.
    let content = content?;
    let written = written?;
    let expect = expect.expect();
    let facts = wheel_facts(&wheel, &raw_wheel, written, content, &expect)?;
    for k in &facts.build_paths_kept {
        (req.progress)(&format!(
            "note: {} keeps {} ({}x): {}",
            k.file, k.path, k.count, k.why
        ));
    }
    Ok((raw.clone(), facts))
}

/// V1's build record (`deep_ep-*.dist-info/commstack-build.json`): the NVSHMEM the
/// extension's device code was linked with.
fn build_record(p: &Prepared, req: &BuildRequest<'_>) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let mut extra: Vec<(&str, Vec<u8>)> = Vec::new();
    if req.api == DeepEpApi::V1 {
        let device = req.nvshmem.prefix.join("lib/libnvshmem_device.a");
        let record = serde_json::json!({
            "nvshmem": {
                "version": req.nvshmem.version(),
                "device_library_sha256": commstack_digest::sha256_file(&device)
                    .with_context(|| format!("hashing {}", device.display()))?,
                "host_soname": p.host_soname,
                "use_nccl": req.nvshmem.host.build_vars.use_nccl(),
            }
        });
        extra.push((
            BUILD_RECORD_FILE,
            (commstack_digest::canonical_json(&record) + "\n").into_bytes(),
        ));
    }
    Ok(extra)
}

/// What the wheel must (not) hold, owned: the data [`Expect`] borrows.
struct Expectations<'a> {
    api: DeepEpApi,
    needed: Vec<String>,
    stubs: Vec<&'a Path>,
    required_runpath: Vec<String>,
    forbidden: Vec<String>,
    fixed_dir: &'a Path,
}

impl Expectations<'_> {
    fn expect(&self) -> Expect<'_> {
        Expect {
            api: self.api,
            needed: &self.needed,
            forbidden_search_dirs: &self.stubs,
            required_runpath: &self.required_runpath,
            forbidden_paths: &self.forbidden,
            fixed_dir: Some(self.fixed_dir),
        }
    }
}

fn expectations<'a>(
    p: &Prepared,
    req: &'a BuildRequest<'_>,
    v: &'a Views,
    dirs: &'a BuildDirs,
    store_root: &Path,
) -> Expectations<'a> {
    // V2 (dd758ca) still builds the legacy kernels on NVSHMEM: it links both.
    let needed = match req.api {
        DeepEpApi::V1 => vec![p.host_soname.clone()],
        DeepEpApi::V2 => vec![p.host_soname.clone(), "libnccl.so.2".to_string()],
    };
    let stubs: Vec<&Path> = [
        req.toolchain.cuda_stubs_dir.as_deref(),
        v.tc.cuda_stubs_dir.as_deref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    // Paths that differ between machines: never in a shipped file. Paths under the fixed
    // build root are the same for the same key; the checks tell them apart.
    let mut forbidden: Vec<&Path> = vec![store_root, &req.source.path, &req.nvshmem.prefix];
    forbidden.extend(req.home);
    forbidden.extend(v.relocated.iter().map(|r| r.target.as_path()));
    let required_runpath = match req.api {
        DeepEpApi::V1 => vec!["$ORIGIN/nvidia/nvshmem/lib".to_string()],
        DeepEpApi::V2 => vec!["$ORIGIN/../nvidia/nvshmem/lib".to_string()],
    };
    Expectations {
        api: req.api,
        needed,
        stubs,
        required_runpath,
        forbidden: needles(&forbidden),
        fixed_dir: &dirs.root,
    }
}

fn python_facts(req: &BuildRequest<'_>) -> PythonFacts {
    let py = &req.python.env;
    PythonFacts {
        mode: req.python.mode.clone(),
        executable: py.python.clone(),
        version: py.version.clone(),
        torch: py.torch_version().map(str::to_string),
        torch_cuda: py.torch_cuda().map(str::to_string),
        identity: req.python.identity.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::python::Paths;

    fn env_with_nccl(site: &Path) -> PythonEnv {
        let nccl = site.join("nvidia/nccl");
        fs::create_dir_all(nccl.join("include")).unwrap();
        fs::create_dir_all(nccl.join("lib")).unwrap();
        fs::write(nccl.join("include/nccl.h"), "#define NCCL_MAJOR 2\n").unwrap();
        fs::write(nccl.join("lib/libnccl.so.2"), "").unwrap();
        PythonEnv {
            schema: 1,
            python: PathBuf::from("/env/bin/python"),
            executable: PathBuf::from("/env/bin/python"),
            version: "3.12.3".into(),
            implementation: "cpython".into(),
            prefix: PathBuf::from("/env"),
            base_prefix: PathBuf::from("/usr"),
            sys_path: vec![site.to_path_buf()],
            paths: Paths {
                purelib: site.to_path_buf(),
                platlib: site.to_path_buf(),
                scripts: PathBuf::from("/env/bin"),
                data: PathBuf::from("/env"),
                include: PathBuf::from("/env/include"),
            },
            dists: vec![],
            torch: None,
            pip: false,
        }
    }

    #[test]
    fn v2_builds_against_the_environments_nccl_and_refuses_a_second_one() {
        let d = tempfile::tempdir().unwrap();
        let env = env_with_nccl(d.path());
        let own = d.path().join("nvidia/nccl");
        assert_eq!(v2_nccl_root(&env, None, false).unwrap(), own);
        assert_eq!(v2_nccl_root(&env, Some(&own), false).unwrap(), own);
        let other = d.path().join("nccl-2.30.7");
        fs::create_dir_all(&other).unwrap();
        let err = v2_nccl_root(&env, Some(&other), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("two libnccl")
                && err.contains("issue 710")
                && err.contains("set [nccl] version = \"2.30.7\""),
            "{err}"
        );
        assert_eq!(v2_nccl_root(&env, Some(&other), true).unwrap(), other);
        let bare = env_with_nccl(&d.path().join("empty"));
        fs::remove_file(d.path().join("empty/nvidia/nccl/include/nccl.h")).unwrap();
        assert!(
            v2_nccl_root(&bare, None, false)
                .unwrap_err()
                .to_string()
                .contains("include/nccl.h")
        );
    }
}
