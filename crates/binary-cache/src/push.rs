//! `cargo xtask cache push`: the binary cache's push side. Every graph step of the store
//! that ships something (nvshmem, dropin, kernels, deepep, wheelhouse, base, image) goes to
//! the registry as an OCI artifact tagged `<step>-<key>` (the store's directory name
//! without `pipeline-`): its config the step's provenance (key, inputs, result, the
//! manifest of what it ships), its one layer a tar of exactly the shipped files, checked
//! against that manifest first. Each is signed in cosign's format (ed25519 over a
//! simple-signing payload of the manifest digest, crates/registry/src/sign.rs), the
//! signature a referrer of it or under its `sha256-<hex>.sig` tag.
//!
//! What the steps after it read of a step's output is more than the shipped files: the
//! result points into a crate's own store step (`nvshmem-<hash>`, whose build report the
//! drop-in step reads beside the install). So the artifact carries that whole directory:
//! the shipped files in the first layer (the same bytes for the same files anywhere), the
//! rest of the directory in a second (reports; logs left out), and the directory's name and
//! description (`.step.json`) in the config, so that `build --substitute` makes the same
//! store step in another home (crate keys hold no path of the home, issue 17).
//!
//! The image step's directory names its layers' tars, which lie in store steps of their
//! own (`image-layer-<hash>`, crates/image): the image's artifact carries those steps whole
//! after its first two layers, one layer per file as it is (a layer tar's blob digest is its
//! diff_id), each step named in the config with its `.step.json` (`carried_steps`), so a
//! substituting home has the image and every layer `load`, `verify` and `--oci` read
//! without writing a layer or compiling the verify tool.
//!
//! The config is [`crate::config::StepConfig`], the one type the pull side reads
//! back; it names no path of this machine, and it is checked here by the check a puller
//! makes before it is pushed. An output that entered this store without a trusted
//! signature (`--allow-unsigned`) is not pushed: signed here, it would look built here.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_digest::manifest::Entry;
use commstack_registry::artifact::{Artifact, write_artifact_layout};
use commstack_registry::{PushOptions, PushedSigned, Target};
use commstack_store::{StepKey, Store};
use serde::Serialize;

use crate::config::{
    ArtifactKinds, CARRIED_FILE_MEDIA_TYPE, CONFIG_SCHEMA, CarriedFile, CarriedStep, Expected,
    KEY_ANNOTATION, LAYER_MEDIA_TYPE, ResultConfig, STEP_ARTIFACT_TYPE, STEP_CONFIG_MEDIA_TYPE,
    StepConfig, StepDirConfig, facts_for_the_wire,
};
use commstack_steps::ctx::Ctx;
use commstack_steps::graph::{Shipped, StepId, StoredResult, stored_result};

/// What to push where, signed with what.
#[derive(Clone, Debug)]
pub struct CachePushRequest {
    /// `HOST[:PORT]/REPO` of the cache repository.
    pub registry: String,
    /// The ed25519 private key (PKCS#8 PEM) that signs each output.
    pub key: PathBuf,
    /// Only these steps (all that ship when empty).
    pub steps: Vec<StepId>,
    pub ca_file: Option<PathBuf>,
    pub jobs: usize,
    /// None: from the environment and Docker's config file (tests give their own).
    pub credentials: Option<commstack_registry::Credentials>,
    /// Where the registry has the referrers API, put each signature under cosign's tag too.
    pub signature_tag: bool,
}

/// One pushed step output.
#[derive(Clone, Debug, Serialize)]
pub struct PushedStep {
    pub step: String,
    /// The store's directory name: `pipeline-<step>-<key>`.
    pub key: String,
    pub files: usize,
    #[serde(flatten)]
    pub pushed: PushedSigned,
}

/// Pushes the store's shipped step outputs; `say` reports each.
pub fn cache_push(
    ctx: &Ctx,
    request: &CachePushRequest,
    say: &dyn Fn(&str),
) -> Result<Vec<PushedStep>> {
    let target = Target::parse(&request.registry)?;
    let key = commstack_registry::sign::read_signing_key(&request.key)?;
    let store = Store::open(ctx.store_dir())?;
    let found = shipped_steps(&store, &request.steps, say)?;
    let mut options = PushOptions::new(target);
    options.ca_file = request.ca_file.clone();
    options.jobs = request.jobs.max(1);
    options.credentials = request.credentials.clone();
    options.progress = !ctx.quiet;
    options.tag_referrers = request.signature_tag;
    let staging_root = ctx.home.join("push");
    std::fs::create_dir_all(&staging_root)
        .with_context(|| format!("cannot create {}", staging_root.display()))?;
    // Who pushes: the same for every output (it runs git, so once).
    let builder = serde_json::from_value(commstack_steps::util::builder())?;
    let mut pushed = Vec::new();
    for (id, step_key, inputs, stored) in found {
        let dir_name = step_key.dir_name();
        let staging = tempfile::Builder::new()
            .prefix("cache-")
            .tempdir_in(&staging_root)
            .with_context(|| format!("cannot create a directory in {}", staging_root.display()))?;
        let layout = step_layout(
            id,
            &step_key,
            &inputs,
            &stored,
            &store,
            staging.path(),
            &builder,
        )
        .with_context(|| format!("packing the output of step {id} ({dir_name})"))?;
        let files = stored.shipped.as_ref().map_or(0, |s| s.files.len());
        options.tag = Some(dir_name.trim_start_matches("pipeline-").to_string());
        let signed = commstack_registry::push_signed(&layout, &key, &options)
            .with_context(|| format!("pushing the output of step {id} ({dir_name})"))?;
        say(&format!(
            "{id}: {}:{} = {} ({files} files, {} uploaded), signature {} by {}",
            signed
                .pushed
                .reference
                .split('@')
                .next()
                .unwrap_or_default(),
            options.tag.as_deref().unwrap_or_default(),
            signed.pushed.manifest_digest,
            commstack_steps::util::human(signed.pushed.bytes_uploaded),
            signed.signature,
            signed.signed_by
        ));
        pushed.push(PushedStep {
            step: id.name().to_string(),
            key: dir_name,
            files,
            pushed: signed,
        });
    }
    Ok(pushed)
}

/// A graph step of the store that ships, to push: its id, key, inputs and result.
type ToPush = (StepId, StepKey, serde_json::Value, StoredResult);

/// The graph steps of `store` that ship (of `only`, when not empty). One that entered
/// without a trusted signature is left out, and said: signed here, it would look built
/// here.
fn shipped_steps(store: &Store, only: &[StepId], say: &dyn Fn(&str)) -> Result<Vec<ToPush>> {
    let mut found = Vec::new();
    let mut unsigned = Vec::new();
    for entry in store.list()? {
        let Some(meta) = entry.meta else { continue };
        let Some(step) = meta.step.strip_prefix("pipeline-") else {
            continue;
        };
        let Some(id) = StepId::ALL.into_iter().find(|s| s.name() == step) else {
            continue;
        };
        if !only.is_empty() && !only.contains(&id) {
            continue;
        }
        let step_key = meta.key();
        let Some(stored) = stored_result(store, &step_key)? else {
            continue;
        };
        if stored.shipped.is_none() {
            continue;
        }
        if let Some(why) = &meta.unsigned {
            say(&format!(
                "{id}: not pushed: its output entered this store without a trusted signature ({why}); build it here to push it (`cargo xtask build --only {id} --force`)"
            ));
            unsigned.push(id.name());
            continue;
        }
        found.push((id, step_key, meta.inputs, stored));
    }
    if found.is_empty() && !unsigned.is_empty() {
        bail!(
            "the store {} holds no shipped output that entered it signed or was built here ({} entered without a trusted signature): build them here first (`cargo xtask build --no-substitute --force`)",
            store.root().display(),
            unsigned.join(", ")
        );
    }
    if found.is_empty() {
        let of: Vec<&str> = only.iter().map(|s| s.name()).collect();
        bail!(
            "the store {} holds no shipped output{}: build first (`cargo xtask build`)",
            store.root().display(),
            match of.is_empty() {
                true => String::new(),
                false => format!(" of {}", of.join(", ")),
            }
        );
    }
    Ok(found)
}

/// The OCI layout of one step output in `staging/oci`: the shipped files linked into
/// `staging/tree` and checked against the manifest the step recorded, their tar, the
/// provenance config.
fn step_layout(
    id: StepId,
    key: &StepKey,
    inputs: &serde_json::Value,
    stored: &StoredResult,
    store: &Store,
    staging: &Path,
    builder: &crate::config::Builder,
) -> Result<PathBuf> {
    let store_root = store.root();
    let dir_name = key.dir_name();
    let shipped = stored.shipped.as_ref().context("the step ships nothing")?;
    let step_dir = StepDirOf::find(store_root, &shipped.root).with_context(|| {
        format!("step {id}: what it ships is not in a step of the store, so another home could not make it again")
    })?;
    let single_file = std::fs::symlink_metadata(&shipped.root)
        .with_context(|| {
            format!(
                "the output {} is gone: build it again (`cargo xtask build --only {id} --force`)",
                shipped.root.display()
            )
        })?
        .is_file();
    let tree = staging.join("tree");
    link_shipped(id, shipped, single_file, &tree)?;
    let tar = staging.join(format!("{dir_name}.tar"));
    commstack_image::write_layer(&tree, &tar, 0)?;
    // The rest of the crate's step directory, linked like the shipped files.
    let rest = staging.join("rest");
    let shipped_paths: std::collections::BTreeSet<PathBuf> = match single_file {
        true => [step_dir.shipped.clone()].into(),
        false => shipped
            .files
            .keys()
            .map(|k| step_dir.shipped.join(k))
            .collect(),
    };
    link_rest(&step_dir.path, &shipped_paths, &rest)?;
    let rest_tar = staging.join(format!("{dir_name}.rest.tar"));
    commstack_image::write_layer(&rest, &rest_tar, 0)?;
    let carried = carried_steps(store, &shipped.root)
        .with_context(|| format!("step {id}: the store steps its output names"))?;
    let mut layers = vec![
        (LAYER_MEDIA_TYPE.to_string(), tar),
        (LAYER_MEDIA_TYPE.to_string(), rest_tar),
    ];
    for (_, files) in &carried {
        for file in files {
            layers.push((CARRIED_FILE_MEDIA_TYPE.to_string(), file.clone()));
        }
    }
    let config = StepConfig {
        schema: CONFIG_SCHEMA,
        key: dir_name.clone(),
        inputs: inputs.clone(),
        result: result_config(id, stored, &step_dir.path, store_root)?,
        step_dir: StepDirConfig {
            name: step_dir.name.clone(),
            meta: step_dir.meta.clone(),
            shipped: step_dir.shipped.clone(),
            shipped_is_file: single_file,
        },
        carried_steps: carried.into_iter().map(|(c, _)| c).collect(),
        layers: vec![
            "shipped".into(),
            "rest".into(),
            "the carried steps' files, in order".into(),
        ],
        pushed_by: format!("commstack {}", env!("CARGO_PKG_VERSION")),
        builder: Some(builder.clone()),
    };
    // What a puller will check, checked before anything is sent.
    config
        .validate(&Expected {
            key,
            step: id.name(),
            kinds: &ArtifactKinds {
                own: step_dir.meta.step.clone(),
                carried: config
                    .carried_steps
                    .iter()
                    .map(|c| c.meta.step.clone())
                    .collect(),
            },
            layers: layers.len(),
        })
        .with_context(|| format!("step {id}: what would be pushed"))?;
    let layout = staging.join("oci");
    write_artifact_layout(
        &Artifact {
            artifact_type: STEP_ARTIFACT_TYPE.to_string(),
            config_media_type: STEP_CONFIG_MEDIA_TYPE.to_string(),
            config: commstack_digest::canonical_json(&serde_json::to_value(&config)?).into_bytes(),
            layers,
            annotations: [(KEY_ANNOTATION.to_string(), dir_name)].into(),
            subject: None,
        },
        &layout,
    )?;
    Ok(layout)
}

/// Links the shipped files into `tree`, and checks that they are what the step recorded,
/// byte for byte and mode for mode.
fn link_shipped(id: StepId, shipped: &Shipped, single_file: bool, tree: &Path) -> Result<()> {
    std::fs::create_dir_all(tree)?;
    for (rel, entry) in &shipped.files {
        let from = match single_file {
            true => shipped.root.clone(),
            false => shipped.root.join(rel),
        };
        let to = tree.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match entry {
            Entry::Link { target } => std::os::unix::fs::symlink(target, &to)?,
            Entry::File { .. } => {
                if std::fs::hard_link(&from, &to).is_err() {
                    std::fs::copy(&from, &to)
                        .with_context(|| format!("cannot read {}", from.display()))?;
                }
            }
        }
    }
    // What is pushed is what the step recorded, byte for byte and mode for mode.
    let now = commstack_digest::manifest::manifest(tree, &|_| false)
        .with_context(|| format!("hashing {}", tree.display()))?;
    let differences = commstack_digest::manifest::differences(&shipped.files, &now);
    if !differences.is_empty() {
        let named =
            commstack_digest::manifest::named_differences(&shipped.files, &now, "not recorded");
        bail!(
            "the store's output {} is not what the step recorded ({} file(s) differ: {}): nothing was pushed; build it again (`cargo xtask build --only {id} --force`)",
            shipped.root.display(),
            differences.len(),
            named.join("; ")
        );
    }
    Ok(())
}

/// Links into `rest` every file and link of the step directory `dir` but the shipped ones
/// and what no other home needs (logs, the store's records).
fn link_rest(dir: &Path, shipped: &std::collections::BTreeSet<PathBuf>, rest: &Path) -> Result<()> {
    std::fs::create_dir_all(rest)?;
    for entry in walkdir::WalkDir::new(dir).min_depth(1) {
        let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
        let rel = entry.path().strip_prefix(dir)?.to_path_buf();
        if entry.file_type().is_dir() || shipped.contains(&rel) || not_carried(&rel) {
            continue;
        }
        let to = rest.join(&rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match entry.file_type().is_symlink() {
            true => std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &to)?,
            false => {
                if std::fs::hard_link(entry.path(), &to).is_err() {
                    std::fs::copy(entry.path(), &to)
                        .with_context(|| format!("cannot read {}", entry.path().display()))?;
                }
            }
        }
    }
    Ok(())
}

/// The step's result for the artifact's config, with no path of this machine: its output
/// relative to its crate step `step_dir`, store paths in its facts relative to the store
/// (another absolute path is an error: another home has no such file).
fn result_config(
    id: StepId,
    stored: &StoredResult,
    step_dir: &Path,
    store_root: &Path,
) -> Result<ResultConfig> {
    let shipped = stored.shipped.as_ref().context("the step ships nothing")?;
    let output = match &stored.result.output {
        None => None,
        Some(output) => Some(
            output
                .strip_prefix(step_dir)
                .with_context(|| {
                    format!(
                        "step {id}: its output {} is not in its store step {}, so another home could not make it again",
                        output.display(),
                        step_dir.display()
                    )
                })?
                .to_path_buf(),
        ),
    };
    Ok(ResultConfig {
        output,
        facts: facts_for_the_wire(&stored.result.facts, store_root)
            .with_context(|| format!("step {id}'s facts"))?,
        shipped: shipped.files.clone(),
    })
}

/// The store steps an output names that no graph step's artifact carries: an image step
/// (its `image.json`) names its layers' tars relative to the store's `steps/`; all but the
/// base's lie in `image-layer-<hash>` steps of their own, which the image's artifact
/// carries whole (the base's is the base step's, pulled with it). The files go as they
/// are (a layer tar's blob digest is its diff_id), hashed here.
/// Each with where its files are in this store. A step that entered unsigned is not
/// carried (signed here, it would look built here).
fn carried_steps(store: &Store, shipped_root: &Path) -> Result<Vec<(CarriedStep, Vec<PathBuf>)>> {
    let store_root = store.root();
    let image_json = shipped_root.join(commstack_image::assemble::IMAGE_FILE);
    if !image_json.is_file() {
        return Ok(Vec::new());
    }
    let image: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&image_json)
            .with_context(|| format!("reading {}", image_json.display()))?,
    )
    .with_context(|| format!("{} is not JSON", image_json.display()))?;
    let prefix = format!("{}-", commstack_image::assemble::LAYER_STEP);
    let steps = store_root.join("steps");
    let mut names = Vec::new();
    for layer in image["layers"].as_array().into_iter().flatten() {
        let file = layer["file"]
            .as_str()
            .with_context(|| format!("{}: a layer without a file", image_json.display()))?;
        let Some(std::path::Component::Normal(name)) = Path::new(file).components().next() else {
            continue;
        };
        let name = name.to_string_lossy().into_owned();
        if name.starts_with(&prefix) && !names.contains(&name) {
            names.push(name);
        }
    }
    let mut carried = Vec::new();
    for name in names {
        let dir = steps.join(&name);
        let meta_file = dir.join(commstack_store::META_FILE);
        let meta: commstack_store::StepMeta = serde_json::from_str(
            &std::fs::read_to_string(&meta_file).with_context(|| {
                format!(
                    "reading {} (the image names a layer in it; `cargo xtask build image --force` makes it again)",
                    meta_file.display()
                )
            })?,
        )
        .with_context(|| format!("{} is not a step description", meta_file.display()))?;
        if let Some(why) = &meta.unsigned {
            bail!(
                "the image names a layer in {name}, which entered this store without a trusted signature ({why}): build the image here to push it (`cargo xtask build --only image --force`)"
            );
        }
        let (mut files, mut from) = (Vec::new(), Vec::new());
        for entry in walkdir::WalkDir::new(&dir).min_depth(1).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
            let rel = entry.path().strip_prefix(&dir)?.to_path_buf();
            if entry.file_type().is_dir() || not_carried(&rel) {
                continue;
            }
            if !entry.file_type().is_file() {
                bail!("{} is not a plain file", entry.path().display());
            }
            use std::os::unix::fs::PermissionsExt;
            let meta = entry.metadata()?;
            files.push(CarriedFile {
                sha256: commstack_digest::sha256_file(entry.path())
                    .with_context(|| format!("hashing {}", entry.path().display()))?,
                size: meta.len(),
                executable: meta.permissions().mode() & 0o111 != 0,
                path: rel,
            });
            from.push(entry.path().to_path_buf());
        }
        carried.push((CarriedStep { name, meta, files }, from));
    }
    Ok(carried)
}

/// The crate's store step a shipped root lies in: `<store>/steps/<name>/<shipped>`.
pub(crate) struct StepDirOf {
    pub name: String,
    pub path: PathBuf,
    /// The shipped root, relative to the step directory ("" when it is the directory).
    pub shipped: PathBuf,
    /// Its `.step.json`, which names its key and inputs.
    pub meta: commstack_store::StepMeta,
}

impl StepDirOf {
    fn find(store_root: &Path, root: &Path) -> Result<StepDirOf> {
        let steps = store_root.join("steps");
        let rel = root
            .strip_prefix(&steps)
            .with_context(|| format!("{} is not under {}", root.display(), steps.display()))?;
        let mut parts = rel.components();
        let name = parts
            .next()
            .with_context(|| format!("{} is the store's steps/ itself", root.display()))?
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        if name.starts_with("pipeline-") {
            bail!(
                "{} lies in a graph step, not in a crate's step",
                root.display()
            );
        }
        let path = steps.join(&name);
        let meta_file = path.join(commstack_store::META_FILE);
        let meta: commstack_store::StepMeta = serde_json::from_str(
            &std::fs::read_to_string(&meta_file)
                .with_context(|| format!("reading {}", meta_file.display()))?,
        )
        .with_context(|| format!("{} is not a step description", meta_file.display()))?;
        Ok(StepDirOf {
            name,
            path,
            shipped: parts.as_path().to_path_buf(),
            meta,
        })
    }
}

/// What of a crate's step directory no other home needs: the store's own records (a
/// substituted step gets its own) and the build's logs.
fn not_carried(rel: &Path) -> bool {
    rel.starts_with("logs")
        || rel == Path::new(commstack_store::META_FILE)
        || rel == Path::new(".used")
}
