//! The NVSHMEM build step: hermetic CMake + Ninja, installed with DESTDIR, proven, kept
//! in the step store.
//!
//! Step layout (`<store>/steps/nvshmem-<hash>/`):
//! ```text
//! nvshmem/              the install, built for prefix /opt/commstack/nvshmem,
//!                       relocatable (RUNPATH $ORIGIN): lib/ and include/ as in NVIDIA's
//!                       wheel (see [`crate::wheelset`]), or with nvshmem.static-lib
//!                       everything NVSHMEM's own install rules put there
//! logs/                 configure.log, build.log, install.log (static-lib only)
//! build-report.json     inputs, command line, environment, timings and the proof
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_exec::CommandFailed;
use commstack_store::{FixedDir, Outcome, StepKey, Store};
use commstack_toolchain::Toolchain;
use serde::{Deserialize, Serialize};
use xshell::{Shell, cmd};

use crate::cmake::{INSTALL_PREFIX, RdmaCore, build_env_extra, cmake_defines, find_rdma_core};
use crate::env::hermetic_env;
use crate::options::NvshmemOptions;
use crate::proof::{Expected, Proof, prove};
use crate::source::{copy_tree, source_version};
use crate::wheelset::{self, Selection};

pub const STEP: &str = "nvshmem";
pub const INSTALL_DIR: &str = "nvshmem";
pub const REPORT_FILE: &str = "build-report.json";
/// Bumped when the recipe changes what it produces.
pub const RECIPE: &str = "nvshmem-cmake-5";

/// Everything one build needs; the lead fills it from stack.lock and the fetch cache.
pub struct BuildRequest<'a> {
    /// An unpacked NVSHMEM source tree (never written to: the build uses a copy).
    pub source_dir: &'a Path,
    /// The tree hash of `source_dir` (commstack_fetch::tree), as locked.
    pub source_tree_sha256: &'a str,
    pub options: &'a NvshmemOptions,
    pub toolchain: &'a Toolchain,
    /// The Python NVSHMEM's CMake insists on finding (its Python library stays off).
    pub python3: PathBuf,
    /// Variables kept from the caller's environment (see [`crate::env::resolve_passthrough`]).
    pub passthrough: BTreeMap<String, String>,
    /// Parallel compile jobs (does not change the output, so not in the key).
    pub jobs: usize,
    /// Called with one line per phase ("configuring ...").
    pub progress: &'a dyn Fn(&str),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    pub dir: PathBuf,
    pub tree_sha256: String,
    pub version: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    pub configure_s: f64,
    pub build_s: f64,
    pub install_s: f64,
}

/// `build-report.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildReport {
    pub schema: u32,
    pub step: String,
    pub source: SourceInfo,
    /// One line: "PyPI wheels: nvcc 13.0.88 ..." or "system: ...".
    pub toolchain: String,
    pub toolchain_identity: serde_json::Value,
    pub options: NvshmemOptions,
    pub rdma_core: Option<RdmaCore>,
    pub install_prefix: String,
    /// Every `-D` given to CMake, in order.
    pub cmake_defines: Vec<(String, String)>,
    /// The whole environment of the build commands.
    pub environment: BTreeMap<String, String>,
    pub jobs: usize,
    pub timings: Timings,
    /// What ninja built and what it left out, unless the stack asked for the static
    /// library (then: NVSHMEM's whole `all` and its own install rules).
    #[serde(default)]
    pub selection: Option<Selection>,
    pub proof: Proof,
}

/// The result of [`build`].
#[derive(Debug)]
pub struct Built {
    pub key: StepKey,
    pub outcome: Outcome,
    /// The install directory (`<step>/nvshmem`).
    pub prefix: PathBuf,
    pub report: BuildReport,
}

/// What keys the step: the source tree, every option, the toolchain identity, rdma-core,
/// the passthrough environment, the recipe version.
pub fn build_key(
    req: &BuildRequest<'_>,
) -> Result<(StepKey, serde_json::Value, Option<RdmaCore>, String)> {
    req.options.validate()?;
    let version = source_version(req.source_dir)?;
    let rdma = if req.options.needs_rdma_core() {
        Some(find_rdma_core(
            req.options.rdma_core.as_deref().unwrap_or(Path::new("/")),
        )?)
    } else {
        None
    };
    let inputs = serde_json::json!({
        "recipe": RECIPE,
        "source": { "tree_sha256": req.source_tree_sha256, "version": version },
        "options": req.options,
        "toolchain": req.toolchain.identity(),
        "rdma_core": rdma.as_ref().map(|r| serde_json::json!({ "prefix": r.prefix, "mlx5dv_h_sha256": r.mlx5dv_h_sha256 })),
        "passthrough": req.passthrough,
        "install_prefix": INSTALL_PREFIX,
        "schedule_hook_sha256": (!req.options.static_lib)
            .then(|| hex::encode(<sha2::Sha256 as sha2::Digest>::digest(wheelset::SCHEDULE_HOOK))),
    });
    Ok((StepKey::new(STEP, &inputs), inputs, rdma, version))
}

/// Build (or find) NVSHMEM for `req`. A failed command's log and first error lines are
/// in the error; a build whose proof fails is not kept as a result.
pub fn build(store: &Store, req: &BuildRequest<'_>, force: bool) -> Result<Built> {
    let (key, inputs, rdma, version) = build_key(req)?;
    let result = store.run(&key, &inputs, force, |dir| {
        let report = run_build(&dir.out, &dir.logs, &key, req, rdma.as_ref(), &version)?;
        let path = dir.out.join(REPORT_FILE);
        fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        if !report.proof.passed() {
            bail!(
                "the NVSHMEM build is not what was asked ({} failed check(s)):\n  {}",
                report.proof.failures.len(),
                report.proof.failures.join("\n  ")
            );
        }
        Ok(())
    });
    let outcome = match result {
        Ok(o) => o,
        Err(err) => {
            // The log moved with the failed step: point at where it is now.
            let log = CommandFailed::in_chain(&err)
                .and_then(|f| f.log.as_ref()?.file_name().map(PathBuf::from));
            return Err(match log {
                Some(name) => err.context(format!(
                    "full log: {}",
                    store.failed_path(&key).join("logs").join(name).display()
                )),
                None => err,
            });
        }
    };
    let report = load_report(outcome.path())?;
    Ok(Built {
        prefix: outcome.path().join(INSTALL_DIR),
        key,
        outcome,
        report,
    })
}

pub fn load_report(step_dir: &Path) -> Result<BuildReport> {
    commstack_store::read_json(&step_dir.join(REPORT_FILE), "an NVSHMEM build report")
}

/// A configured build tree in `work/` (source copy, build dir, environment).
struct Configured {
    /// The toolchain as the build sees it (through `work/toolchain`).
    toolchain: Toolchain,
    build: PathBuf,
    destdir: PathBuf,
    defines: Vec<(String, String)>,
    env: BTreeMap<String, String>,
    configure_s: f64,
    /// Target dependencies the schedule hook dropped.
    dropped: Vec<String>,
}

/// Copy the source into `work/src` and run CMake's configure step in `work/build`.
fn configure_in(
    work: &Path,
    logs: &Path,
    req: &BuildRequest<'_>,
    rdma: Option<&RdmaCore>,
) -> Result<Configured> {
    let (src, build, home, tmp, destdir) = (
        work.join("src"),
        work.join("build"),
        work.join("home"),
        work.join("tmp"),
        work.join("destdir"),
    );
    for d in [&build, &home, &tmp, &destdir, &logs.to_path_buf()] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    (req.progress)(&format!(
        "copying the source {} ...",
        req.source_dir.display()
    ));
    copy_tree(req.source_dir, &src)?;
    // NVSHMEM's git_commit target keeps an existing git_commit.txt: record the tree
    // instead of letting it look for a repository.
    if !src.join("git_commit.txt").exists() {
        fs::write(
            src.join("git_commit.txt"),
            format!("commstack source tree {}\n", req.source_tree_sha256),
        )?;
    }

    // The build-variable string embeds CUDA_HOME: seen through a link in `work`, it is
    // the same path wherever the toolchain's store step is.
    let toolchain = req
        .toolchain
        .relocated(&work.join("toolchain"))
        .with_context(|| format!("cannot link the toolchain into {}", work.display()))?;
    let mut defines = cmake_defines(req.options, &toolchain, &req.python3, &src, rdma)?;
    if !req.options.static_lib {
        let hook = work.join("commstack-schedule.cmake");
        fs::write(&hook, wheelset::SCHEDULE_HOOK)
            .with_context(|| format!("cannot write {}", hook.display()))?;
        defines.push(("CMAKE_PROJECT_INCLUDE".into(), hook.display().to_string()));
    }
    let mut tool_dirs = toolchain.bin_dirs();
    if let Some(llvm) = &req.options.bitcode_llvm {
        // NVSHMEM's bitcode rule calls bare `clang`, `opt`, `llvm-dis`, `llvm-as`.
        tool_dirs.insert(0, llvm.join("bin"));
    }
    let env = hermetic_env(
        &tool_dirs,
        &home,
        &tmp,
        work,
        &build_env_extra(rdma),
        &req.passthrough,
    );
    let sh = Shell::new()?;
    sh.change_dir(work);
    let cmake = &toolchain.cmake;
    let d_args: Vec<String> = defines.iter().map(|(k, v)| format!("-D{k}={v}")).collect();
    (req.progress)("configuring (cmake) ...");
    let configure_s = run_logged(
        cmd!(
            sh,
            "{cmake} -G Ninja -S {src} -B {build} --no-warn-unused-cli {d_args...}"
        )
        .env_clear()
        .envs(&env),
        &logs.join("configure.log"),
        "cmake configure",
    )?;
    let log = fs::read_to_string(logs.join("configure.log")).unwrap_or_default();
    Ok(Configured {
        toolchain,
        build,
        destdir,
        defines,
        env,
        configure_s,
        dropped: wheelset::dropped_dependencies(&log),
    })
}

/// Only the configure step, in `work` (not the store): proves the option mapping against
/// a real NVSHMEM CMakeLists in seconds. Returns the NVSHMEM_* and *_HOME values of the
/// resulting CMakeCache.txt.
pub fn configure_only(req: &BuildRequest<'_>, work: &Path) -> Result<BTreeMap<String, String>> {
    req.options.validate()?;
    let rdma = if req.options.needs_rdma_core() {
        Some(find_rdma_core(
            req.options.rdma_core.as_deref().unwrap_or(Path::new("/")),
        )?)
    } else {
        None
    };
    let c = configure_in(work, &work.join("logs"), req, rdma.as_ref())?;
    let cache = fs::read_to_string(c.build.join("CMakeCache.txt"))?;
    let re = regex::Regex::new(
        r"(?m)^((?:NVSHMEM_\w+|\w+_HOME|CMAKE_CUDA_ARCHITECTURES|CMAKE_INSTALL_PREFIX)):\w+=(.*)$",
    )
    .expect("valid regex");
    Ok(re
        .captures_iter(&cache)
        .map(|c| (c[1].to_string(), c[2].to_string()))
        .collect())
}

fn run_build(
    out: &Path,
    logs: &Path,
    key: &StepKey,
    req: &BuildRequest<'_>,
    rdma: Option<&RdmaCore>,
    version: &str,
) -> Result<BuildReport> {
    // nvcc hashes each source file's absolute path into the module ids of relocatable
    // device code: the build runs at a path that depends on the step key only.
    let fixed = FixedDir::acquire(key)?;
    let work = fixed.path().to_path_buf();
    (req.progress)(&format!("building in {}", work.display()));
    let configured = configure_in(&work, logs, req, rdma)?;
    let sh = Shell::new()?;
    sh.change_dir(&work);
    let mut timings = Timings {
        configure_s: configured.configure_s,
        ..Default::default()
    };
    // The default asks ninja for the wheel's set; static-lib builds NVSHMEM's `all`.
    let selection = if req.options.static_lib {
        None
    } else {
        Some(select_targets(&sh, &configured, req)?)
    };
    timings.build_s = ninja_build(&sh, &configured, selection.as_ref(), logs, req)?;
    let prefix = out.join(INSTALL_DIR);
    timings.install_s = install(
        &sh,
        &configured,
        &work,
        selection.as_ref(),
        &prefix,
        logs,
        req,
    )?;
    drop(fixed);
    let Configured { defines, env, .. } = configured;
    let proof = prove_install(&prefix, &defines, req, version)?;
    Ok(BuildReport {
        schema: 1,
        step: key.dir_name(),
        source: SourceInfo {
            dir: req.source_dir.to_path_buf(),
            tree_sha256: req.source_tree_sha256.to_string(),
            version: version.to_string(),
        },
        toolchain: req.toolchain.describe(),
        toolchain_identity: req.toolchain.identity(),
        options: req.options.clone(),
        rdma_core: rdma.cloned(),
        install_prefix: INSTALL_PREFIX.to_string(),
        cmake_defines: defines,
        environment: env,
        jobs: req.jobs,
        timings,
        selection,
        proof,
    })
}

/// The wheel's set of ninja targets, asked of ninja (`-t query`), with what the schedule
/// hook dropped.
fn select_targets(sh: &Shell, c: &Configured, req: &BuildRequest<'_>) -> Result<Selection> {
    let (ninja, build, env) = (&c.toolchain.ninja, &c.build, &c.env);
    let mut selection = wheelset::select(|target| {
        let text = cmd!(sh, "{ninja} -C {build} -t query {target}")
            .env_clear()
            .envs(env)
            .quiet()
            .read()
            .with_context(|| format!("`ninja -t query {target}` failed in {}", build.display()))?;
        Ok(text)
    })?;
    if c.dropped.is_empty() {
        (req.progress)(
            "note: the schedule hook dropped nothing (this NVSHMEM does not make nvshmem_host wait \
             for nvshmem_device_project-build): the build is correct, only not faster",
        );
    }
    selection.dropped_dependencies = c.dropped.clone();
    selection.schedule_hook_sha256 = Some(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        wheelset::SCHEDULE_HOOK,
    )));
    Ok(selection)
}

/// ninja over `selection`'s targets (everything without one), its output in
/// `logs/build.log`; its .ninja_logs kept, also after a failure. Returns seconds taken.
fn ninja_build(
    sh: &Shell,
    c: &Configured,
    selection: Option<&Selection>,
    logs: &Path,
    req: &BuildRequest<'_>,
) -> Result<f64> {
    let (ninja, build, env) = (&c.toolchain.ninja, &c.build, &c.env);
    let jobs = req.jobs.max(1).to_string();
    let targets: &[String] = selection.map_or(&[], |s| &s.targets);
    let what = match selection {
        Some(s) => format!(
            "{} targets, leaving out {}",
            s.targets.len(),
            s.left_out.join(", ")
        ),
        None => "everything, the static library too".to_string(),
    };
    (req.progress)(&format!(
        "building {what} (ninja -j {jobs}); log: {}",
        logs.join("build.log").display()
    ));
    let ninja_cmd = cmd!(sh, "{ninja} -C {build} -j {jobs} {targets...}")
        .env_clear()
        .envs(env);
    let shown = ninja_cmd.to_string();
    let built = commstack_exec::run_logged_with_progress(
        ninja_cmd.into(),
        &format!("$ {shown}\n"),
        &logs.join("build.log"),
        "ninja build",
        Some(req.progress),
    );
    // NVSHMEM's device library is a nested project with a .ninja_log of its own.
    commstack_exec::logged::keep_ninja_logs(build, logs);
    built
}

/// The build installed into `prefix`: the wheel's set copied out of the build tree, or
/// (static-lib) `cmake --install` into a DESTDIR. Returns seconds taken.
fn install(
    sh: &Shell,
    c: &Configured,
    work: &Path,
    selection: Option<&Selection>,
    prefix: &Path,
    logs: &Path,
    req: &BuildRequest<'_>,
) -> Result<f64> {
    let (cmake, build, env, destdir) = (&c.toolchain.cmake, &c.build, &c.env, &c.destdir);
    if let Some(selection) = selection {
        (req.progress)("installing lib/ and include/ ...");
        let started = std::time::Instant::now();
        wheelset::install(build, &work.join("src"), selection, prefix)?;
        Ok(started.elapsed().as_secs_f64())
    } else {
        (req.progress)("installing (cmake --install) ...");
        let seconds = run_logged(
            cmd!(sh, "{cmake} --install {build}")
                .env_clear()
                .envs(env)
                .env("DESTDIR", destdir),
            &logs.join("install.log"),
            "cmake --install",
        )?;
        let installed = destdir.join(INSTALL_PREFIX.trim_start_matches('/'));
        // Across filesystems (the fixed directory and the store): copy, not rename.
        if !installed.is_dir() {
            bail!(
                "the install left nothing at {} (see logs/install.log)",
                installed.display()
            );
        }
        copy_tree(&installed, prefix)?;
        wheelset::set_modes(prefix)?;
        Ok(seconds)
    }
}

/// The install proven from its ELF files: the build variables the defines asked for,
/// the SASS archs, the source's version.
fn prove_install(
    prefix: &Path,
    defines: &[(String, String)],
    req: &BuildRequest<'_>,
    version: &str,
) -> Result<Proof> {
    let expected_vars: BTreeMap<String, String> = defines
        .iter()
        .filter(|(k, _)| k.starts_with("NVSHMEM_") || k.ends_with("_HOME"))
        .cloned()
        .collect();
    let sass = req.options.sass_archs();
    prove(
        prefix,
        &Expected {
            vars: &expected_vars,
            sass_archs: &sass,
            source_version: version,
        },
    )
}

/// Run an xshell command with its output in `log` (the command line first): see
/// [`commstack_exec::run_logged`]. Returns seconds taken.
fn run_logged(cmd: xshell::Cmd<'_>, log: &Path, what: &str) -> Result<f64> {
    let shown = cmd.to_string();
    commstack_exec::run_logged(cmd.into(), &format!("$ {shown}\n"), log, what)
}
