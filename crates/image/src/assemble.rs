//! The image step: from the lock, the base step and the wheelhouse step (and our tools) to
//! `<store>/steps/image-<hash>/`, offline. Every non-base layer is a store step of its own
//! (`image-layer-<hash>`), keyed by its content inputs (wheel sha256s, the recipe, the
//! epoch, the layout), so a DeepEP change rebuilds only the DeepEP layer and the top
//! layer, and a rerun with nothing changed finds the image step and does nothing.
//!
//! ```text
//! image-<hash>/
//!   image.json          ID, tag, the spec, each layer: what it holds, diff_id, size, tar
//!   config.json         the canonical image config (its sha256 is the image ID)
//!   manifest.json       the docker-archive manifest
//!   sbom.spdx.json      SPDX 2.3 (also at /opt/commstack/sbom.spdx.json in the image)
//!   provenance.json     every file of the image and where it came from (also in the image)
//! ```
//! The layer tars stay in their layer steps; image.json names them relative to the
//! store's `steps/` (the base's too when it is there).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_deepep::LockedWheel;
use commstack_deepep::wheelhouse::{CONSTRAINTS_FILE, Wheelhouse, WheelhouseKind};
use commstack_stack::Lock;
use commstack_stack::manifest::DeepEpApi;
use commstack_store::{StepKey, Store};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::base::Base;
use crate::docker_archive::{ImageSpec, archive_manifest, image_config, rfc3339};
use crate::jit::{
    JIT_CACHE_DIR, JIT_PREFIX, JitToolchain, install_toolchain, is_jit_wheel, jit_env, nvcc_major,
};
use crate::layer::{Layer, Owner, write_layer_owned};
use crate::plan::{LayerKind, PlannedLayer, plan_layers};
use crate::provenance::{Claims, LayerSource, Origin, provenance};
use crate::sbom::{Component, ComponentKind, SbomDocument, spdx_json};
use crate::venv::{
    ImageUser, VENV, VENV_PYTHON, VenvLayout, install_wheels, tree_files, write_skeleton,
};

/// The recipe: a change to how layers are made changes every key.
pub const IMAGE_RECIPE: &str = "commstack-image-1";
pub const IMAGE_FILE: &str = "image.json";
/// The store step name of an image.
pub const IMAGE_STEP: &str = "image";
/// The store step of each layer but the base's (`image-layer-<hash>`: layer.tar, layer.json).
pub const LAYER_STEP: &str = "image-layer";
/// A layer step's tar (its sha256 the diff_id).
pub const LAYER_FILE: &str = "layer.tar";
const LAYER_JSON: &str = "layer.json";
/// commstack's own files in the image.
pub const OWN_DIR: &str = "opt/commstack";
/// The image user's ids.
pub const USER_ID: u64 = 1000;

/// The image's environment (see the issue's image layout).
pub const ENV: &[&str] = &[
    "PATH=/opt/commstack/venv/bin:/opt/commstack/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV=/opt/commstack/venv",
    "PIP_CONSTRAINT=/opt/commstack/constraints.txt",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib64",
    "PYTHONDONTWRITEBYTECODE=1",
    "LANG=C.UTF-8",
];

/// A binary of ours that goes into the image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tool {
    /// `commstack-selftest`
    pub name: String,
    pub version: String,
    /// Absolute, under /opt/commstack (`/opt/commstack/bin/commstack-selftest`).
    pub image_path: String,
    pub host_path: PathBuf,
    /// Where it came from, for provenance.json (a store step's directory name, or a path
    /// relative to the workspace): machine-independent, since it is part of the image.
    pub source: String,
}

/// A file of ours made from data rather than built (`/opt/commstack/preflight.json`, the
/// preflight's expectations written from the lock and the build settings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFile {
    /// Absolute, under /opt/commstack (`/opt/commstack/preflight.json`).
    pub image_path: String,
    pub bytes: Vec<u8>,
    /// What it was made from, for provenance.json (machine-independent).
    pub source: String,
}

/// What the image step is made from.
#[derive(Clone, Debug)]
pub struct ImageInputs {
    pub lock: Lock,
    pub lock_path: PathBuf,
    pub lock_sha256: String,
    /// `<store>/steps/base-<hash>/`
    pub base_dir: PathBuf,
    /// `<store>/steps/wheelhouse-<hash>/` (a `full` wheelhouse)
    pub wheelhouse_dir: PathBuf,
    pub tools: Vec<Tool>,
    /// Files written from data into /opt/commstack beside the tools.
    pub data: Vec<DataFile>,
    /// Image name (the tag is [`image_tag`]'s).
    pub name: String,
    /// The non-root user (uid/gid [`USER_ID`]).
    pub user: String,
    /// For the OCI labels `source` and `revision`.
    pub source_url: String,
    pub revision: String,
    /// Wheels of at least this installed size get a layer of their own
    /// ([`crate::plan::LARGE_WHEEL_BYTES`]).
    pub large_wheel_bytes: u64,
    /// DeepEP V2: the toolchain its JIT runs at run time (a layer of its own, CUDA_HOME and
    /// EP_JIT_CACHE_DIR in the environment, the cache directory owned by the user).
    pub jit: Option<JitToolchain>,
}

/// The image's environment: [`ENV`], and for DeepEP V2 what its JIT needs.
pub fn image_env(jit: Option<&JitToolchain>) -> Result<Vec<String>> {
    Ok(env_with_jit(jit.map(JitToolchain::cuda_major).transpose()?))
}

/// The environment the image made from `lock` carries in its config, as [`image_env`]
/// writes it, from the lock alone (no wheel at hand): what a deploy sets again where a
/// runtime gives the container another environment (Slurm's OCI containers).
pub fn locked_image_env(lock: &Lock) -> Result<Vec<String>> {
    let jit = match lock.resolved.deepep_api {
        DeepEpApi::V1 => None,
        DeepEpApi::V2 => Some(nvcc_major(
            lock.toolchain
                .iter()
                .filter(|w| is_jit_wheel(&w.name))
                .map(|w| (w.name.as_str(), w.version.as_str(), w.filename.as_str())),
        )?),
    };
    Ok(env_with_jit(jit))
}

/// [`ENV`], then the JIT's for a toolchain of that CUDA major.
pub fn env_with_jit(cuda_major: Option<u64>) -> Vec<String> {
    let mut env: Vec<String> = ENV.iter().map(|s| s.to_string()).collect();
    env.extend(cuda_major.map(jit_env).unwrap_or_default());
    env
}

/// One layer of image.json.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageLayer {
    pub holds: String,
    pub kind: LayerKind,
    pub diff_id: String,
    pub size: u64,
    /// The tar: relative to the store's `steps/`, or absolute when outside it.
    pub file: String,
}

/// image.json.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageManifest {
    pub schema: u32,
    /// `sha256:<hex>` of config.json: the ID `docker load` gives the image.
    pub id: String,
    pub tag: String,
    pub lock_sha256: String,
    pub spec: ImageSpec,
    pub layers: Vec<ImageLayer>,
}

/// An image step's output.
#[derive(Clone, Debug)]
pub struct Image {
    pub dir: PathBuf,
    pub manifest: ImageManifest,
    /// The step was found, not built.
    pub cached: bool,
}

impl Image {
    pub fn open(dir: &Path) -> Result<Image> {
        let path = dir.join(IMAGE_FILE);
        let text = fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}: not an image step; run `cargo xtask build image`",
                path.display()
            )
        })?;
        Ok(Image {
            dir: dir.to_path_buf(),
            manifest: serde_json::from_str(&text)
                .with_context(|| format!("{} is not an image manifest", path.display()))?,
            cached: true,
        })
    }

    pub fn id(&self) -> &str {
        &self.manifest.id
    }

    pub fn tag(&self) -> &str {
        &self.manifest.tag
    }

    /// The layers, bottom first, with their tars' paths.
    pub fn layers(&self) -> Vec<Layer> {
        let steps = self.dir.parent().unwrap_or(&self.dir);
        self.manifest
            .layers
            .iter()
            .map(|l| Layer {
                path: steps.join(&l.file),
                diff_id: l.diff_id.clone(),
                size: l.size,
            })
            .collect()
    }

    /// The config bytes (sha256 = the ID).
    pub fn config(&self) -> Result<String> {
        let path = self.dir.join("config.json");
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))
    }
}

/// The checked inputs: what the lock, the base and the wheelhouse agree on.
struct Checked {
    epoch: u64,
    base: Base,
    house: Wheelhouse,
    closure: Vec<LockedWheel>,
    dropin: LockedWheel,
    deepep: LockedWheel,
    tools: Vec<(Tool, String)>,
    constraints: PathBuf,
    constraints_sha256: String,
}

fn check(inputs: &ImageInputs) -> Result<Checked> {
    let (epoch, base) = check_base(inputs)?;
    let (house, closure, dropin, deepep) = check_wheelhouse(inputs)?;
    let tools = check_tools(inputs)?;
    check_data(inputs)?;
    let constraints = house.dir.join(CONSTRAINTS_FILE);
    let constraints_sha256 = commstack_digest::sha256_file(&constraints)
        .context("the wheelhouse has no constraints.txt: run `cargo xtask build deepep`")?;
    Ok(Checked {
        epoch,
        base,
        house,
        closure,
        dropin,
        deepep,
        tools,
        constraints,
        constraints_sha256,
    })
}

/// The lock as given (its sha256), and the base step of its epoch and exactly its debs.
fn check_base(inputs: &ImageInputs) -> Result<(u64, Base)> {
    let lock = &inputs.lock;
    let base_lock = lock.base.as_ref().with_context(|| {
        format!(
            "{} has no [base] section: add [image] to the stack manifest and run `cargo xtask lock`",
            inputs.lock_path.display()
        )
    })?;
    commstack_stack::lock::check_epoch_past(base_lock.epoch)
        .map_err(|e| anyhow::anyhow!("{}: [base] {e}", inputs.lock_path.display()))?;
    let actual = commstack_digest::sha256_file(&inputs.lock_path)?;
    if actual != inputs.lock_sha256 {
        bail!(
            "{} has sha256 {actual}, not {} as given: the lock changed while the image was made; run `cargo xtask build image` again",
            inputs.lock_path.display(),
            inputs.lock_sha256
        );
    }
    let base = Base::open(&inputs.base_dir)?;
    if base.manifest.epoch != base_lock.epoch {
        bail!(
            "{}: epoch {} is not the lock's {}: the base step is stale; run `cargo xtask build image` to rebuild it",
            inputs.base_dir.display(),
            base.manifest.epoch,
            base_lock.epoch
        );
    }
    let locked_debs: BTreeMap<&str, _> = lock.debs.iter().map(|d| (d.name.as_str(), d)).collect();
    for p in &base.manifest.packages {
        match locked_debs.get(p.name.as_str()) {
            Some(d) if d.version == p.version && d.sha256 == p.sha256 => {}
            Some(d) => bail!(
                "the base package {} is {} with sha256 {}, the lock says {} with sha256 {}: rebuild the base with `cargo xtask fetch --verify` and `cargo xtask build image`",
                p.name,
                p.version,
                p.sha256,
                d.version,
                d.sha256
            ),
            None => bail!(
                "the base has the package {} {}, which the lock's [[deb]] list does not have: rebuild the base with `cargo xtask build image`",
                p.name,
                p.version
            ),
        }
    }
    if base.manifest.packages.len() != lock.debs.len() {
        bail!(
            "the base {} has {} packages, the lock {}: rebuild the base with `cargo xtask build image`",
            inputs.base_dir.display(),
            base.manifest.packages.len(),
            lock.debs.len()
        );
    }
    Ok((base_lock.epoch, base))
}

/// The full wheelhouse, holding exactly the lock's wheels (sha256 checked), the drop-in
/// and DeepEP: (the wheelhouse, the lock's closure, the drop-in, DeepEP).
fn check_wheelhouse(
    inputs: &ImageInputs,
) -> Result<(Wheelhouse, Vec<LockedWheel>, LockedWheel, LockedWheel)> {
    let lock = &inputs.lock;
    let house = Wheelhouse::open(&inputs.wheelhouse_dir).context(
        "the wheelhouse step output is missing: run `cargo xtask build deepep` to assemble it",
    )?;
    if house.manifest.kind != WheelhouseKind::Full {
        bail!(
            "{} is an overlay wheelhouse; an image needs the full one (`cargo xtask build deepep` in managed mode)",
            house.dir.display()
        );
    }
    let present = |w: LockedWheel| -> Result<LockedWheel> {
        if !w.path.is_file() {
            bail!(
                "the wheelhouse {} lists {} but has no {}: run `cargo xtask build deepep` to assemble it again",
                house.dir.display(),
                w.filename,
                w.path.display()
            );
        }
        Ok(w)
    };
    let named = |filename: &str, what: &str| -> Result<LockedWheel> {
        present(house.find(filename).with_context(|| {
            format!(
                "{}: wheelhouse.json names the {what} {filename} but does not list it",
                house.dir.display()
            )
        })?)
    };
    let dropin = named(&house.manifest.dropin, "NVSHMEM drop-in")?;
    let deepep = named(&house.manifest.deepep, "DeepEP wheel")?;
    let mut closure = Vec::new();
    for p in lock.packages.iter().filter(|p| p.replaced_by.is_none()) {
        let w = house.find(&p.filename).with_context(|| {
            format!(
                "the wheelhouse {} has no {} (a wheel of the lock): run `cargo xtask build deepep` to assemble it again",
                house.dir.display(),
                p.filename
            )
        })?;
        if w.sha256 != p.sha256 {
            bail!(
                "the wheel {} has sha256 {} in the wheelhouse {}, but the lock says {}: the wheelhouse is stale; run `cargo xtask fetch --verify` and `cargo xtask build deepep`",
                p.filename,
                w.sha256,
                house.dir.display(),
                p.sha256
            );
        }
        closure.push(present(w)?);
    }
    for w in &house.manifest.wheels {
        let ours = [&dropin.filename, &deepep.filename].contains(&&w.filename);
        if !ours && !closure.iter().any(|c| c.filename == w.filename) {
            bail!(
                "the wheelhouse {} holds {}, which the lock {} does not list: run `cargo xtask build deepep` to assemble it for this lock",
                house.dir.display(),
                w.filename,
                inputs.lock_path.display()
            );
        }
    }
    Ok((house, closure, dropin, deepep))
}

/// Our own tools, each under the image's own directory, with its sha256.
fn check_tools(inputs: &ImageInputs) -> Result<Vec<(Tool, String)>> {
    let mut tools = Vec::new();
    for t in &inputs.tools {
        if !t.image_path.starts_with(&format!("/{OWN_DIR}/")) || t.image_path.contains("/../") {
            bail!(
                "the tool {} goes to {}: tools go under /{OWN_DIR}/",
                t.name,
                t.image_path
            );
        }
        let sha = commstack_digest::sha256_file(&t.host_path).with_context(|| {
            format!(
                "the tool {} ({}) is missing: build it first",
                t.name,
                t.host_path.display()
            )
        })?;
        tools.push((t.clone(), sha));
    }
    Ok(tools)
}

/// The data files: each under the image's own directory, none where a tool or another
/// file of ours goes.
fn check_data(inputs: &ImageInputs) -> Result<()> {
    let mut taken: Vec<String> = inputs.tools.iter().map(|t| t.image_path.clone()).collect();
    taken.extend(
        [
            "stack.lock",
            "constraints.txt",
            "sbom.spdx.json",
            "provenance.json",
        ]
        .iter()
        .map(|f| format!("/{OWN_DIR}/{f}")),
    );
    for d in &inputs.data {
        if !d.image_path.starts_with(&format!("/{OWN_DIR}/")) || d.image_path.contains("/../") {
            bail!(
                "the file {} is not under /{OWN_DIR}/: the image step writes its own files there only",
                d.image_path
            );
        }
        if taken.contains(&d.image_path) {
            bail!(
                "the file {} is given twice (or is one the image step writes itself)",
                d.image_path
            );
        }
        taken.push(d.image_path.clone());
    }
    Ok(())
}

/// Assembles (or finds) the image step. Nothing is tagged or loaded here: see
/// [`crate::load::docker_load`].
pub fn assemble_image(store: &Store, inputs: &ImageInputs, force: bool) -> Result<Image> {
    assemble_image_reporting(store, inputs, force, &|_| {})
}

/// [`assemble_image`], saying which layer it is making (`progress`): a cold image takes
/// minutes.
pub fn assemble_image_reporting(
    store: &Store,
    inputs: &ImageInputs,
    force: bool,
    progress: &dyn Fn(&str),
) -> Result<Image> {
    let c = check(inputs)?;
    let layout = VenvLayout {
        python_full: c.base.manifest.python.clone(),
        python_minor: c.base.python_minor()?,
    };
    let user = ImageUser {
        name: inputs.user.clone(),
        uid: USER_ID,
        gid: USER_ID,
    };
    let layout_json = json!({
        "venv": VENV, "python": layout.python_full, "shebang": VENV_PYTHON,
        "user": user.name, "uid": user.uid, "gid": user.gid,
    });
    let pins = |ws: &[LockedWheel]| -> Vec<serde_json::Value> {
        ws.iter().map(|w| json!([w.filename, w.sha256])).collect()
    };
    let env = image_env(inputs.jit.as_ref())?;
    let mut key_inputs = json!({
        "recipe": IMAGE_RECIPE,
        "epoch": c.epoch,
        "base": { "key": c.base.manifest.key, "diff_id": c.base.manifest.layer.diff_id },
        "layout": layout_json,
        "large_wheel_bytes": inputs.large_wheel_bytes,
        "closure": pins(&c.closure),
        "dropin": pins(std::slice::from_ref(&c.dropin)),
        "deepep": pins(std::slice::from_ref(&c.deepep)),
        "tools": c.tools.iter().map(|(t, sha)| json!([t.image_path, t.name, t.version, t.source, sha])).collect::<Vec<_>>(),
        "data": inputs.data.iter().map(|d| json!([d.image_path, commstack_digest::sha256_hex(&d.bytes), d.source])).collect::<Vec<_>>(),
        "lock": inputs.lock_sha256,
        "constraints": c.constraints_sha256,
        "name": inputs.name,
        "source": inputs.source_url,
        "revision": inputs.revision,
        "env": env,
    });
    // Only a V2 image's key names the JIT toolchain: a V1 image's key is as before.
    if let Some(jit) = &inputs.jit {
        key_inputs["jit"] =
            json!({ "wheels": pins(&jit.wheels), "prefix": JIT_PREFIX, "cache": JIT_CACHE_DIR });
    }
    let key = StepKey::new(IMAGE_STEP, &key_inputs);
    let tag = image_tag(&inputs.name, &inputs.lock_sha256, &inputs.revision);
    let outcome = store.run(&key, &key_inputs, force, |dir| {
        build_image(
            progress,
            store,
            inputs,
            &c,
            &layout,
            &user,
            &layout_json,
            &key,
            &tag,
            &dir.out,
        )
    })?;
    let mut image = Image::open(outcome.path())?;
    image.cached = outcome.was_cached();
    // A cached image step names layer steps that `store gc` may have removed since: make
    // the image again (its missing layers with it) rather than load or export from holes.
    if image.cached
        && !force
        && let Some(why) = missing_layer(&image)
    {
        eprintln!("image: {why}; making the image step again");
        return assemble_image_reporting(store, inputs, true, progress);
    }
    Ok(image)
}

/// The first layer file of `image` that is gone or has another size than recorded.
fn missing_layer(image: &Image) -> Option<String> {
    image
        .layers()
        .into_iter()
        .find_map(|l| match fs::metadata(&l.path) {
            Ok(m) if m.len() == l.size => None,
            Ok(m) => Some(format!(
                "the layer {} has {} bytes, the image records {}",
                l.path.display(),
                m.len(),
                l.size
            )),
            Err(_) => Some(format!("the layer {} is gone", l.path.display())),
        })
}

#[allow(clippy::too_many_arguments)]
fn build_image(
    progress: &dyn Fn(&str),
    store: &Store,
    inputs: &ImageInputs,
    c: &Checked,
    layout: &VenvLayout,
    user: &ImageUser,
    layout_json: &serde_json::Value,
    key: &StepKey,
    tag: &str,
    out: &Path,
) -> Result<()> {
    c.base.check_layer()?;
    let steps = store.root().join("steps");
    let plan = plan_layers(
        &c.closure,
        &c.dropin,
        &c.deepep,
        inputs.jit.as_ref().map(|j| j.wheels.as_slice()),
        inputs.large_wheel_bytes,
    )?;
    let lower = LowerLayers {
        store,
        c,
        jit: inputs.jit.as_ref(),
        layout,
        user,
        layout_json,
        steps: &steps,
    };
    // (planned layer, written layer, its claims); the own layer comes last, below.
    let mut built = lower.build(progress, &plan)?;

    // The SBOM, then provenance (which names the SBOM's sha256), then the top layer.
    let sbom = spdx_json(&SbomDocument {
        image: &inputs.name,
        tag: tag.rsplit_once(':').map_or(tag, |(_, t)| t),
        lock_sha256: &inputs.lock_sha256,
        epoch: c.epoch,
        components: components(inputs, c),
    });
    let source = format!("{IMAGE_STEP} {}", key.dir_name());
    let own = own_files(inputs, c, &sbom, &source);
    let own_holds = plan.last().map(|p| p.holds.clone()).unwrap_or_default();
    let (top, provenance_json) = top_layer(store, c, own, own_holds, &built, &steps)?;
    built.push(top);
    write_image(out, inputs, c, user, tag, built, &sbom, &provenance_json)
}

/// A layer as the image step keeps it: as planned, as written, what it claims.
type BuiltLayer = (ImageLayer, Layer, Claims);

/// What the layers below the top one are made from.
struct LowerLayers<'a> {
    store: &'a Store,
    c: &'a Checked,
    jit: Option<&'a JitToolchain>,
    layout: &'a VenvLayout,
    user: &'a ImageUser,
    layout_json: &'a serde_json::Value,
    steps: &'a Path,
}

impl LowerLayers<'_> {
    /// The base, the wheels' and the skeleton's layers of `plan`, each a store step.
    fn build(&self, progress: &dyn Fn(&str), plan: &[PlannedLayer]) -> Result<Vec<BuiltLayer>> {
        let LowerLayers {
            store,
            c,
            jit,
            layout,
            user,
            layout_json,
            steps,
        } = *self;
        let base_claims: Claims = c
            .base
            .manifest
            .files
            .iter()
            .map(|(p, o)| (p.clone(), Origin::Base { origin: o.clone() }))
            .collect();
        // (planned layer, written layer, its claims); the own layer comes last, below.
        let mut built: Vec<(ImageLayer, Layer, Claims)> = Vec::new();
        for (i, planned) in plan.iter().enumerate() {
            progress(&format!(
                "layer {}/{}: {}",
                i + 1,
                plan.len(),
                planned.holds
            ));
            let (layer, claims) = match &planned.kind {
                LayerKind::Base => (c.base.layer(), base_claims.clone()),
                LayerKind::Wheels { .. } => {
                    let step_inputs = json!({
                        "recipe": IMAGE_RECIPE, "epoch": c.epoch, "layout": layout_json,
                        "wheels": planned.wheels.iter().map(|w| json!([w.filename, w.sha256])).collect::<Vec<_>>(),
                    });
                    layer_step(store, &planned.holds, &step_inputs, c.epoch, |tree| {
                        Ok((install_wheels(tree, layout, &planned.wheels)?, vec![]))
                    })?
                }
                LayerKind::Skeleton => {
                    let passwd = String::from_utf8(c.base.read_file("etc/passwd")?)?;
                    let group = String::from_utf8(c.base.read_file("etc/group")?)?;
                    let mut step_inputs = json!({
                        "recipe": IMAGE_RECIPE, "epoch": c.epoch, "layout": layout_json,
                        "passwd": commstack_digest::sha256_hex(&passwd),
                        "group": commstack_digest::sha256_hex(&group),
                    });
                    let cache = jit.map(|_| JIT_CACHE_DIR);
                    if let Some(cache) = cache {
                        step_inputs["jit_cache"] = json!(cache);
                    }
                    let source = format!(
                        "{LAYER_STEP} {}",
                        StepKey::new(LAYER_STEP, &step_inputs).dir_name()
                    );
                    layer_step(store, &planned.holds, &step_inputs, c.epoch, |tree| {
                        write_skeleton(tree, layout, user, &passwd, &group, &source, cache)
                    })?
                }
                LayerKind::CudaToolchain { .. } => {
                    let jit =
                        jit.context("a CUDA toolchain layer is planned without the JIT toolchain")?;
                    let step_inputs = json!({
                        "recipe": IMAGE_RECIPE, "epoch": c.epoch, "prefix": JIT_PREFIX,
                        "cuda_toolchain": planned.wheels.iter().map(|w| json!([w.filename, w.sha256])).collect::<Vec<_>>(),
                    });
                    let source = format!(
                        "{LAYER_STEP} {}",
                        StepKey::new(LAYER_STEP, &step_inputs).dir_name()
                    );
                    layer_step(store, &planned.holds, &step_inputs, c.epoch, |tree| {
                        Ok((install_toolchain(tree, jit, &source)?, vec![]))
                    })?
                }
                LayerKind::Own => continue,
            };
            built.push((
                ImageLayer {
                    holds: planned.holds.clone(),
                    kind: planned.kind.clone(),
                    diff_id: layer.diff_id.clone(),
                    size: layer.size,
                    file: relative_to(&layer.path, steps),
                },
                layer,
                claims,
            ));
        }
        Ok(built)
    }
}

/// The top layer's files, each with its origin: our tools, the data files (preflight.json),
/// stack.lock, constraints.txt,
/// the SBOM and (written later, it names the others) provenance.json.
fn own_files(
    inputs: &ImageInputs,
    c: &Checked,
    sbom: &str,
    source: &str,
) -> BTreeMap<String, (Origin, OwnFile)> {
    let mut own: BTreeMap<String, (Origin, OwnFile)> = BTreeMap::new();
    let mut put = |path: String, name: &str, sha: Option<String>, src: String, file: OwnFile| {
        own.insert(
            path,
            (
                Origin::Own {
                    name: name.to_string(),
                    sha256: sha,
                    source: src,
                },
                file,
            ),
        );
    };
    for (t, sha) in &c.tools {
        put(
            t.image_path.trim_start_matches('/').to_string(),
            &t.name,
            Some(sha.clone()),
            t.source.to_string(),
            OwnFile::Copy(t.host_path.clone(), true),
        );
    }
    for d in &inputs.data {
        let path = d.image_path.trim_start_matches('/').to_string();
        let name = path.rsplit('/').next().unwrap_or(&path).to_string();
        put(
            path,
            &name,
            Some(commstack_digest::sha256_hex(&d.bytes)),
            d.source.clone(),
            OwnFile::Bytes(d.bytes.clone()),
        );
    }
    put(
        format!("{OWN_DIR}/stack.lock"),
        "stack.lock",
        Some(inputs.lock_sha256.clone()),
        // The file name only: the image must not depend on where the checkout is.
        inputs
            .lock_path
            .file_name()
            .map_or_else(|| "stack.lock".into(), |n| n.to_string_lossy().into_owned()),
        OwnFile::Copy(inputs.lock_path.clone(), false),
    );
    put(
        format!("{OWN_DIR}/constraints.txt"),
        "constraints.txt",
        Some(c.constraints_sha256.clone()),
        c.house
            .dir
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        OwnFile::Copy(c.constraints.clone(), false),
    );
    put(
        format!("{OWN_DIR}/sbom.spdx.json"),
        "sbom.spdx.json",
        Some(commstack_digest::sha256_hex(sbom)),
        source.to_string(),
        OwnFile::Bytes(sbom.as_bytes().to_vec()),
    );
    // provenance.json cannot hold its own sha256.
    put(
        format!("{OWN_DIR}/provenance.json"),
        "provenance.json",
        None,
        source.to_string(),
        OwnFile::Bytes(Vec::new()),
    );
    own
}

/// The top layer (a store step): `own`, with provenance.json written over every layer
/// (`built` and the top one). Returns it and provenance.json.
fn top_layer(
    store: &Store,
    c: &Checked,
    mut own: BTreeMap<String, (Origin, OwnFile)>,
    own_holds: String,
    built: &[BuiltLayer],
    steps: &Path,
) -> Result<(BuiltLayer, String)> {
    let own_claims: Claims = own
        .iter()
        .map(|(p, (o, _))| (p.clone(), o.clone()))
        .collect();
    let mut sources: Vec<LayerSource> = built
        .iter()
        .map(|(il, l, claims)| LayerSource {
            holds: il.holds.clone(),
            tar: Some(&l.path),
            claims,
        })
        .collect();
    sources.push(LayerSource {
        holds: own_holds.clone(),
        tar: None,
        claims: &own_claims,
    });
    let provenance_json = provenance(&sources)?.to_json()?;
    own.get_mut(&format!("{OWN_DIR}/provenance.json"))
        .expect("put above")
        .1 = OwnFile::Bytes(provenance_json.clone().into_bytes());

    let own_inputs = json!({
        "recipe": IMAGE_RECIPE, "epoch": c.epoch,
        "files": own.iter().map(|(p, (_, f))| Ok(json!([p, f.sha256()?]))).collect::<Result<Vec<_>>>()?,
    });
    let (top, top_claims) = layer_step(store, &own_holds, &own_inputs, c.epoch, |tree| {
        for (path, (_, file)) in &own {
            let to = tree.join(path);
            fs::create_dir_all(to.parent().expect("a file path"))?;
            file.write(&to)?;
        }
        let mut written = tree_files(tree)?;
        written.sort();
        let planned: Vec<&String> = own.keys().collect();
        if written.iter().collect::<Vec<_>>() != planned {
            bail!("the top layer holds {written:?}, its provenance says {planned:?}");
        }
        Ok((own_claims.clone(), vec![]))
    })?;
    anyhow::ensure!(
        top_claims == own_claims,
        "the top layer's claims differ from its provenance: a bug in the image step"
    );
    Ok((
        (
            ImageLayer {
                holds: own_holds,
                kind: LayerKind::Own,
                diff_id: top.diff_id.clone(),
                size: top.size,
                file: relative_to(&top.path, steps),
            },
            top,
            top_claims,
        ),
        provenance_json,
    ))
}

/// The image step's files: config.json, manifest.json (docker-archive), the SBOM,
/// provenance.json and image.json.
#[allow(clippy::too_many_arguments)]
fn write_image(
    out: &Path,
    inputs: &ImageInputs,
    c: &Checked,
    user: &ImageUser,
    tag: &str,
    built: Vec<BuiltLayer>,
    sbom: &str,
    provenance_json: &str,
) -> Result<()> {
    let layers: Vec<Layer> = built.iter().map(|(_, l, _)| l.clone()).collect();
    let spec = ImageSpec {
        tag: tag.to_string(),
        env: image_env(inputs.jit.as_ref())?,
        cmd: vec![VENV_PYTHON.to_string()],
        user: Some(format!("{}:{}", user.uid, user.gid)),
        working_dir: Some(format!("/{}", user.home())),
        labels: labels(inputs, c),
        epoch: c.epoch,
        layer_comments: built.iter().map(|(il, _, _)| il.holds.clone()).collect(),
    };
    let config = image_config(&spec, &layers)?;
    let config_hex = commstack_digest::sha256_hex(config.as_bytes());
    fs::write(out.join("config.json"), &config)?;
    fs::write(
        out.join("manifest.json"),
        archive_manifest(&spec, &config_hex, &layers),
    )?;
    fs::write(out.join("sbom.spdx.json"), sbom)?;
    fs::write(out.join("provenance.json"), provenance_json)?;
    let manifest = ImageManifest {
        schema: 1,
        id: format!("sha256:{config_hex}"),
        tag: tag.to_string(),
        lock_sha256: inputs.lock_sha256.clone(),
        spec,
        layers: built.into_iter().map(|(il, _, _)| il).collect(),
    };
    fs::write(
        out.join(IMAGE_FILE),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(())
}

/// A file of the top layer: copied (executable or not) or written.
enum OwnFile {
    Copy(PathBuf, bool),
    Bytes(Vec<u8>),
}

impl OwnFile {
    fn sha256(&self) -> Result<String> {
        Ok(match self {
            OwnFile::Copy(p, _) => commstack_digest::sha256_file(p)?,
            OwnFile::Bytes(b) => commstack_digest::sha256_hex(b),
        })
    }

    fn write(&self, to: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        match self {
            OwnFile::Copy(from, exec) => {
                fs::copy(from, to).with_context(|| format!("cannot copy {}", from.display()))?;
                let mode = if *exec { 0o755 } else { 0o644 };
                fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
            }
            OwnFile::Bytes(b) => fs::write(to, b)?,
        }
        Ok(())
    }
}

/// Runs (or finds) one layer step: `fill` writes the tree and says what claims its files
/// and who owns what; the step keeps layer.tar and layer.json (not the tree).
fn layer_step(
    store: &Store,
    holds: &str,
    inputs: &serde_json::Value,
    epoch: u64,
    fill: impl FnOnce(&Path) -> Result<(Claims, Vec<Owner>)>,
) -> Result<(Layer, Claims)> {
    let key = StepKey::new(LAYER_STEP, inputs);
    let outcome = store
        .run(&key, inputs, false, |dir| {
            let tree = dir.out.join("tree");
            fs::create_dir_all(&tree)?;
            let (claims, owners) = fill(&tree)?;
            let layer = write_layer_owned(&tree, &dir.out.join(LAYER_FILE), epoch, &owners)?;
            fs::remove_dir_all(&tree)?;
            let record = LayerRecord {
                holds: holds.to_string(),
                diff_id: layer.diff_id,
                size: layer.size,
                claims,
            };
            fs::write(dir.out.join(LAYER_JSON), serde_json::to_string(&record)?)?;
            Ok(())
        })
        .with_context(|| format!("cannot make the layer: {holds}"))?;
    let path = outcome.path().join(LAYER_JSON);
    let record: LayerRecord = serde_json::from_str(
        &fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?,
    )
    .with_context(|| format!("{} is not a layer record", path.display()))?;
    Ok((
        Layer {
            path: outcome.path().join(LAYER_FILE),
            diff_id: record.diff_id,
            size: record.size,
        },
        record.claims,
    ))
}

/// layer.json of a layer step.
#[derive(Serialize, Deserialize)]
struct LayerRecord {
    holds: String,
    diff_id: String,
    size: u64,
    claims: Claims,
}

fn relative_to(path: &Path, steps: &Path) -> String {
    path.strip_prefix(steps)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn components(inputs: &ImageInputs, c: &Checked) -> Vec<Component> {
    let mut out = Vec::new();
    for p in &c.base.manifest.packages {
        out.push(Component {
            kind: ComponentKind::Deb {
                architecture: p.architecture.clone(),
            },
            name: p.name.clone(),
            version: p.version.clone(),
            sha256: p.sha256.clone(),
            download: inputs
                .lock
                .debs
                .iter()
                .find(|d| d.name == p.name)
                .map(|d| d.url.clone()),
        });
    }
    for w in &c.closure {
        out.push(Component {
            kind: ComponentKind::Wheel,
            name: w.name.clone(),
            version: w.version.clone(),
            sha256: w.sha256.clone(),
            download: inputs
                .lock
                .packages
                .iter()
                .find(|p| p.filename == w.filename)
                .map(|p| p.url.clone()),
        });
    }
    for w in [&c.dropin, &c.deepep] {
        out.push(Component {
            kind: ComponentKind::Own { application: false },
            name: w.name.clone(),
            version: w.version.clone(),
            sha256: w.sha256.clone(),
            download: None,
        });
    }
    for (t, sha) in &c.tools {
        out.push(Component {
            kind: ComponentKind::Own { application: true },
            name: t.name.clone(),
            version: t.version.clone(),
            sha256: sha.clone(),
            download: None,
        });
    }
    out
}

fn labels(inputs: &ImageInputs, c: &Checked) -> BTreeMap<String, String> {
    let r = &inputs.lock.resolved;
    [
        ("org.opencontainers.image.source", inputs.source_url.clone()),
        ("org.opencontainers.image.revision", inputs.revision.clone()),
        ("org.opencontainers.image.created", rfc3339(c.epoch)),
        ("org.opencontainers.image.title", inputs.name.clone()),
        ("dev.commstack.lock.sha256", inputs.lock_sha256.clone()),
        ("dev.commstack.torch", r.torch.clone()),
        ("dev.commstack.nccl", r.nccl.version.to_string()),
        ("dev.commstack.nvshmem", c.dropin.version.clone()),
        ("dev.commstack.deepep", c.deepep.version.clone()),
        ("dev.commstack.cuda", r.cuda.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// `<name>:<first 12 hex of the lock's sha256>-g<first 12 hex of the commit>`: the lock
/// and the commstack commit both decide the image (the tools in it are built from the
/// commit), so an image of the same lock built from another commit gets a tag of its own
/// instead of taking the earlier image's. Without a commit (not a git checkout), the
/// lock's part alone.
pub fn image_tag(name: &str, lock_sha256: &str, revision: &str) -> String {
    let short = |hex: &str| hex[..12.min(hex.len())].to_string();
    match revision.is_empty() {
        true => format!("{name}:{}", short(lock_sha256)),
        false => format!("{name}:{}-g{}", short(lock_sha256), short(revision)),
    }
}

#[cfg(test)]
mod tag_tests {
    use super::image_tag;

    #[test]
    fn another_commit_of_the_same_lock_gets_another_tag() {
        let lock = "ab12cd34ef56ab12cd34ef56";
        let one = image_tag("commstack", lock, "0123456789abcdef0123");
        assert_eq!(one, "commstack:ab12cd34ef56-g0123456789ab");
        assert_ne!(one, image_tag("commstack", lock, "fedcba9876543210fedc"));
        assert_eq!(one, image_tag("commstack", lock, "0123456789abcdef0123"));
        assert_eq!(image_tag("commstack", lock, ""), "commstack:ab12cd34ef56");
    }
}

#[cfg(test)]
mod env_tests {
    use super::{ENV, locked_image_env};
    use commstack_stack::Lock;

    fn shipped(rel: &str) -> Lock {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(rel);
        Lock::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// The shipped V1 lock's image has [`ENV`]; the V2 lock's adds its JIT toolchain's
    /// CUDA_HOME (nvcc 13.x: cu13) and cache; a V2 lock without nvcc names the lock.
    #[test]
    fn the_locks_decide_the_images_environment() {
        assert_eq!(locked_image_env(&shipped("stack.lock")).unwrap(), ENV);
        let mut v2 = shipped("stacks/v2.lock");
        let env = locked_image_env(&v2).unwrap();
        assert_eq!(env[..ENV.len()], *ENV);
        assert_eq!(
            env[ENV.len()..],
            [
                "CUDA_HOME=/opt/commstack/cuda/nvidia/cu13",
                "EP_JIT_CACHE_DIR=/var/cache/deep_ep"
            ]
        );
        v2.toolchain.retain(|w| w.name != "nvidia-cuda-nvcc");
        let err = locked_image_env(&v2).unwrap_err().to_string();
        assert!(
            err.contains("no nvidia-cuda-nvcc wheel") && err.contains("cargo xtask lock"),
            "{err}"
        );
    }
}
