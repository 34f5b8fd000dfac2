//! `build --substitute` against a real registry (testkit's docker-registry with TLS and
//! htpasswd): the graph's keyed steps built in one home with fixture recipes (real files
//! in the recipes' own store steps, the production keys of the bookworm stack), pushed
//! with `cache push` and a key made by openssl, then substituted into an empty home: the
//! same keys and the same bytes, and no recipe runs for a substituted step. Then the
//! faults: a blob altered in the registry's storage, an untrusted signature, a missing
//! blob, wrong credentials, the registry killed midway: each a clear error, nothing sealed
//! in the store that should not be, and the rerun completes.
//!
//! docker-registry, htpasswd and openssl are required (the test fails without them);
//! COMMSTACK_SKIP_REGISTRY_TESTS=1 skips it instead.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use StepId::*;
use anyhow::{Context, Result, bail};
use commstack_binary_cache::config::ArtifactKinds;
use commstack_binary_cache::pull::{SubstituteRequest, Substituter};
use commstack_binary_cache::push::{CachePushRequest, cache_push};
use commstack_digest::{canonical_json, sha256_hex};
use commstack_graph::Substitute;
use commstack_registry::{Credentials, PushOptions, RegistryAuth, RetryPolicy, Target};
use commstack_steps::ctx::Ctx;
use commstack_steps::graph::Record;
use commstack_steps::graph::{
    Decision, Done, Engine, Planned, Pulled, Selection, Status, StepId, StepResult, Steps,
    StoredResult,
};
use commstack_steps::options::BuildOptions;
use commstack_steps::options::GlobalOptions;
use commstack_steps::stack_steps::{ImageOptions, StackSteps};
use commstack_store::{META_FILE, StepKey, Store};
use commstack_testkit::registry::ed25519_key;
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry, skip_registry_tests};
use serde_json::json;

const REPO: &str = "cache/steps";

/// The default stack (it has [image]) and its lock, copied as they are.
fn write_stack(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::create_dir_all(dir).unwrap();
    for file in ["stack.toml", "stack.lock"] {
        std::fs::copy(root.join(file), dir.join(file)).unwrap();
    }
    dir.join("stack.toml")
}

/// As the stack's own steps: each keyed step's output is in a store step of its kind
/// (`<kind>-<step>-<hash>` for the recipes of `kind`), and the image's artifact carries
/// its layer steps.
fn fixture_kinds(kind: &str, step: StepId) -> Option<ArtifactKinds> {
    step.keyed().then(|| ArtifactKinds {
        own: format!("{kind}-{}", step.name()),
        carried: match step {
            Image => vec![commstack_image::assemble::LAYER_STEP.to_string()],
            _ => Vec::new(),
        },
    })
}

fn ctx_for(stack: &Path, home: &Path) -> Result<Ctx> {
    Ctx::new(GlobalOptions {
        stack: Some(stack.to_path_buf()),
        home: Some(home.to_path_buf()),
        quiet: true,
    })
}

// ---------------------------------------------------------------------------------------
// The recipes
// ---------------------------------------------------------------------------------------

/// Keys from a real [`StackSteps`]; each keyed step's recipe writes files made from its
/// inputs and its upstream outputs into a store step of its own (`fixture-<step>`), as
/// the crates do. NVSHMEM's is a directory like the real one: an install (`nvshmem/`,
/// what it ships: a library with the executable bit, a header, a link) and a report beside
/// it that the drop-in's recipe reads, as the real drop-in reads NVSHMEM's build report.
struct Recipes<'a> {
    stack: StackSteps<'a>,
    /// The kind of the store steps the recipes make (`<kind>-<step>-<hash>`): `fixture`.
    kind: &'static str,
    store: Store,
    markers: PathBuf,
    /// Mutexes: [`Steps`] is Sync (two steps may run at once).
    ran: Mutex<Vec<StepId>>,
    here: Mutex<Option<BTreeSet<StepId>>>,
}

/// The outputs a step's recipe reads (through fetch and load, which have none).
fn data_deps(step: StepId) -> Vec<StepId> {
    step.deps()
        .iter()
        .flat_map(|&d| match d.keyed() {
            true => vec![d],
            false => data_deps(d),
        })
        .collect()
}

/// What `step` ships, given its result.
fn shipped_root(step: StepId, result: &StepResult) -> Option<PathBuf> {
    let output = result.output.clone()?;
    match step {
        Nvshmem => Some(output.join("nvshmem")),
        s if s.keyed() => Some(output),
        _ => None,
    }
}

/// Every file's sha256, size and mode (and every link's target) under `path`: equal
/// fingerprints are equal bytes.
fn fingerprint(path: &Path) -> Result<String> {
    let m = commstack_digest::manifest::manifest(path, &|_| false)
        .with_context(|| format!("hashing {}", path.display()))?;
    Ok(sha256_hex(canonical_json(&serde_json::to_value(m)?)))
}

fn fingerprint_of(done: &Done, step: StepId) -> Result<String> {
    let root = done
        .get(&step)
        .and_then(|r| shipped_root(step, r))
        .with_context(|| format!("step {step} has no output"))?;
    fingerprint(&root)
}

impl Recipes<'_> {
    fn recipe(&self, step: StepId, done: &Done) -> Result<StepResult> {
        let mut text = format!("{step}\n{}\n", canonical_json(&self.stack.inputs(step)?));
        for dep in data_deps(step) {
            text.push_str(&format!("{dep} {}\n", fingerprint_of(done, dep)?));
        }
        if step == Dropin {
            let nvshmem = done[&Nvshmem].output.clone().context("nvshmem's output")?;
            let report = std::fs::read_to_string(nvshmem.join("report.json"))
                .context("the drop-in reads NVSHMEM's report")?;
            text.push_str(&format!("report {report}\n"));
        }
        let inputs = json!({ "text": text });
        let key = StepKey::new(&format!("{}-{}", self.kind, step.name()), &inputs);
        let made = self.store.run(&key, &inputs, false, |dir| {
            use std::os::unix::fs::PermissionsExt;
            match step {
                Nvshmem => {
                    let lib = dir.out.join("nvshmem/lib");
                    std::fs::create_dir_all(&lib)?;
                    std::fs::create_dir_all(dir.out.join("nvshmem/include"))?;
                    std::fs::write(lib.join("libnvshmem_host.so.3"), &text)?;
                    std::fs::set_permissions(
                        lib.join("libnvshmem_host.so.3"),
                        std::fs::Permissions::from_mode(0o755),
                    )?;
                    std::os::unix::fs::symlink(
                        "libnvshmem_host.so.3",
                        lib.join("libnvshmem_host.so"),
                    )?;
                    std::fs::write(dir.out.join("nvshmem/include/nvshmem.h"), "/* h */\n")?;
                    std::fs::write(
                        dir.out.join("report.json"),
                        format!("{{\"of\":\"{}\"}}", sha256_hex(&text)),
                    )?;
                }
                // As the image crate makes it: the image step's files (image.json names
                // each layer's tar relative to the store's steps/), each layer a store
                // step of its own (`image-layer-<hash>`: layer.tar, layer.json).
                Image => {
                    let mut layers = Vec::new();
                    for i in 0..2 {
                        let tar = format!("layer {i}\n{text}");
                        let inputs = json!({ "layer": sha256_hex(&tar) });
                        let key = StepKey::new(commstack_image::assemble::LAYER_STEP, &inputs);
                        self.store.run(&key, &inputs, false, |l| {
                            std::fs::write(l.out.join("layer.tar"), &tar)?;
                            std::fs::write(
                                l.out.join("layer.json"),
                                format!("{{\"diff_id\":\"sha256:{}\"}}", sha256_hex(&tar)),
                            )?;
                            Ok(())
                        })?;
                        layers.push(json!({
                            "file": format!("{}/layer.tar", key.dir_name()),
                            "size": tar.len(),
                        }));
                    }
                    std::fs::create_dir_all(dir.out.join("image"))?;
                    std::fs::write(
                        dir.out.join("image/image.json"),
                        canonical_json(&json!({ "layers": layers })),
                    )?;
                    std::fs::write(dir.out.join("image/image.out"), &text)?;
                }
                _ => std::fs::write(dir.out.join(format!("{}.out", step.name())), &text)?,
            }
            Ok(())
        })?;
        Ok(StepResult {
            output: Some(match step {
                Nvshmem => made.path().to_path_buf(),
                Image => made.path().join("image"),
                _ => made.path().join(format!("{}.out", step.name())),
            }),
            facts: json!({ "bytes": text.len(), "dir": made.path() }),
        })
    }

    fn loaded_marker(&self, done: &Done) -> Result<PathBuf> {
        Ok(self
            .markers
            .join(format!("loaded-{}", fingerprint_of(done, Image)?)))
    }
}

impl Steps<StepId> for Recipes<'_> {
    fn skipped(&self, step: StepId) -> Option<String> {
        self.stack.skipped(step)
    }

    fn inputs(&self, step: StepId) -> Result<serde_json::Value> {
        self.stack.inputs(step)
    }

    fn pending(&self, step: StepId, done: &Done) -> Result<Option<String>> {
        Ok(match step {
            Lock => None,
            // Nothing to download when no step that reads the cache is built here.
            Fetch
                if self
                    .here
                    .lock()
                    .unwrap()
                    .as_ref()
                    .is_some_and(|h| h.is_empty()) =>
            {
                None
            }
            Fetch => (!self.markers.join("fetched").exists()).then(|| "not fetched".into()),
            Load => (!self.loaded_marker(done)?.exists()).then(|| "not loaded".into()),
            _ => bail!("step {step} is keyed"),
        })
    }

    fn run(&self, step: StepId, done: &Done, _say: &dyn Fn(&str)) -> Result<StepResult> {
        self.ran.lock().unwrap().push(step);
        let marker = match step {
            Lock => bail!("the lock is made before the graph runs"),
            Fetch => self.markers.join("fetched"),
            Load => self.loaded_marker(done)?,
            _ => return self.recipe(step, done),
        };
        std::fs::create_dir_all(&self.markers)?;
        std::fs::write(&marker, step.name())?;
        Ok(StepResult {
            output: Some(marker),
            facts: serde_json::Value::Null,
        })
    }

    fn shipped(&self, step: StepId, result: &StepResult) -> Option<PathBuf> {
        shipped_root(step, result)
    }

    /// As the stack's own steps: a substituted image still reads the base.
    fn reads_when_substituted(&self, step: StepId) -> &'static [StepId] {
        match step {
            Image => &[Base],
            _ => &[],
        }
    }

    fn built_here(&self, steps: &BTreeSet<StepId>, target: Option<StepId>) {
        if target != Some(Fetch) {
            *self.here.lock().unwrap() = Some(steps.clone());
        }
    }
}

// ---------------------------------------------------------------------------------------
// A build, with or without a binary cache
// ---------------------------------------------------------------------------------------

struct Built {
    plan: Vec<Planned>,
    /// The steps whose recipe ran, in order.
    ran: Vec<StepId>,
    /// (step, outcome, key, reason) of each row.
    rows: Vec<(StepId, &'static str, Option<String>, Option<String>)>,
    /// The fingerprint of what each keyed step ships, for the steps done.
    outputs: BTreeMap<StepId, String>,
    /// The failed step and its error.
    failed: Option<(StepId, String)>,
    /// The rows marked as entered without a trusted signature, and why.
    unsigned: BTreeMap<StepId, String>,
}

impl Built {
    fn status(&self, step: StepId) -> &Status {
        &self.plan.iter().find(|p| p.step == step).unwrap().status
    }
    fn outcome(&self, step: StepId) -> &'static str {
        self.rows.iter().find(|r| r.0 == step).unwrap().1
    }
}

fn build(stack: &Path, home: &Path, cache: Option<&dyn Substitute<StepId>>) -> Result<Built> {
    build_until(stack, home, cache, Selection::All)
}

fn build_until(
    stack: &Path,
    home: &Path,
    cache: Option<&dyn Substitute<StepId>>,
    selection: Selection,
) -> Result<Built> {
    build_of_kind(stack, home, cache, selection, "fixture")
}

/// [`build_until`] with recipes that make store steps of `kind` (`<kind>-<step>-<hash>`).
fn build_of_kind(
    stack: &Path,
    home: &Path,
    cache: Option<&dyn Substitute<StepId>>,
    selection: Selection,
    kind: &'static str,
) -> Result<Built> {
    build_with(stack, home, cache, selection, kind, false)
}

/// [`build_of_kind`], with `--allow-unsigned` when `allow_unsigned`.
fn build_with(
    stack: &Path,
    home: &Path,
    cache: Option<&dyn Substitute<StepId>>,
    selection: Selection,
    kind: &'static str,
    allow_unsigned: bool,
) -> Result<Built> {
    let ctx = ctx_for(stack, home)?;
    let recipes = Recipes {
        stack: StackSteps::new(&ctx, BuildOptions::default(), ImageOptions { gpus: false })?,
        kind,
        store: Store::open(ctx.store_dir())?,
        markers: home.join("fixture"),
        ran: Mutex::new(Vec::new()),
        here: Mutex::new(None),
    };
    let store = Store::open(ctx.store_dir())?;
    let record = Record::open(home.join("pipeline/inputs.json"))?;
    let engine = Engine {
        store: &store,
        record: &record,
        log_dir: home.join("pipeline/logs"),
        quiet: true,
        force: false,
        until_command: "cargo xtask build --until".into(),
        substitute: cache,
        allow_unsigned,
        unsigned_help: commstack_pipeline::command::UNSIGNED_HELP.into(),
    };
    let plan = engine.plan(&recipes, selection)?;
    let planned = plan.steps.clone();
    let report = engine.run(&recipes, plan)?;
    let mut outputs = BTreeMap::new();
    for step in StepId::ALL.into_iter().filter(|s| s.keyed()) {
        let Some(key) = planned.iter().find(|p| p.step == step).and_then(|p| {
            p.key
                .as_ref()
                .map(|k| store.root().join("steps").join(k).join("result.json"))
        }) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&key) else {
            continue;
        };
        let stored: StoredResult = serde_json::from_str(&text)?;
        let shipped = stored.shipped.context("a keyed step ships")?;
        assert!(
            shipped.root.starts_with(home),
            "{step}: the result names {} outside this home",
            shipped.root.display()
        );
        // What the result records is what is there.
        let now = commstack_digest::manifest::manifest(&shipped.root, &|_| false)?;
        assert_eq!(now, shipped.files, "{step}: the files its result records");
        outputs.insert(step, fingerprint(&shipped.root)?);
    }
    // Two steps that run at once call their recipes in either order; the rest run in
    // graph order already.
    let mut ran = recipes.ran.into_inner().unwrap();
    ran.sort();
    Ok(Built {
        plan: planned,
        ran,
        rows: report
            .rows
            .iter()
            .map(|r| (r.step, r.outcome, r.key.clone(), r.reason.clone()))
            .collect(),
        outputs,
        failed: report.failed.map(|(s, e, _)| (s, format!("{e:#}"))),
        unsigned: report
            .rows
            .iter()
            .filter_map(|r| r.unsigned.clone().map(|u| (r.step, u)))
            .collect(),
    })
}

/// The image's layer steps in a home's store (`image-layer-<hash>`), each with the
/// fingerprint of its files (the store's own records left out).
fn layer_steps(home: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let prefix = format!("{}-", commstack_image::assemble::LAYER_STEP);
    for entry in std::fs::read_dir(home.join("store/steps"))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&prefix) {
            continue;
        }
        let m = commstack_digest::manifest::manifest(&entry.path(), &|rel| {
            rel == META_FILE || rel == ".used"
        })?;
        out.insert(name, sha256_hex(canonical_json(&serde_json::to_value(m)?)));
    }
    Ok(out)
}

/// The step directories sealed in a home's store (`pipeline-nvshmem`, `fixture-nvshmem`),
/// sorted; and that tmp/ holds no step directory (a failed attempt goes to failed/).
fn sealed(home: &Path) -> Vec<String> {
    let store = home.join("store");
    let tmp_dirs: Vec<String> = std::fs::read_dir(store.join("tmp"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(tmp_dirs.is_empty(), "left in tmp/: {tmp_dirs:?}");
    let mut out: Vec<String> = std::fs::read_dir(store.join("steps"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join(META_FILE).is_file())
                .map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name[..name.rfind('-').unwrap()].to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------
// The registry, the key, the push
// ---------------------------------------------------------------------------------------

struct Setup {
    dir: tempfile::TempDir,
    registry: RefCell<TestRegistry>,
    stack: PathBuf,
    /// The first build, in home A.
    first: Built,
    /// `ed25519:<base64>` of the key that signed the push.
    public_key: String,
    /// Each step's artifact as the push made it (see [`Setup::download`]).
    originals: RefCell<BTreeMap<StepId, Downloaded>>,
}

/// An artifact's manifest, config, and layers (media type and file).
type Downloaded = (serde_json::Value, serde_json::Value, Vec<(String, PathBuf)>);

fn credentials(password: &str) -> Credentials {
    Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), password.into()),
        source: "the test".into(),
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 2,
        backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(20),
    }
}

/// Builds in home A and pushes `steps` (all that ship when empty), signed.
fn setup(steps: &[StepId]) -> Result<Setup> {
    let dir = tempfile::tempdir()?;
    let stack = write_stack(&dir.path().join("stack"));
    let first = build(&stack, &dir.path().join("a"), None)?;
    assert!(first.failed.is_none(), "{:?}", first.failed);
    let registry = TestRegistry::start();
    let key = commstack_registry::sign::read_signing_key(&ed25519_key(dir.path(), "key"))?;
    let public_key = commstack_registry::sign::public_key_text(&key.verifying_key());
    let ctx = ctx_for(&stack, &dir.path().join("a"))?;
    let pushed = cache_push(
        &ctx,
        &CachePushRequest {
            registry: format!("{}/{REPO}", registry.host()),
            key: dir.path().join("key.pem"),
            steps: steps.to_vec(),
            ca_file: Some(registry.ca()),
            jobs: 2,
            credentials: Some(credentials(REGISTRY_PASSWORD)),
            signature_tag: false,
        },
        &|_| {},
    )?;
    let want = match steps.is_empty() {
        true => StepId::ALL.iter().filter(|s| s.keyed()).count(),
        false => steps.len(),
    };
    assert_eq!(pushed.len(), want, "the steps pushed");
    Ok(Setup {
        dir,
        registry: RefCell::new(registry),
        stack,
        first,
        public_key,
        originals: RefCell::new(BTreeMap::new()),
    })
}

impl Setup {
    fn substituter(&self, trusted: &[String], allow_unsigned: bool) -> Result<Substituter> {
        let mut s = Substituter::new(
            &SubstituteRequest {
                registry: format!("{}/{REPO}", self.registry.borrow().host()),
                trusted_keys: trusted.to_vec(),
                allow_unsigned,
                ca_file: Some(self.registry.borrow().ca()),
                progress: false,
            },
            &self.stack,
        )?;
        s.set_credentials(credentials(REGISTRY_PASSWORD));
        s.set_retry(fast_retry());
        s.set_artifact_kinds(|step| fixture_kinds("fixture", step));
        Ok(s)
    }

    fn trusted(&self) -> Result<Substituter> {
        self.substituter(std::slice::from_ref(&self.public_key), false)
    }

    fn home(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// How the test itself reaches the registry: its CA, the right password.
    fn options(&self) -> Result<PushOptions> {
        let registry = self.registry.borrow();
        let mut options = PushOptions::new(Target::parse(&format!("{}/{REPO}", registry.host()))?);
        options.ca_file = Some(registry.ca());
        options.credentials = Some(credentials(REGISTRY_PASSWORD));
        Ok(options)
    }

    /// `step`'s artifact as the cache holds it (its manifest and digest).
    fn artifact(&self, step: StepId) -> Result<commstack_registry::pull::Found> {
        let key = self
            .first
            .rows
            .iter()
            .find(|r| r.0 == step)
            .and_then(|r| r.2.clone())
            .context("the step's key")?;
        commstack_registry::pull::find_tag(&self.options()?, key.trim_start_matches("pipeline-"))?
            .context("the artifact is in the registry")
    }

    /// The digest of layer `index` (0: the shipped files) of `step`'s artifact.
    fn layer(&self, step: StepId, index: usize) -> Result<String> {
        let found = self.artifact(step)?;
        let manifest: serde_json::Value = serde_json::from_slice(&found.manifest)?;
        Ok(manifest["layers"][index]["digest"]
            .as_str()
            .context("a layer digest")?
            .to_string())
    }
}

impl Setup {
    /// `step`'s artifact as the push made it (downloaded the first time, before any
    /// [`Setup::republish`] of it): its manifest, its config, and its layers (media type
    /// and file, in order).
    fn download(&self, step: StepId) -> Result<Downloaded> {
        if let Some(known) = self.originals.borrow().get(&step) {
            return Ok(known.clone());
        }
        let work = self.dir.path().join("originals").join(step.name());
        let work = work.as_path();
        let found = self.artifact(step)?;
        let manifest: serde_json::Value = serde_json::from_slice(&found.manifest)?;
        let options = self.options()?;
        let config = &manifest["config"];
        let config = commstack_registry::pull::pull_document(
            &options,
            config["digest"].as_str().context("a config digest")?,
            config["size"].as_u64().context("a config size")?,
            commstack_registry::Document::Config,
        )?;
        let config: serde_json::Value = serde_json::from_slice(&config)?;
        let mut layers = Vec::new();
        std::fs::create_dir_all(work)?;
        for (i, l) in manifest["layers"]
            .as_array()
            .context("layers")?
            .iter()
            .enumerate()
        {
            let file = work.join(format!("{}-layer-{i}", step.name()));
            commstack_registry::pull::pull_blob(
                &options,
                l["digest"].as_str().context("a layer digest")?,
                l["size"].as_u64().context("a layer size")?,
                &file,
            )?;
            let media_type = l["mediaType"].as_str().context("a media type")?;
            layers.push((media_type.to_string(), file));
        }
        let downloaded = (manifest, config, layers);
        self.originals.borrow_mut().insert(step, downloaded.clone());
        Ok(downloaded)
    }

    /// Pushes `step`'s artifact again under its tag, its config (and layers) changed by
    /// `edit`: signed by the trusted key, or unsigned (the old signature names the old
    /// manifest).
    fn republish(
        &self,
        step: StepId,
        signed: bool,
        edit: impl FnOnce(&mut serde_json::Value, &mut Vec<(String, PathBuf)>),
    ) -> Result<()> {
        let work = tempfile::tempdir_in(self.dir.path())?;
        let (manifest, mut config, mut layers) = self.download(step)?;
        edit(&mut config, &mut layers);
        let layout = work.path().join("oci");
        let annotations: BTreeMap<String, String> =
            serde_json::from_value(manifest["annotations"].clone())?;
        commstack_registry::artifact::write_artifact_layout(
            &commstack_registry::artifact::Artifact {
                artifact_type: manifest["artifactType"].as_str().context("a type")?.into(),
                config_media_type: manifest["config"]["mediaType"]
                    .as_str()
                    .context("a config media type")?
                    .into(),
                config: canonical_json(&config).into_bytes(),
                layers,
                annotations,
                subject: None,
            },
            &layout,
        )?;
        let mut options = self.options()?;
        options.progress = false;
        options.tag = Some(self.artifact(step)?.tag);
        match signed {
            true => {
                let key =
                    commstack_registry::sign::read_signing_key(&self.dir.path().join("key.pem"))?;
                commstack_registry::push_signed(&layout, &key, &options)?;
            }
            false => {
                commstack_registry::push_layout(&layout, &options)?;
            }
        }
        Ok(())
    }

    /// A cache that takes what `republish` pushed: signed, under the trusted key; unsigned,
    /// with --allow-unsigned.
    fn taking(&self, signed: bool) -> Result<Substituter> {
        match signed {
            true => self.trusted(),
            false => self.substituter(&[], true),
        }
    }
}

/// The `.step.json` of the store step of `home` whose name starts with `prefix-` and has
/// no other `-` after it (`fixture-image-<hash>`, not `fixture-image-layer-...`).
fn step_meta(home: &Path, prefix: &str) -> Result<serde_json::Value> {
    let steps = home.join("store/steps");
    let dir = std::fs::read_dir(&steps)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.strip_prefix(&format!("{prefix}-"))
                .is_some_and(|rest| !rest.contains('-'))
        })
        .with_context(|| format!("no {prefix}-<hash> in {}", steps.display()))?;
    Ok(serde_json::from_str(&std::fs::read_to_string(
        dir.join(META_FILE),
    )?)?)
}

/// The keyed steps a substituted image needs (the base for its first layer; runtime, the
/// last step, which the fixture lets the cache hold; verify, which only runtime reads, is
/// then not needed): what an empty home makes.
const IMAGE_NEEDS: [StepId; 3] = [Base, Image, Runtime];

/// The keyed steps but `except`.
fn keyed_but(except: &[StepId]) -> Vec<StepId> {
    StepId::ALL
        .into_iter()
        .filter(|s| s.keyed() && !except.contains(s))
        .collect()
}

/// `steps` are the keyed steps done in `other`, with the same keys and the same bytes as
/// in the first build.
fn assert_same_outputs(first: &Built, other: &Built, steps: &[StepId]) {
    assert_eq!(
        other.outputs.keys().copied().collect::<Vec<_>>(),
        steps,
        "the keyed steps done"
    );
    let mut want = first.outputs.clone();
    want.retain(|s, _| steps.contains(s));
    assert_eq!(other.outputs, want, "what each step ships");
    for &step in steps {
        let key = |b: &Built| {
            b.rows
                .iter()
                .find(|r| r.0 == step)
                .and_then(|r| r.2.clone())
        };
        assert_eq!(key(other), key(first), "{step}'s key");
    }
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// An empty home with every step in the cache pulls what the image needs and nothing
/// else (as `docker pull` would); `--until` a step makes that step and what it needs; the
/// same bytes under the same keys, and no recipe runs.
#[test]
fn an_empty_home_substitutes_what_is_needed_and_runs_no_recipe() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let cache = s.trusted()?;
    let home = s.home("b");
    let b = build(&s.stack, &home, Some(&cache))?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    for step in IMAGE_NEEDS {
        match b.status(step) {
            Status::Substitute { from } => assert!(
                from.starts_with(&format!(
                    "{}/{REPO}:{}-",
                    s.registry.borrow().host(),
                    step.name()
                )) && from.contains("@sha256:"),
                "{step}: {from}"
            ),
            other => panic!("{step} is planned {other:?}, not substituted"),
        }
        assert_eq!(b.outcome(step), "substituted", "{step}");
    }
    assert_not_needed(&b, &keyed_but(&IMAGE_NEEDS));
    // No recipe ran for a keyed step; nothing was fetched (no step reads the cache).
    assert_eq!(
        b.ran,
        [Load],
        "the recipes that ran in the substituting home"
    );
    assert_eq!(b.status(Fetch), &Status::Reused);
    assert_same_outputs(&s.first, &b, &IMAGE_NEEDS);
    assert!(!sealed(&home).contains(&"fixture-nvshmem".to_string()));
    // The image's layer steps came with its artifact (no recipe made them): the same
    // names, the same bytes.
    let layers = layer_steps(&home)?;
    assert_eq!(layers.len(), 2, "{layers:?}");
    assert_eq!(
        layers,
        layer_steps(&s.home("a"))?,
        "the image's layer steps"
    );

    // --until a step makes that step: substituted, and what it was built from is not
    // needed.
    for step in [Nvshmem, Dropin, Deepep, Wheelhouse, Kernels] {
        let until = build_until(&s.stack, &home, Some(&cache), Selection::Until(step))?;
        assert!(until.failed.is_none(), "{step}: {:?}", until.failed);
        assert_eq!(until.outcome(step), "substituted", "{step}");
        assert!(until.ran.is_empty(), "{step}: {:?}", until.ran);
        assert_not_needed(&until, &[Toolchain, NvshmemSource]);
    }

    // Again: everything is in the store now, and the cache is not asked (a registry
    // that is gone does not matter).
    s.registry.borrow_mut().stop();
    let again = build(&s.stack, &home, Some(&cache))?;
    assert!(again.failed.is_none(), "{:?}", again.failed);
    assert!(again.ran.is_empty(), "{:?}", again.ran);
    for p in &again.plan {
        match p.step {
            Toolchain | NvshmemSource | Verify => {}
            _ => assert_eq!(p.status, Status::Reused, "{}", p.step),
        }
    }
    assert_not_needed(&again, &[Toolchain, NvshmemSource, Verify]);
    assert_same_outputs(
        &s.first,
        &again,
        &keyed_but(&[Toolchain, NvshmemSource, Verify]),
    );
    Ok(())
}

/// Each of `steps` is planned as not needed and skipped.
fn assert_not_needed(b: &Built, steps: &[StepId]) {
    for &step in steps {
        match b.status(step) {
            Status::Skipped { reason } => assert!(
                reason.starts_with(
                    "not needed: every step that reads it is reused or substituted from"
                ) && reason.ends_with(REPO),
                "{step}: {reason}"
            ),
            other => panic!("{step} is planned {other:?}"),
        }
        assert_eq!(b.outcome(step), "skipped", "{step}");
    }
}

/// Only NVSHMEM (and what it reads) is in the cache: the rest is built here, from the
/// pulled install and the report the artifact carries beside it (the drop-in reads it).
#[test]
fn a_step_the_cache_lacks_is_built_here_from_the_pulled_outputs() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[Toolchain, NvshmemSource, Nvshmem])?;
    let cache = s.trusted()?;
    let b = build(&s.stack, &s.home("b"), Some(&cache))?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    // The self-test built here reads the toolchain; nothing built here reads NVSHMEM's
    // source (NVSHMEM is substituted).
    for step in [Toolchain, Nvshmem] {
        assert_eq!(b.outcome(step), "substituted", "{step}");
    }
    assert_not_needed(&b, &[NvshmemSource]);
    match b.status(Dropin) {
        Status::Run { reason, .. } => assert!(
            reason.contains("not in the binary cache") && reason.contains(REPO),
            "{reason}"
        ),
        other => panic!("dropin is planned {other:?}"),
    }
    assert_eq!(
        b.ran,
        [
            Fetch, Dropin, Kernels, Deepep, Wheelhouse, Base, Image, Verify, Load, Runtime
        ]
    );
    assert_same_outputs(&s.first, &b, &keyed_but(&[NvshmemSource]));
    Ok(())
}

/// The cache has every step but the toolchain and NVSHMEM's source: with the steps after
/// them substituted they are neither built nor looked up, and so neither is anything the
/// substituted image does not read.
#[test]
fn a_step_only_substituted_steps_read_is_not_made() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[
        Nvshmem, Dropin, Kernels, Deepep, Wheelhouse, Base, Image, Verify, Runtime,
    ])?;
    let cache = s.trusted()?;
    let home = s.home("b");
    let b = build(&s.stack, &home, Some(&cache))?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    assert_not_needed(&b, &keyed_but(&IMAGE_NEEDS));
    assert_eq!(b.ran, [Load], "no recipe but load's");
    assert_same_outputs(&s.first, &b, &IMAGE_NEEDS);
    // --until DeepEP: DeepEP substituted, and nothing it was built from is needed.
    let until = build_until(&s.stack, &home, Some(&cache), Selection::Until(Deepep))?;
    assert!(until.failed.is_none(), "{:?}", until.failed);
    assert_eq!(until.outcome(Deepep), "substituted");
    assert_not_needed(&until, &[Toolchain, NvshmemSource, Nvshmem, Dropin]);
    assert!(until.ran.is_empty(), "{:?}", until.ran);
    Ok(())
}

/// An artifact, signed by a trusted key and with the right step key, whose store step is
/// of another kind than the one this build makes for that step (here: the build's
/// recipes make `other-base-...`, the artifact carries `fixture-base-...`), is refused:
/// sealed here, it would be what a later build of that kind finds under that key.
#[test]
fn an_artifact_carrying_a_store_step_of_another_kind_is_refused() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let home = s.home("b");
    let mut cache = s.trusted()?;
    cache.set_artifact_kinds(|step| fixture_kinds("other", step));
    let b = build_of_kind(&s.stack, &home, Some(&cache), Selection::All, "other")?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Base, "the first substituted step: {err}");
    assert!(
        err.contains("it carries the store step fixture-base-")
            && err.contains("step base makes `other-base-...` steps: refusing it"),
        "{err}"
    );
    assert!(b.ran.is_empty(), "{:?}", b.ran);
    assert_eq!(sealed(&home), Vec::<String>::new(), "nothing sealed");
    Ok(())
}

#[test]
fn an_untrusted_signature_is_refused_unless_allowed() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    // Another key's public half: a real ed25519 key that did not sign the cache.
    let other = commstack_registry::sign::read_signing_key(&ed25519_key(s.dir.path(), "other"))?;
    let other = commstack_registry::sign::public_key_text(&other.verifying_key());
    let home = s.home("b");
    let b = build(
        &s.stack,
        &home,
        Some(&s.substituter(std::slice::from_ref(&other), false)?),
    )?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Base, "the first substituted step: {err}");
    assert!(
        err.contains("refusing the output of step base")
            && err.contains(&format!("{REPO}:base-"))
            && err.contains("is not a trusted key")
            && err.contains("--allow-unsigned"),
        "{err}"
    );
    assert!(b.ran.is_empty(), "{:?}", b.ran);
    assert_eq!(sealed(&home), Vec::<String>::new(), "nothing sealed");

    // No trusted key at all: refused before anything is looked up.
    let err = s
        .substituter(&[], false)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("trusts no key") && err.contains("--allow-unsigned"),
        "{err}"
    );

    // --allow-unsigned takes it, saying so in the step's log.
    let b = build(&s.stack, &home, Some(&s.substituter(&[other], true)?))?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    assert_same_outputs(&s.first, &b, &IMAGE_NEEDS);
    let log = std::fs::read_to_string(home.join("pipeline/logs/image.log"))?;
    assert!(log.contains("taken because of --allow-unsigned"), "{log}");
    // Each store step that came in so says so in its record: the graph steps, the crate
    // steps, the image's layer steps.
    for prefix in [
        "pipeline-image",
        "fixture-image",
        "pipeline-base",
        "fixture-base",
    ] {
        let meta = step_meta(&home, prefix)?;
        assert!(
            meta["unsigned"]
                .as_str()
                .is_some_and(|w| w.contains("--allow-unsigned")),
            "{prefix}: {meta}"
        );
    }
    // Nor does `cache push` sign it again, as if built here.
    let said = RefCell::new(Vec::new());
    let err = cache_push(
        &ctx_for(&s.stack, &home)?,
        &CachePushRequest {
            registry: format!("{}/{REPO}", s.registry.borrow().host()),
            key: s.dir.path().join("key.pem"),
            steps: Vec::new(),
            ca_file: Some(s.registry.borrow().ca()),
            jobs: 2,
            credentials: Some(credentials(REGISTRY_PASSWORD)),
            signature_tag: false,
        },
        &|line| said.borrow_mut().push(line.to_string()),
    )
    .err()
    .context("cache push signed outputs that entered unsigned")?;
    assert!(
        format!("{err:#}").contains("entered without a trusted signature"),
        "{err:#}"
    );
    assert!(
        said.borrow()
            .iter()
            .any(|l| l.starts_with("image: not pushed")),
        "{:?}",
        said.borrow()
    );
    // A build not told to reuses none of it, and says how to go on.
    let err = match build(&s.stack, &home, None) {
        Ok(b) => format!("{:?}", b.failed),
        Err(e) => format!("{e:#}"),
    };
    eprintln!("without --allow-unsigned: {err}");
    assert!(
        err.contains("--allow-unsigned") && err.contains("cargo xtask store gc --unsigned"),
        "{err}"
    );
    // Told, it reuses them, and its rows say so.
    let told = build_with(&s.stack, &home, None, Selection::All, "fixture", true)?;
    assert!(told.failed.is_none(), "{:?}", told.failed);
    assert!(told.ran.is_empty(), "{:?}", told.ran);
    for step in IMAGE_NEEDS {
        assert_eq!(told.outcome(step), "reused", "{step}");
        assert!(
            told.unsigned.contains_key(&step),
            "{step}: {:?}",
            told.unsigned
        );
    }
    // `store gc --unsigned` removes them; the cache then gives them again, signed by the
    // trusted key, unmarked.
    let report = Store::open(home.join("store"))?.gc(&commstack_store::GcOptions {
        unsigned: true,
        ..Default::default()
    })?;
    assert!(!report.removed.is_empty());
    let again = build(&s.stack, &home, Some(&s.trusted()?))?;
    assert!(again.failed.is_none(), "{:?}", again.failed);
    assert!(again.unsigned.is_empty(), "{:?}", again.unsigned);
    assert_eq!(again.outcome(Image), "substituted");
    assert!(step_meta(&home, "fixture-image")?.get("unsigned").is_none());
    // The provenance the artifact carries: who pushed it.
    assert!(
        log.contains(&format!(
            "pushed by commstack {}",
            env!("CARGO_PKG_VERSION")
        )),
        "{log}"
    );
    Ok(())
}

#[test]
fn a_bad_signature_by_a_trusted_key_is_refused_even_with_allow_unsigned() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[Toolchain])?;
    let found = s.artifact(Toolchain)?;
    // A signature that names the trusted key but was made by another: pushed over the
    // real one, under the same tag.
    let forger = commstack_registry::sign::read_signing_key(&ed25519_key(s.dir.path(), "forger"))?;
    let mut options = s.options()?;
    options.progress = false;
    let mut forged = commstack_registry::sign::sign(&forger, &options.target.name(), &found.digest);
    // Its payload made to name the trusted key as its signer (the signature is the forger's).
    let forger_text = commstack_registry::sign::public_key_text(&forger.verifying_key());
    forged.payload = String::from_utf8(forged.payload)?
        .replace(&forger_text, &s.public_key)
        .into_bytes();
    let work = tempfile::tempdir_in(s.dir.path())?;
    let layout = commstack_registry::signed::signature_layout(
        &forged,
        (&found.digest, found.manifest.len() as u64),
        work.path(),
    )?;
    commstack_registry::push_referrer(&layout, &found.digest, "sig", &options)?;

    // Tampering, not a missing signature: --allow-unsigned does not take it.
    let home = s.home("b");
    let b = build(
        &s.stack,
        &home,
        Some(&s.substituter(std::slice::from_ref(&s.public_key), true)?),
    )?;
    let (step, err) = b.failed.clone().expect("the build fails");
    assert_eq!(step, Toolchain, "{err}");
    assert!(err.contains("does not verify"), "{err}");
    // --allow-unsigned would not take it: the message does not suggest it.
    assert!(!err.contains("pass --allow-unsigned"), "{err}");
    assert!(b.ran.iter().all(|s| !s.keyed()), "{:?}", b.ran);
    assert_eq!(sealed(&home), Vec::<String>::new(), "nothing sealed");
    Ok(())
}

#[test]
fn a_store_step_here_that_differs_from_the_signed_output_is_refused() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let home = s.home("b");
    let nvshmem = Selection::Until(Nvshmem);
    let b = build_until(&s.stack, &home, Some(&s.trusted()?), nvshmem)?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    // NVSHMEM's crate step stays, with other bytes; its graph step goes, so the next
    // build substitutes nvshmem again and finds the crate step in the store.
    let steps = home.join("store/steps");
    let named = |prefix: &str| -> Result<PathBuf> {
        std::fs::read_dir(&steps)?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with(prefix) && !name[prefix.len()..].contains('-')
            })
            .with_context(|| format!("no {prefix}<hash> in {}", steps.display()))
    };
    let lib = named("fixture-nvshmem-")?.join("nvshmem/lib/libnvshmem_host.so.3");
    std::fs::write(&lib, "not what was signed\n")?;
    std::fs::remove_dir_all(named("pipeline-nvshmem-")?)?;
    let again = build_until(&s.stack, &home, Some(&s.trusted()?), nvshmem)?;
    let (step, err) = again.failed.clone().expect("the build fails");
    assert_eq!(step, Nvshmem, "{err}");
    assert!(
        err.contains("differs from the signed output") && err.contains("--no-substitute"),
        "{err}"
    );
    assert!(
        named("pipeline-nvshmem-").is_err(),
        "the graph step is not sealed"
    );
    Ok(())
}

#[test]
fn a_blob_altered_in_the_registry_is_refused_and_nothing_is_sealed() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let digest = s.layer(Nvshmem, 0)?;
    let data = s.registry.borrow().blob_data(&digest);
    let mut bytes = std::fs::read(&data)?;
    bytes[600] ^= 0x20; // one byte of the layer: its sha256 no longer matches
    std::fs::write(&data, &bytes)?;
    let home = s.home("b");
    let b = build_until(
        &s.stack,
        &home,
        Some(&s.trusted()?),
        Selection::Until(Nvshmem),
    )?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Nvshmem, "{err}");
    assert!(
        err.contains(&digest) && err.contains("refusing it") && err.contains("layer 1 of 2"),
        "{err}"
    );
    // Nothing is sealed (the steps before it are not needed), and its download is gone.
    assert_eq!(sealed(&home), Vec::<String>::new());
    let hex = digest.trim_start_matches("sha256:");
    assert!(!home.join(format!("store/tmp/pull-{hex}.tar")).exists());
    Ok(())
}

/// A layer tar the image's artifact carries (its layer steps' files follow the first two
/// layers, `layer.json` then `layer.tar` of each), altered in the registry's storage:
/// refused as it streams; the base (which it reads) is sealed, nothing of the image is.
#[test]
fn an_image_layer_altered_in_the_registry_is_refused_and_nothing_of_the_image_is_sealed()
-> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let digest = s.layer(Image, 3)?;
    let data = s.registry.borrow().blob_data(&digest);
    let mut bytes = std::fs::read(&data)?;
    bytes[0] ^= 0x20;
    std::fs::write(&data, &bytes)?;
    let home = s.home("b");
    let b = build(&s.stack, &home, Some(&s.trusted()?))?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Image, "{err}");
    assert!(
        err.contains(&digest) && err.contains("image-layer-") && err.contains("layer.tar"),
        "{err}"
    );
    let sealed = sealed(&home);
    for gone in ["image-layer", "fixture-image", "pipeline-image"] {
        assert!(!sealed.iter().any(|s| s == gone), "{gone}: {sealed:?}");
    }
    assert!(sealed.contains(&"pipeline-base".to_string()), "{sealed:?}");
    for step in ["kernels", "wheelhouse"] {
        assert!(
            !sealed.contains(&format!("pipeline-{step}")),
            "{step}, which the image does not read: {sealed:?}"
        );
    }
    let hex = digest.trim_start_matches("sha256:");
    assert!(!home.join(format!("store/tmp/pull-{hex}.tar")).exists());
    Ok(())
}

#[test]
fn a_missing_blob_is_a_clear_error() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let digest = s.layer(Dropin, 0)?;
    let data = s.registry.borrow().blob_data(&digest);
    std::fs::remove_dir_all(data.parent().unwrap())?;
    let home = s.home("b");
    let b = build_until(
        &s.stack,
        &home,
        Some(&s.trusted()?),
        Selection::Until(Dropin),
    )?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Dropin, "{err}");
    assert!(
        err.contains(&digest) && err.contains("has no such blob") && err.contains("cache push"),
        "{err}"
    );
    assert!(!sealed(&home).iter().any(|s| s.ends_with("dropin")));
    Ok(())
}

#[test]
fn wrong_credentials_are_refused_before_anything_is_pulled() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let mut cache = s.trusted()?;
    cache.set_credentials(credentials("wrong horse"));
    let home = s.home("b");
    let err = match build(&s.stack, &home, Some(&cache)) {
        Ok(b) => panic!("the build went on: {:?}", b.failed),
        Err(e) => format!("{e:#}"),
    };
    eprintln!("the error: {err}");
    assert!(
        // The lookups go backwards from the last step.
        err.contains("looking up step runtime")
            && err.contains("refused the credentials (401")
            && err.contains(REPO),
        "{err}"
    );
    assert_eq!(sealed(&home), Vec::<String>::new());
    Ok(())
}

/// The registry is killed as the image's pull starts: the base, pulled before, stays
/// sealed, the image is not; the registry comes back, and the rerun (with half of a layer
/// already downloaded, as a download cut midway leaves it) completes with the same outputs.
#[test]
fn the_registry_killed_midway_and_the_rerun_completes() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    struct KillAt<'a> {
        inner: Substituter,
        registry: &'a RefCell<TestRegistry>,
        at: StepId,
    }
    impl Substitute<StepId> for KillAt<'_> {
        fn source(&self) -> String {
            self.inner.source()
        }
        fn decide(&self, step: StepId, key: &StepKey) -> Result<Decision> {
            self.inner.decide(step, key)
        }
        fn pull(
            &self,
            store: &Store,
            step: StepId,
            key: &StepKey,
            say: &dyn Fn(&str),
        ) -> Result<Pulled> {
            if step == self.at {
                self.registry.borrow_mut().stop();
            }
            self.inner.pull(store, step, key, say)
        }
    }
    let s = setup(&[])?;
    let home = s.home("b");
    let killing = KillAt {
        inner: s.trusted()?,
        registry: &s.registry,
        at: Image,
    };
    let b = build(&s.stack, &home, Some(&killing))?;
    let (step, err) = b.failed.clone().expect("the build fails");
    eprintln!("the error, as the summary shows it: {err}");
    assert_eq!(step, Image, "{err}");
    assert!(
        err.contains("checking the signature of the output of step image")
            && err.contains(&s.registry.borrow().host())
            && err.contains("Connection refused")
            && !err.contains("refusing"),
        "{err}"
    );
    assert_eq!(sealed(&home), ["fixture-base", "pipeline-base"]);

    // Back up; half of the image's shipped layer where an interrupted download leaves it.
    s.registry.borrow_mut().serve();
    let digest = s.layer(Image, 0)?;
    let whole = std::fs::read(s.registry.borrow().blob_data(&digest))?;
    let part = home.join(format!(
        "store/tmp/pull-{}.tar",
        digest.trim_start_matches("sha256:")
    ));
    std::fs::write(&part, &whole[..whole.len() / 2])?;

    let rerun = build(&s.stack, &home, Some(&s.trusted()?))?;
    assert!(rerun.failed.is_none(), "{:?}", rerun.failed);
    assert_eq!(rerun.status(Base), &Status::Reused);
    assert_eq!(rerun.outcome(Image), "substituted");
    assert_eq!(rerun.ran, [Load]);
    assert!(!part.exists(), "the finished download is removed");
    assert_same_outputs(&s.first, &rerun, &IMAGE_NEEDS);
    Ok(())
}

/// The production steps' fetch: with a binary cache, only what the steps built here read
/// (nothing when none is; the .debs alone for the base).
#[test]
fn fetch_downloads_only_what_the_steps_built_here_read() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack = write_stack(&dir.path().join("stack"));
    let ctx = ctx_for(&stack, &dir.path().join("home"))?;
    let steps = StackSteps::new(&ctx, BuildOptions::default(), ImageOptions { gpus: false })?;
    let missing = |steps: &StackSteps| -> Result<usize> {
        Ok(match steps.pending(Fetch, &Done::new())? {
            None => 0,
            Some(reason) => reason.split(' ').next().context("a count")?.parse()?,
        })
    };
    let all = missing(&steps)?;
    let lock = commstack_stack::Lock::parse(
        &stack.with_extension("lock"),
        &std::fs::read_to_string(stack.with_extension("lock"))?,
    )
    .map_err(|d| anyhow::anyhow!("{d}"))?;
    assert!(
        all > lock.debs.len(),
        "{all} artifacts to fetch without a cache"
    );
    steps.built_here(&BTreeSet::new(), None);
    assert_eq!(
        missing(&steps)?,
        0,
        "nothing is built here: nothing to fetch"
    );
    steps.built_here(&BTreeSet::from([Base, Image]), None);
    assert_eq!(
        missing(&steps)?,
        lock.debs.len(),
        "the base reads the .debs only"
    );
    // NVSHMEM built here: the toolchain and NVSHMEM's source, not DeepEP's.
    steps.built_here(&BTreeSet::from([Nvshmem]), None);
    let toolchain = lock
        .toolchain
        .iter()
        .filter(|w| w.replaced_by.is_none())
        .count();
    assert_eq!(
        missing(&steps)?,
        toolchain + 1,
        "NVSHMEM reads its source only"
    );
    steps.built_here(&BTreeSet::from([Wheelhouse]), None);
    let wheels = missing(&steps)?;
    assert!(wheels > 0 && wheels < all, "{wheels} of {all}");
    Ok(())
}

/// A result that names files outside this store: its output, or a path in its facts (a
/// later step built here reads them, as the wheelhouse reads DeepEP's wheel). Pushed
/// signed by the trusted key, and unsigned and taken with --allow-unsigned: refused
/// either way, nothing sealed.
#[test]
fn a_pulled_result_cannot_point_outside_this_store() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let elsewhere = s.dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere)?;
    std::fs::write(elsewhere.join("dropin.out"), "not from any store\n")?;
    let outside = elsewhere.join("dropin.out").to_string_lossy().into_owned();
    for signed in [true, false] {
        for field in ["output", "facts"] {
            s.republish(Dropin, signed, |config, _| match field {
                "output" => config["result"]["output"] = outside.clone().into(),
                _ => config["result"]["facts"]["dir"] = outside.clone().into(),
            })?;
            let home = s.home(&format!("{field}-{signed}"));
            let b = build_until(
                &s.stack,
                &home,
                Some(&s.taking(signed)?),
                Selection::Until(Dropin),
            )?;
            let (step, err) = b
                .failed
                .clone()
                .with_context(|| format!("{field}, signed {signed}: the build went on"))?;
            eprintln!("{field}, signed {signed}: {err}");
            assert_eq!(step, Dropin, "{err}");
            assert!(err.contains("elsewhere"), "{err}");
            let sealed = sealed(&home);
            assert!(!sealed.iter().any(|s| s.ends_with("dropin")), "{sealed:?}");
        }
    }
    Ok(())
}

/// NVSHMEM's artifact carrying one of the image's layer steps (a store step the image's
/// artifact may carry, NVSHMEM's may not): refused whole, signed or not, and the layer
/// step is not sealed, where a later image build would take it.
#[test]
fn an_artifact_cannot_bring_store_steps_of_another_kind() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let (_, image, image_layers) = s.download(Image)?;
    for signed in [true, false] {
        s.republish(Nvshmem, signed, |config, layers| {
            config["carried_steps"] = json!([image["carried_steps"][0].clone()]);
            layers.extend(image_layers[2..4].iter().cloned());
        })?;
        let home = s.home(&format!("kind-{signed}"));
        let b = build_until(
            &s.stack,
            &home,
            Some(&s.taking(signed)?),
            Selection::Until(Nvshmem),
        )?;
        let (step, err) = b.failed.clone().context("the build went on")?;
        eprintln!("signed {signed}: {err}");
        assert_eq!(step, Nvshmem, "{err}");
        assert!(err.contains("image-layer-"), "{err}");
        let sealed = sealed(&home);
        assert!(
            !sealed
                .iter()
                .any(|s| s == "image-layer" || s.ends_with("nvshmem")),
            "{sealed:?}"
        );
    }
    Ok(())
}

/// Names in a config that would leave the store (`../`): each a refusal naming the
/// artifact, never a panic, and nothing left in the store's tmp/ (`sealed` checks).
#[test]
fn names_that_leave_the_store_are_refused_without_a_panic_or_leftovers() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    type Edit = fn(&mut serde_json::Value);
    let cases: [(StepId, &str, Edit); 4] = [
        (Nvshmem, "crate step", |c| {
            c["step_dir"]["meta"]["step"] = "../../evil".into()
        }),
        (Nvshmem, "crate step name", |c| {
            c["step_dir"]["name"] = "../../evil-0123".into()
        }),
        (Image, "carried step", |c| {
            c["carried_steps"][0]["meta"]["step"] = "../x".into()
        }),
        (Image, "carried step name", |c| {
            c["carried_steps"][0]["name"] = "../../x".into()
        }),
    ];
    for (n, (step, what, edit)) in cases.into_iter().enumerate() {
        s.republish(step, true, |config, _| edit(config))?;
        let home = s.home(&format!("names-{n}"));
        let b = build_until(&s.stack, &home, Some(&s.trusted()?), Selection::Until(step))?;
        let (failed, err) = b
            .failed
            .clone()
            .with_context(|| format!("{what}: the build went on"))?;
        eprintln!("{what}: {err}");
        assert_eq!(failed, step, "{what}: {err}");
        assert!(err.contains("refusing it"), "{what}: {err}");
        let sealed = sealed(&home);
        assert!(
            !sealed.iter().any(|s| s.ends_with(step.name())),
            "{what}: {sealed:?}"
        );
    }
    Ok(())
}

/// A run starts by removing what earlier runs left in the store's tmp/ (killed, or
/// stopped by a panic): a step directory whose step lock nobody holds. One whose lock is
/// held (a build running now) is kept.
#[test]
fn a_run_removes_what_earlier_runs_left_in_the_stores_tmp() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let stack = write_stack(&dir.path().join("stack"));
    let home = dir.path().join("home");
    let store = Store::open(home.join("store"))?;
    let hash = "0".repeat(32);
    let left = [
        store
            .root()
            .join(format!("tmp/pipeline-nvshmem-{hash}.4000000.0")),
        store
            .root()
            .join(format!("tmp/pipeline-dropin-{hash}.old.4000000")),
    ];
    for l in &left {
        std::fs::create_dir_all(l.join("logs"))?;
        std::fs::write(l.join("logs/half.log"), "killed here\n")?;
    }
    let busy = store.root().join(format!("tmp/fixture-busy-{hash}.1.0"));
    std::fs::create_dir_all(&busy)?;
    let lock = std::fs::File::create(store.root().join(format!("locks/fixture-busy-{hash}.lock")))?;
    lock.try_lock()?;
    let b = build_until(&stack, &home, None, Selection::Until(Toolchain))?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    for l in &left {
        assert!(!l.exists(), "{} is left", l.display());
    }
    assert!(busy.exists(), "a step being built is kept");
    Ok(())
}

/// After NVSHMEM was substituted, a build of it without the cache reuses it, and fetch,
/// which only the steps built here would need, downloads nothing (it ran and fetched
/// NVSHMEM's and DeepEP's sources).
#[test]
fn a_build_that_reuses_everything_fetches_nothing() -> Result<()> {
    if skip_registry_tests() {
        return Ok(());
    }
    let s = setup(&[])?;
    let home = s.home("b");
    let nvshmem = Selection::Until(Nvshmem);
    let b = build_until(&s.stack, &home, Some(&s.trusted()?), nvshmem)?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    let again = build_until(&s.stack, &home, None, nvshmem)?;
    assert!(again.failed.is_none(), "{:?}", again.failed);
    assert_eq!(again.status(Nvshmem), &Status::Reused);
    assert!(again.ran.is_empty(), "ran: {:?}", again.ran);
    assert_eq!(again.status(Fetch), &Status::Reused);
    Ok(())
}

/// On a registry with the referrers API (testkit's, go-containerregistry's), `cache push`
/// puts each signature up as a referrer of its output, with no `.sig` tag, and a
/// substitution finds it through the API and verifies it; under a key it does not trust,
/// the same signature is refused there as on docker-registry.
#[test]
fn through_a_registry_with_referrers_a_substitution_finds_and_verifies_the_signature() -> Result<()>
{
    if skip_registry_tests() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let stack = write_stack(&dir.path().join("stack"));
    let nvshmem = Selection::Until(Nvshmem);
    let first = build_until(&stack, &dir.path().join("a"), None, nvshmem)?;
    assert!(first.failed.is_none(), "{:?}", first.failed);
    let registry = commstack_testkit::cosign::ReferrersRegistry::start();
    for name in ["key", "other"] {
        ed25519_key(dir.path(), name);
    }
    let public = |name: &str| -> Result<String> {
        let key = commstack_registry::sign::read_signing_key(&dir.path().join(name))?;
        Ok(commstack_registry::sign::public_key_text(
            &key.verifying_key(),
        ))
    };
    let anonymous = Credentials {
        auth: RegistryAuth::Anonymous,
        source: "the test".into(),
    };
    let target = format!("http://{}/{REPO}", registry.host());
    let pushed = cache_push(
        &ctx_for(&stack, &dir.path().join("a"))?,
        &CachePushRequest {
            registry: target.clone(),
            key: dir.path().join("key.pem"),
            steps: vec![Nvshmem],
            ca_file: None,
            jobs: 2,
            credentials: Some(anonymous.clone()),
            signature_tag: false,
        },
        &|_| {},
    )?;
    assert_eq!(pushed.len(), 1);
    let signed = &pushed[0].pushed;
    assert_eq!(
        signed.signature_found_through,
        commstack_registry::FoundThrough::Referrers
    );
    let mut options = PushOptions::new(Target::parse(&target)?);
    options.credentials = Some(anonymous.clone());
    let digest = &signed.pushed.manifest_digest;
    let tag = commstack_registry::sign::signature_tag(digest)?;
    assert!(
        commstack_registry::pull::find_tag(&options, &tag)?.is_none(),
        "a referrer is not tagged {tag}"
    );

    let substituter = |trusted: &str| -> Result<Substituter> {
        let mut s = Substituter::new(
            &SubstituteRequest {
                registry: target.clone(),
                trusted_keys: vec![trusted.to_string()],
                allow_unsigned: false,
                ca_file: None,
                progress: false,
            },
            &stack,
        )?;
        s.set_credentials(anonymous.clone());
        s.set_retry(fast_retry());
        s.set_artifact_kinds(|step| fixture_kinds("fixture", step));
        Ok(s)
    };
    let home = dir.path().join("b");
    let b = build_until(
        &stack,
        &home,
        Some(&substituter(&public("key.pem")?)?),
        nvshmem,
    )?;
    assert!(b.failed.is_none(), "{:?}", b.failed);
    assert_eq!(b.outcome(Nvshmem), "substituted");
    assert!(b.ran.is_empty(), "{:?}", b.ran);

    let home = dir.path().join("c");
    let c = build_until(
        &stack,
        &home,
        Some(&substituter(&public("other.pem")?)?),
        nvshmem,
    )?;
    let (step, err) = c.failed.clone().expect("the build fails");
    assert_eq!(step, Nvshmem, "{err}");
    assert!(err.contains("is not a trusted key"), "{err}");
    assert_eq!(sealed(&home), Vec::<String>::new(), "nothing sealed");
    Ok(())
}
