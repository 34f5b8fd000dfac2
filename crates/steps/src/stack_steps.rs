//! The stack's own steps: what keys each one (from [`Settings`] and probes of this
//! machine) and the crate function each one calls.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_deepep::{LockedWheel, NvshmemInput, WheelhouseKind};
use commstack_fetch::Artifact;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::ctx::Ctx;
use crate::flow::lock::artifacts_of_parts;
use crate::graph::{Done, StepId, StepResult, Steps};
use crate::options::BuildOptions;
use crate::options::Part;
use crate::settings::Settings;

/// Bumped when a step's recipe here changes what it makes from the same inputs.
const GRAPH_RECIPE: &str = "commstack-graph-1";

/// What the graph's image steps are asked for beyond the build settings.
#[derive(Clone, Debug, Default)]
pub struct ImageOptions {
    /// The runtime step also runs verify's runtime and selftest levels (`docker run
    /// --gpus all`).
    pub gpus: bool,
}

pub struct StackSteps<'a> {
    ctx: &'a Ctx,
    pub settings: Settings,
    /// Why stack.lock was resolved again before the graph (None: it was fresh).
    pub lock_resolved: Option<String>,
    args: BuildOptions,
    image: ImageOptions,
    probes: Probes,
    /// The keyed steps built here (the graph tells, see [`Steps::built_here`]); fetch
    /// downloads only what they read. None: everything (`--until fetch`).
    /// A Mutex: [`Steps`] is Sync (steps may run at the same time).
    built_here: std::sync::Mutex<Option<std::collections::BTreeSet<StepId>>>,
    /// The `docker load` the image's pull feeds, when the run pulls and loads it.
    pub early_load: std::sync::Arc<crate::flow::image::EarlyLoadFeed>,
}

/// What of this machine a step's output depends on, read once per command.
#[derive(Debug, Serialize)]
struct Probes {
    /// rdma-core's headers where NVSHMEM's options need them.
    rdma_core: serde_json::Value,
    /// The interpreter the build venv is made from, and its version.
    base_python: serde_json::Value,
    rustc: String,
    /// The sources of the self-test (kernels/ and its build dependencies).
    kernels_sources: String,
    /// The sources of the verify tool (crates/verify and the crates it depends on).
    verify_sources: String,
    /// The doctor's sources (the image's preflight).
    doctor_sources: String,
    /// HEAD and the origin URL (the image's labels).
    git: serde_json::Value,
    mmdebstrap: serde_json::Value,
}

/// DeepEP's step result: what the wheelhouse is made of.
#[derive(Serialize, Deserialize)]
struct DeepepFacts {
    wheel: LockedWheel,
    dropin: LockedWheel,
    kind: WheelhouseKind,
    /// The build's ninja logs (see [`kept_ninja_logs`]).
    #[serde(default)]
    ninja_logs: Vec<PathBuf>,
}

impl<'a> StackSteps<'a> {
    /// Resolves the settings (the lock must be fresh) and probes this machine.
    pub fn new(ctx: &'a Ctx, args: BuildOptions, image: ImageOptions) -> Result<StackSteps<'a>> {
        let settings = Settings::resolve(ctx, &args)?;
        let root = commstack_tools::workspace_root();
        let needs_image = settings.stack.image.is_some();
        let probes = Probes {
            rdma_core: match settings.nvshmem.needs_rdma_core() {
                false => serde_json::Value::Null,
                true => {
                    let prefix = settings
                        .nvshmem
                        .rdma_core
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("/"));
                    match commstack_nvshmem::find_rdma_core(&prefix) {
                        Ok(r) => {
                            json!({ "prefix": r.prefix, "mlx5dv_h_sha256": r.mlx5dv_h_sha256 })
                        }
                        // Planned anyway: the step says what is missing when it runs.
                        Err(e) => json!({ "missing": format!("{e:#}") }),
                    }
                }
            },
            base_python: match crate::flow::deepep::base_python(
                &settings.lock,
                args.deepep.base_python.as_deref(),
            ) {
                Ok(p) => file_identity(&p),
                Err(e) => json!({ "missing": format!("{e:#}") }),
            },
            rustc: output_of(Path::new("rustc"), &["--version"]),
            kernels_sources: commstack_tools::sources_hash(&root, "kernels")?,
            verify_sources: commstack_tools::sources_hash(&root, "crates/verify")?,
            doctor_sources: commstack_tools::sources_hash(&root, "crates/doctor")?,
            git: json!(commstack_tools::git_identity()),
            mmdebstrap: match needs_image {
                true => match commstack_toolchain::find_in_path("mmdebstrap", None) {
                    Some(p) => file_identity(&p),
                    None => json!({ "missing": "no mmdebstrap on PATH" }),
                },
                false => serde_json::Value::Null,
            },
        };
        Ok(StackSteps {
            ctx,
            settings,
            lock_resolved: None,
            args,
            image,
            probes,
            built_here: Default::default(),
            early_load: Default::default(),
        })
    }

    /// Where the toolchain comes from when not from the lock's wheels (`--system`,
    /// `--wheels DIR`): part of its key, with nvcc's bytes for a system toolchain.
    fn toolchain_source(&self) -> serde_json::Value {
        let t = &self.args.toolchain;
        match (t.system, &t.wheels) {
            (true, _) => json!({
                "system": t.cuda_home,
                "nvcc": file_identity(&t.cuda_home.join("bin/nvcc")),
            }),
            (false, Some(dir)) => json!({ "wheels": dir }),
            (false, None) => json!("lock"),
        }
    }

    /// The artifacts the graph fetches: everything the lock names but NVIDIA's replaced
    /// wheels (kept for comparisons, not built with), and the .debs only for an image.
    fn artifacts(&self) -> Result<Vec<Artifact>> {
        let mut parts = vec![Part::Sources, Part::Toolchain, Part::Wheels];
        if self.settings.stack.image.is_some() {
            parts.push(Part::Debs);
        }
        // Only what the steps built here read: reused and substituted steps read nothing
        // (their outputs are here or come whole), so a build that substitutes every
        // compile step downloads no CUDA wheels, sources or runtime wheels, and one that
        // reuses everything downloads nothing.
        let Some(here) = self.built_here.lock().expect("built_here lock").clone() else {
            return artifacts_of_parts(&self.settings.lock, &parts);
        };
        parts.retain(|part| here.iter().any(|step| reads(*step).contains(part)));
        if parts.is_empty() {
            // (artifacts_of_parts reads no parts as all of them.)
            return Ok(Vec::new());
        }
        // Of the sources, those of the steps built here: NVSHMEM's build reads NVSHMEM's
        // source, not DeepEP's.
        let wanted: std::collections::BTreeSet<&str> = here
            .iter()
            .flat_map(|step| sources_read(*step))
            .copied()
            .collect();
        let unwanted: std::collections::BTreeSet<&str> = self
            .settings
            .lock
            .sources
            .iter()
            // A submodule (`deepep:<path>`) is read with its parent.
            .filter(|s| !wanted.contains(s.name.split(':').next().unwrap_or_default()))
            .map(|s| s.filename.as_str())
            .collect();
        Ok(artifacts_of_parts(&self.settings.lock, &parts)?
            .into_iter()
            .filter(|a| !unwanted.contains(a.filename.as_str()))
            .collect())
    }

    fn fetch_options(&self) -> Result<commstack_fetch::FetchOptions> {
        let f = &self.args.fetch;
        crate::flow::fetch::base_options(self.ctx, &f.mirror, f.offline, f.accept_tree_match)
    }

    fn runtime_pins(&self) -> serde_json::Value {
        self.settings
            .lock
            .packages
            .iter()
            .filter(|p| p.replaced_by.is_none())
            .map(|p| json!([p.filename, p.sha256]))
            .collect()
    }

    /// The locked source `name` as a step's input, with its submodules (`name:<path>`)
    /// where it has any (only then: a key without them is the key it always was).
    fn source(&self, name: &str) -> serde_json::Value {
        let sources = &self.settings.lock.sources;
        let submodules: Vec<serde_json::Value> = sources
            .iter()
            .filter(|s| {
                s.name
                    .split_once(':')
                    .is_some_and(|(parent, _)| parent == name)
            })
            .map(|s| json!({ "path": s.path, "tree": s.tree, "rev": s.rev, "sha256": s.sha256 }))
            .collect();
        sources
            .iter()
            .find(|s| s.name == name)
            .map(|s| {
                let mut v = json!({ "tree": s.tree, "rev": s.rev, "sha256": s.sha256 });
                if !submodules.is_empty() {
                    v["submodules"] = json!(submodules);
                }
                v
            })
            .unwrap_or_default()
    }
}

/// The parts of the download cache a step reads when it is built here (its own store
/// steps aside): what fetch must bring for it. Dropin, kernels and the image read only
/// the store (NVSHMEM's build, the toolchain, the base and the wheelhouse); nvshmem and
/// deepep re-resolve the toolchain and their source through the cache.
fn reads(step: StepId) -> &'static [Part] {
    match step {
        StepId::Toolchain => &[Part::Toolchain],
        StepId::NvshmemSource => &[Part::Sources],
        StepId::Nvshmem => &[Part::Toolchain, Part::Sources],
        StepId::Deepep => &[Part::Toolchain, Part::Sources, Part::Wheels],
        StepId::Wheelhouse => &[Part::Wheels],
        StepId::Base => &[Part::Debs],
        StepId::Kernels => &[Part::Toolchain],
        StepId::Dropin | StepId::Image | StepId::Verify | StepId::Runtime => &[],
        StepId::Lock | StepId::Fetch | StepId::Load => &[],
    }
}

/// The locked sources (`[[source]]` by name) a step reads when it is built here.
fn sources_read(step: StepId) -> &'static [&'static str] {
    match step {
        StepId::NvshmemSource | StepId::Nvshmem => &["nvshmem"],
        StepId::Deepep => &["deepep"],
        _ => &[],
    }
}

/// The base step's facts the verify steps read: the image's Python.
#[derive(Deserialize)]
struct BaseFacts {
    python: String,
}

/// `static passed, runtime failed`: the levels of a verify report, for a message.
fn describe_levels(levels: &[(String, String)]) -> String {
    levels
        .iter()
        .map(|(level, status)| format!("{level} {status}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The output of a step's result, or an error naming the step (a graph bug if missing).
/// The ninja logs a build step kept (`<step>/logs/ninja/*.ninja_log`, by
/// `commstack_exec::logged::keep_ninja_logs`), named in the graph step's facts as
/// `ninja_logs`: `build --timings` draws their compile jobs (commstack-timings). None when
/// the build was found in the store (`built_now` false): its jobs ran in another run.
fn kept_ninja_logs(step_dir: &Path, built_now: bool) -> Vec<PathBuf> {
    if !built_now {
        return Vec::new();
    }
    let dir = step_dir
        .join("logs")
        .join(commstack_exec::logged::NINJA_LOGS_DIR);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ninja_log"))
        .collect();
    logs.sort();
    logs
}

fn output_of_step(done: &Done, step: StepId) -> Result<PathBuf> {
    done.get(&step)
        .and_then(|r| r.output.clone())
        .with_context(|| format!("step {step} has no output"))
}

fn facts<T: for<'de> Deserialize<'de>>(done: &Done, step: StepId) -> Result<T> {
    let value = done
        .get(&step)
        .map(|r| r.facts.clone())
        .with_context(|| format!("step {step} has not run"))?;
    serde_json::from_value(value).with_context(|| format!("the result of step {step}"))
}

/// The recipes of the steps whose run is more than one call (see [`Steps::run`]).
impl StackSteps<'_> {
    fn run_fetch(&self, say: &dyn Fn(&str)) -> Result<StepResult> {
        let artifacts = self.artifacts()?;
        let fetched = commstack_fetch::fetch_all(&artifacts, &self.fetch_options()?)?;
        for f in &fetched {
            if let Some(d) = f.deviation() {
                crate::util::warn_once(say, &format!("WARNING {d}"));
            }
        }
        let bytes: u64 = artifacts.iter().filter_map(|a| a.size).sum();
        Ok(StepResult {
            output: Some(self.ctx.cache_dir()),
            facts: json!({ "artifacts": fetched.len(), "bytes": bytes }),
        })
    }

    fn run_deepep(&self, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        let mut args = self.args.clone();
        args.deepep.nvshmem = Some(output_of_step(done, StepId::Nvshmem)?);
        args.deepep.nvshmem_wheel = Some(output_of_step(done, StepId::Dropin)?);
        let made = crate::flow::deepep::deepep_step(self.ctx, &self.settings, &args, say, say)?;
        Ok(StepResult {
            output: Some(made.wheel.path.clone()),
            facts: serde_json::to_value(DeepepFacts {
                ninja_logs: kept_ninja_logs(&made.step_dir, made.built_now),
                wheel: made.wheel,
                dropin: made.dropin,
                kind: made.kind,
            })?,
        })
    }

    fn run_wheelhouse(&self, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        let d: DeepepFacts = facts(done, StepId::Deepep)?;
        let cache = commstack_fetch::Cache::new(self.ctx.cache_dir());
        let runtime = match d.kind {
            WheelhouseKind::Full => commstack_deepep::runtime_wheels(
                &self.settings.lock,
                &cache,
                std::slice::from_ref(&d.dropin),
            )?,
            WheelhouseKind::Overlay => vec![d.dropin.clone()],
        };
        let house = crate::flow::deepep::wheelhouse_step(
            self.ctx,
            d.kind,
            &runtime,
            &d.dropin,
            &d.wheel,
            self.args.force,
            say,
        )?;
        Ok(StepResult {
            output: Some(house.dir.clone()),
            facts: json!({ "wheels": house.manifest.wheels.len() }),
        })
    }

    fn run_image(&self, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        #[derive(Deserialize)]
        struct KernelsFacts {
            version: String,
            source: String,
        }
        let k: KernelsFacts = facts(done, StepId::Kernels)?;
        let selftest = crate::flow::image::tool_at(
            "commstack-selftest",
            &k.version,
            output_of_step(done, StepId::Kernels)?,
            k.source,
        );
        let verify = crate::flow::image::verify_tool(self.ctx, self.args.force, say)?;
        let doctor = crate::flow::image::doctor_tool(self.ctx, self.args.force, say)?;
        let image = crate::flow::image::image_step(
            self.ctx,
            &self.settings,
            say,
            &output_of_step(done, StepId::Base)?,
            &output_of_step(done, StepId::Wheelhouse)?,
            vec![selftest, verify, doctor],
            self.args.force,
        )?;
        Ok(StepResult {
            output: Some(image.dir.clone()),
            facts: json!({ "id": image.id(), "tag": image.tag() }),
        })
    }

    fn run_verify(&self, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        let image = commstack_image::Image::open(&output_of_step(done, StepId::Image)?)?;
        let base: BaseFacts = facts(done, StepId::Base)?;
        let verdict = crate::flow::verify_static::verify_image_static(
            self.ctx,
            &self.settings,
            &image,
            &base.python,
            &self.probes.verify_sources,
            say,
        )?;
        if verdict.exit != 0 {
            bail!(
                "verify's static level over the image's layers failed (exit {}): {}; report: {}",
                verdict.exit,
                describe_levels(&verdict.levels),
                verdict.report.display()
            );
        }
        Ok(StepResult {
            output: Some(verdict.report.clone()),
            facts: serde_json::to_value(&verdict)?,
        })
    }

    fn run_runtime(&self, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        let image = commstack_image::Image::open(&output_of_step(done, StepId::Image)?)?;
        let base: BaseFacts = facts(done, StepId::Base)?;
        let verdict = crate::flow::verify_runtime::runtime_in_container(
            self.ctx,
            &self.settings,
            &image,
            &base.python,
            self.image.gpus,
            say,
        )?;
        if verdict.exit != 0 {
            let mut failed = Vec::new();
            if !verdict.import_torch {
                failed.push(format!(
                    "`import torch` in the image (no GPU, no network) failed: see {}",
                    crate::flow::verify_report::report_dir(self.ctx, &image)
                        .join("import-torch.txt")
                        .display()
                ));
            }
            if verdict.jit_toolchain == Some(false) {
                failed.push(format!(
                    "DeepEP V2's JIT toolchain in the image (nvcc, g++, cuobjdump, the NCCL root) failed: see {}",
                    crate::flow::verify_report::report_dir(self.ctx, &image)
                        .join("jit-toolchain.txt")
                        .display()
                ));
            }
            if !verdict.levels.is_empty() {
                failed.push(format!(
                    "verify's GPU levels in the image: {}; report: {}",
                    describe_levels(&verdict.levels),
                    verdict.report.display()
                ));
            }
            bail!(
                "what runs in the loaded image failed (exit {}): {}",
                verdict.exit,
                failed.join("; ")
            );
        }
        Ok(StepResult {
            output: Some(verdict.report.clone()),
            facts: serde_json::to_value(&verdict)?,
        })
    }
}

impl Steps<StepId> for StackSteps<'_> {
    fn skipped(&self, step: StepId) -> Option<String> {
        let image_step = matches!(
            step,
            StepId::Base | StepId::Image | StepId::Verify | StepId::Load | StepId::Runtime
        );
        (image_step && self.settings.stack.image.is_none()).then(|| {
            format!(
                "{} has no [image] section (the default stack.toml has one)",
                self.ctx.stack_path.display()
            )
        })
    }

    fn inputs(&self, step: StepId) -> Result<serde_json::Value> {
        let s = &self.settings;
        let p = &self.probes;
        let lock = &s.lock;
        Ok(match step {
            StepId::Toolchain => json!({
                "graph": GRAPH_RECIPE,
                "from": self.toolchain_source(),
                "wheels": lock.toolchain.iter().map(|w| json!([w.filename, w.sha256])).collect::<Vec<_>>(),
            }),
            StepId::NvshmemSource => {
                json!({ "graph": GRAPH_RECIPE, "source": self.source("nvshmem") })
            }
            StepId::Nvshmem => json!({
                "recipe": commstack_nvshmem::BUILD_RECIPE,
                "options": s.nvshmem,
                "passthrough": s.passthrough,
                "rdma_core": p.rdma_core,
            }),
            StepId::Dropin => json!({
                "recipe": commstack_nvshmem::DROPIN_RECIPE,
                "torch_pin": s.torch_pin,
                "cuda_major": s.stack.torch.cuda_major,
                "allow_version_mismatch": s.allow_version_mismatch,
            }),
            StepId::Kernels => json!({
                "graph": GRAPH_RECIPE,
                "cuda_archs": s.cuda_archs,
                "sources": p.kernels_sources,
                "rustc": p.rustc,
            }),
            StepId::Deepep => json!({
                "recipe": [commstack_deepep::build::RECIPE, commstack_deepep::venv::RECIPE],
                "api": s.stack.deepep.api.as_str(),
                "source": self.source("deepep"),
                "cuda_archs": s.cuda_archs,
                "base_python": p.base_python,
                "runtime": self.runtime_pins(),
                "rdma_core": p.rdma_core,
                "allow_missing_rdc_fix": s.allow_missing_rdc_fix,
                "allow_second_nccl": s.allow_second_nccl,
                "source_date_epoch": crate::flow::deepep::source_date_epoch(lock),
            }),
            StepId::Wheelhouse => json!({
                "recipe": commstack_deepep::wheelhouse::RECIPE,
                "runtime": self.runtime_pins(),
            }),
            StepId::Base => json!({
                "recipe": commstack_base::RECIPE,
                "base": lock.base,
                "debs": lock.debs.iter().map(|d| json!([d.name, d.version, d.architecture, d.sha256])).collect::<Vec<_>>(),
                "mmdebstrap": p.mmdebstrap,
            }),
            StepId::Image => json!({
                "recipe": commstack_image::assemble::IMAGE_RECIPE,
                "lock_sha256": s.lock_sha256,
                "image": s.stack.image.as_ref().map(|i| json!({ "name": i.name, "user": i.user })),
                "verify_sources": p.verify_sources,
                "doctor_sources": p.doctor_sources,
                "preflight": crate::flow::image::preflight_expectations(s)?,
                "rustc": p.rustc,
                "git": p.git,
            }),
            // The static level, on this machine: --gpus does not change it.
            StepId::Verify => json!({
                "graph": GRAPH_RECIPE,
                "verify_sources": p.verify_sources,
            }),
            StepId::Runtime => json!({
                "graph": GRAPH_RECIPE,
                "gpus": self.image.gpus,
                "verify_sources": p.verify_sources,
            }),
            StepId::Lock | StepId::Fetch | StepId::Load => {
                bail!("step {step} is not keyed")
            }
        })
    }

    fn pending(&self, step: StepId, done: &Done) -> Result<Option<String>> {
        match step {
            StepId::Lock => Ok(self.lock_resolved.clone()),
            StepId::Fetch => {
                let artifacts = self.artifacts()?;
                if artifacts.is_empty() {
                    // Every step that reads the cache is reused or substituted.
                    return Ok(None);
                }
                let missing = commstack_fetch::not_cached(&artifacts, &self.fetch_options()?)
                    .context("reading the download cache")?;
                Ok((!missing.is_empty()).then(|| {
                    let names: Vec<&str> = missing
                        .iter()
                        .take(3)
                        .map(|a| a.filename.as_str())
                        .collect();
                    format!(
                        "{} of {} artifacts are not in the download cache ({}{})",
                        missing.len(),
                        artifacts.len(),
                        names.join(", "),
                        if missing.len() > 3 { ", ..." } else { "" }
                    )
                }))
            }
            StepId::Load => {
                let image = commstack_image::Image::open(&output_of_step(done, StepId::Image)?)?;
                Ok((!crate::flow::image::docker_has(image.id(), image.tag()))
                    .then(|| format!("Docker has no image {} tagged {}", image.id(), image.tag())))
            }
            _ => bail!("step {step} is keyed"),
        }
    }

    fn run(&self, step: StepId, done: &Done, say: &dyn Fn(&str)) -> Result<StepResult> {
        let (ctx, s, args) = (self.ctx, &self.settings, &self.args);
        match step {
            // Resolved before the graph (its settings come from it): the row says so.
            StepId::Lock => Ok(StepResult {
                output: Some(ctx.lock_path()),
                facts: json!({ "resolved_again": self.lock_resolved }),
            }),
            StepId::Fetch => self.run_fetch(say),
            StepId::Toolchain => {
                let tc = crate::flow::toolchain::resolve(ctx, &args.toolchain, args.force, say)?;
                Ok(StepResult {
                    output: tc.cuda_home.parent().map(Path::to_path_buf),
                    facts: json!({ "toolchain": tc.describe() }),
                })
            }
            StepId::NvshmemSource => {
                let (dir, tree) =
                    crate::flow::nvshmem::locked_source(ctx, &args.fetch, "nvshmem", say)?;
                Ok(StepResult {
                    output: Some(dir),
                    facts: json!({ "tree": tree }),
                })
            }
            StepId::Nvshmem => {
                let built = crate::flow::nvshmem::nvshmem_step(ctx, s, args, say, say)?;
                Ok(StepResult {
                    output: Some(built.outcome.path().to_path_buf()),
                    facts: json!({
                        "version": built.report.proof.version,
                        "use_nccl": built.report.proof.use_nccl,
                        "manylinux": built.report.proof.manylinux,
                        "ninja_logs": kept_ninja_logs(built.outcome.path(), !built.outcome.was_cached()),
                    }),
                })
            }
            StepId::Dropin => {
                let input = NvshmemInput::from_step(&output_of_step(done, StepId::Nvshmem)?)?;
                let built = input.built.context("the NVSHMEM step is not a build")?;
                let dropin = crate::flow::nvshmem::dropin_step(ctx, s, args, &built, say)?;
                Ok(StepResult {
                    output: Some(dropin.wheel.clone()),
                    facts: json!({ "version": dropin.version, "sha256": dropin.sha256 }),
                })
            }
            StepId::Kernels => {
                let prefix =
                    output_of_step(done, StepId::Nvshmem)?.join(commstack_nvshmem::INSTALL_DIR);
                let tool = crate::flow::image::selftest_tool(
                    ctx,
                    s,
                    &args.toolchain,
                    prefix,
                    args.force,
                    say,
                )?;
                Ok(StepResult {
                    output: Some(tool.host_path.clone()),
                    facts: json!({ "version": tool.version, "source": tool.source }),
                })
            }
            StepId::Deepep => self.run_deepep(done, say),
            StepId::Wheelhouse => self.run_wheelhouse(done, say),
            StepId::Base => {
                let base = crate::flow::image::base_step(ctx, s, args.force, say)?;
                Ok(StepResult {
                    output: Some(base.dir.clone()),
                    facts: json!({
                        "packages": base.manifest.packages.len(),
                        "python": base.manifest.python,
                    }),
                })
            }
            StepId::Image => self.run_image(done, say),
            StepId::Load => {
                let image = commstack_image::Image::open(&output_of_step(done, StepId::Image)?)?;
                let id = crate::flow::image::load_step(&image, self.early_load.take(), say)?;
                Ok(StepResult {
                    output: None,
                    facts: json!({ "id": id, "tag": image.tag() }),
                })
            }
            StepId::Verify => self.run_verify(done, say),
            StepId::Runtime => self.run_runtime(done, say),
        }
    }
    /// A substituted image's first layer is the base's (the image artifact carries the
    /// layers after it).
    fn reads_when_substituted(&self, step: StepId) -> &'static [StepId] {
        match step {
            StepId::Image => &[StepId::Base],
            _ => &[],
        }
    }

    /// Fetch brings what the steps built here read (a reused or substituted step reads
    /// nothing); `--until fetch` asks for all of it.
    fn built_here(&self, steps: &std::collections::BTreeSet<StepId>, target: Option<StepId>) {
        if target != Some(StepId::Fetch) {
            *self.built_here.lock().expect("built_here lock") = Some(steps.clone());
        }
    }

    fn shipped(&self, step: StepId, result: &StepResult) -> Option<PathBuf> {
        let output = result.output.clone()?;
        match step {
            // The install (lib/, include/), not the build report beside it.
            StepId::Nvshmem => Some(output.join(commstack_nvshmem::INSTALL_DIR)),
            // A wheel, a binary, a directory of wheels, the base's tar and manifest, the
            // image's config, manifest, SBOM and provenance (the layers are named by
            // their diff_ids in the config).
            StepId::Dropin
            | StepId::Kernels
            | StepId::Deepep
            | StepId::Wheelhouse
            | StepId::Base
            | StepId::Image => Some(output),
            // Unpacked downloads, checked by hash already; a report of this run.
            StepId::Toolchain | StepId::NvshmemSource | StepId::Verify | StepId::Runtime => None,
            StepId::Lock | StepId::Fetch | StepId::Load => None,
        }
    }
}

/// A program's identity without running it (a second under load, for some): its real
/// path and the sha256 of its bytes.
fn file_identity(path: &Path) -> serde_json::Value {
    let real = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    match commstack_digest::sha256_file(&real) {
        Ok(sha) => json!({ "path": real, "sha256": sha }),
        Err(e) => json!({ "path": real, "missing": e.to_string() }),
    }
}

/// The first line a program prints for `args` (or why it could not run): a probe.
fn output_of(program: &Path, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            text.lines().next().unwrap_or_default().trim().to_string()
        }
        Err(e) => format!("{} not runnable: {e}", program.display()),
    }
}

/// The kinds of store step (`<kind>-<hash>`) one graph step's artifact may bring: the
/// crate step its result lives in, and those it carries whole beside it (the image's
/// layer steps). Nothing else is taken from it, signed or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactKinds {
    pub own: String,
    pub carried: Vec<String>,
}

/// The one place that says what a binary cache's artifact of each step may bring:
/// the crate step its output lives in, and for the image its layer steps
/// (`image-layer-<hash>`), carried whole beside the image step's files (its base layer
/// comes with the substituted base): so a substituting home writes no layer and runs
/// no compiler (cargo's for the verify tool included) for it. These are the steps
/// `cache push` pushes (those that ship); the others are always built here.
pub fn artifact_kinds(step: StepId) -> Option<ArtifactKinds> {
    let (own, carried): (&str, &[&str]) = match step {
        StepId::Nvshmem => (commstack_nvshmem::BUILD_STEP, &[]),
        StepId::Dropin => (commstack_nvshmem::DROPIN_STEP, &[]),
        StepId::Kernels => (commstack_tools::TOOL_STEP, &[]),
        StepId::Deepep => (commstack_deepep::build::STEP, &[]),
        StepId::Wheelhouse => (commstack_deepep::wheelhouse::STEP, &[]),
        StepId::Base => (commstack_base::STEP, &[]),
        StepId::Image => (
            commstack_image::assemble::IMAGE_STEP,
            &[commstack_image::assemble::LAYER_STEP],
        ),
        StepId::Lock
        | StepId::Fetch
        | StepId::Toolchain
        | StepId::NvshmemSource
        | StepId::Verify
        | StepId::Load
        | StepId::Runtime => return None,
    };
    Some(ArtifactKinds {
        own: own.to_string(),
        carried: carried.iter().map(|c| c.to_string()).collect(),
    })
}
