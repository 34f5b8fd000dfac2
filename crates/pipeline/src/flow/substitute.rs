//! `build --substitute`: the binary cache's pull side. Before a keyed step runs, the graph
//! looks for `<step>-<key>` (what `cache push` tags, crate::flow::cache_push) in the cache
//! repository; when it is there, this takes it instead of building:
//!
//! 1. the signature (`sha256-<hex>.sig`) is verified under stack.toml's `[cache]
//!    trusted-keys` (an unsigned or untrusted output is refused unless `--allow-unsigned`);
//! 2. the manifest must be a step artifact of this very key (its annotation, its config's
//!    key and inputs: the signature binds them), and the config names the crate step
//!    directory the result points into (`nvshmem-<hash>`), its `.step.json`, and where in
//!    it the shipped files lie;
//! 3. each layer is downloaded into the store's tmp/ with its sha256 checked as it streams
//!    (an interrupted download continues on the rerun), unpacked with the one unpacker
//!    into that crate step's directory as `Store::run` builds it (so it is sealed, or
//!    left in tmp/ and failed/, exactly as a local build is), the shipped files compared
//!    with the config's manifest before anything is sealed;
//! 4. the result's paths (the pusher's home) are moved into this home's store, and the
//!    engine seals the graph step with it (crate::graph).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_registry::pull::{Found, Puller};
use commstack_registry::{PushOptions, Target, VerifyingKey};
use commstack_store::{StepKey, StepMeta, Store};
use serde::Deserialize;

use crate::flow::cache_push::{CONFIG_SCHEMA, CarriedStep, STEP_ARTIFACT_TYPE};
use crate::graph::{Decision, StepId, StoredResult};
use commstack_graph::Substitute;
use commstack_image::assemble::LAYER_FILE;

/// Where to substitute from, and whom to trust.
#[derive(Clone, Debug)]
pub struct SubstituteRequest {
    /// `HOST[:PORT]/REPO`.
    pub registry: String,
    /// `ed25519:<base64>` each (stack.toml's `[cache] trusted-keys`).
    pub trusted_keys: Vec<String>,
    /// Accept outputs that are unsigned or signed by no trusted key (said on each).
    pub allow_unsigned: bool,
    pub ca_file: Option<PathBuf>,
    /// Draw progress bars for large blobs.
    pub progress: bool,
}

/// The binary cache the graph substitutes from.
pub struct Substituter {
    options: PushOptions,
    trusted: Vec<VerifyingKey>,
    allow_unsigned: bool,
    /// What the plan found, by tag: the run pulls the manifest the plan saw.
    found: RefCell<BTreeMap<String, Found>>,
    /// One session for every look-up and download (made on first use): its connections
    /// are reused and a bearer registry's token is fetched once.
    puller: std::cell::OnceCell<Puller>,
    /// Where an image's layer tars go as they land (a `docker load` started early).
    early_load: Option<std::sync::Arc<crate::flow::image::EarlyLoadFeed>>,
    /// The kind of store step each step's output lives in, None for a step never pulled
    /// (the stack's [`crate::stack_steps::store_step_kind`], or a test's).
    step_kinds: Box<dyn Fn(StepId) -> Option<String>>,
}

/// The config of a step artifact (crate::flow::cache_push), as far as a pull reads it.
#[derive(Deserialize)]
struct StepConfig {
    schema: u64,
    key: String,
    inputs: serde_json::Value,
    result: StoredResult,
    store_root: PathBuf,
    step_dir: StepDirConfig,
    /// The image's layer steps (schema 3), their files the layers after the first two.
    #[serde(default)]
    carried_steps: Vec<CarriedStep>,
    /// Who made it (`crate::util::builder`); absent in artifacts pushed before it was kept.
    #[serde(default)]
    builder: Option<Builder>,
}

#[derive(Deserialize)]
struct Builder {
    #[serde(default)]
    commstack: String,
    #[serde(default)]
    commit: String,
    #[serde(default)]
    host: String,
}

#[derive(Deserialize)]
struct StepDirConfig {
    name: String,
    meta: StepMeta,
    shipped: PathBuf,
    shipped_is_file: bool,
}

/// A layer of the manifest.
#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    size: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    artifact_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl Substituter {
    /// Refuses a cache nobody is trusted for: with no trusted key and no
    /// `--allow-unsigned`, no output could be accepted.
    pub fn new(request: &SubstituteRequest, stack_path: &Path) -> Result<Substituter> {
        let target = Target::parse(&request.registry)
            .with_context(|| format!("the binary cache {:?}", request.registry))?;
        let trusted = request
            .trusted_keys
            .iter()
            .map(|k| {
                commstack_registry::sign::parse_public_key(k)
                    .with_context(|| format!("{}: [cache] trusted-keys", stack_path.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        if trusted.is_empty() && !request.allow_unsigned {
            bail!(
                "substituting from {}: {} trusts no key ([cache] trusted-keys is empty or absent), so no pulled output could be accepted: add the public key the cache is signed with (`trusted-keys = [\"ed25519:...\"]`, the key `cache push` prints), or pass --allow-unsigned to accept outputs without a trusted signature",
                target.name(),
                stack_path.display()
            );
        }
        let mut options = PushOptions::new(target);
        options.ca_file = request.ca_file.clone();
        options.progress = request.progress;
        Ok(Substituter {
            options,
            trusted,
            allow_unsigned: request.allow_unsigned,
            found: RefCell::new(BTreeMap::new()),
            puller: std::cell::OnceCell::new(),
            early_load: None,
            step_kinds: Box::new(crate::stack_steps::store_step_kind),
        })
    }

    /// For tests: the retries of each request (a registry gone is found out sooner).
    pub fn set_retry(&mut self, retry: commstack_registry::RetryPolicy) {
        self.options.retry = retry;
        self.puller = std::cell::OnceCell::new();
    }

    /// For tests: the credentials, instead of the environment's and Docker's.
    pub fn set_credentials(&mut self, credentials: commstack_registry::Credentials) {
        self.options.credentials = Some(credentials);
        self.puller = std::cell::OnceCell::new();
    }

    /// For tests whose recipes make store steps of other kinds than the stack's.
    pub fn set_step_kinds(&mut self, kinds: impl Fn(StepId) -> Option<String> + 'static) {
        self.step_kinds = Box::new(kinds);
    }

    /// Tell `feed` of each image layer tar as soon as it is downloaded and checked.
    pub fn feed_layers_to(&mut self, feed: std::sync::Arc<crate::flow::image::EarlyLoadFeed>) {
        self.early_load = Some(feed);
    }

    fn puller(&self) -> Result<&Puller> {
        if let Some(puller) = self.puller.get() {
            return Ok(puller);
        }
        let puller = Puller::new(&self.options)?;
        Ok(self.puller.get_or_init(|| puller))
    }

    fn place(&self, tag: &str) -> String {
        format!("{}:{tag}", self.options.target.name())
    }
}

/// The cache's tag of a graph step: its store name without `pipeline-`.
fn tag_of(key: &StepKey) -> String {
    key.dir_name().trim_start_matches("pipeline-").to_string()
}

impl Substitute<StepId> for Substituter {
    fn source(&self) -> String {
        self.options.target.name()
    }

    /// The one pull-or-build decision: a step whose output the cache may hold (one with
    /// a store-step kind, what `cache push` pushes) is pulled when the cache has its key,
    /// else built here.
    fn decide(&self, step: StepId, key: &StepKey) -> Result<Decision> {
        if (self.step_kinds)(step).is_none() {
            return Ok(Decision::Build { why: None });
        }
        let tag = tag_of(key);
        let Some(found) = self.puller()?.find_tag(&tag)? else {
            return Ok(Decision::Build {
                why: Some(format!(
                    "not in the binary cache {}: built here",
                    self.source()
                )),
            });
        };
        let from = format!("{}@{}", self.place(&tag), found.digest);
        self.found.borrow_mut().insert(tag, found);
        Ok(Decision::Pull { from })
    }

    fn pull(
        &self,
        store: &Store,
        step: StepId,
        key: &StepKey,
        say: &dyn Fn(&str),
    ) -> Result<StoredResult> {
        let kind = (self.step_kinds)(step);
        let kind = kind.as_deref();
        let tag = tag_of(key);
        let place = self.place(&tag);
        // Downloads go to files named by the blob: one process at a time writes them.
        let _downloads = store.lock_downloads()?;
        let found = match self.found.borrow().get(&tag).cloned() {
            Some(found) => found,
            None => self
                .puller()?
                .find_tag(&tag)?
                .with_context(|| format!("the binary cache has no {place} (any more)"))?,
        };
        let what = format!("the output of step {step} ({place}@{})", found.digest);
        self.check_signature(&found, &what, say)?;
        let manifest: Manifest = serde_json::from_slice(&found.manifest)
            .with_context(|| format!("{what}: the manifest is not an OCI image manifest"))?;
        if manifest.artifact_type.as_deref() != Some(STEP_ARTIFACT_TYPE)
            || manifest.annotations.get("dev.commstack.step.key") != Some(&key.dir_name())
        {
            bail!(
                "{what}: not the step artifact of {} (artifact type {:?}, key {:?}): refusing it",
                key.dir_name(),
                manifest.artifact_type,
                manifest.annotations.get("dev.commstack.step.key")
            );
        }
        let config = self
            .puller()?
            .pull_small_blob(&manifest.config.digest, manifest.config.size)
            .with_context(|| format!("{what}: its config"))?;
        let config: StepConfig = serde_json::from_slice(&config)
            .with_context(|| format!("{what}: its config is not a step's provenance"))?;
        let carried_files: usize = config.carried_steps.iter().map(|c| c.files.len()).sum();
        if config.schema != CONFIG_SCHEMA || manifest.layers.len() != 2 + carried_files {
            bail!(
                "{what}: pushed by another commstack (config schema {}, {} layers; this one reads schema {CONFIG_SCHEMA}, {} layers): push it again with this one (`cargo xtask cache push`)",
                config.schema,
                manifest.layers.len(),
                2 + carried_files
            );
        }
        // The key is the hash of the inputs: the config must hold the inputs of this key.
        if config.key != key.dir_name() || StepKey::new(&key.step, &config.inputs) != *key {
            bail!(
                "{what}: its config is for {} with other inputs, not for {}: refusing it",
                config.key,
                key.dir_name()
            );
        }
        if let Some(b) = &config.builder {
            say(&format!(
                "pushed by commstack {} (commit {}) on {}",
                b.commstack,
                b.commit.get(..12).unwrap_or(&b.commit),
                if b.host.is_empty() { "?" } else { &b.host }
            ));
        }
        let shipped = config
            .result
            .shipped
            .as_ref()
            .with_context(|| format!("{what}: its result ships nothing"))?;
        let dir = &config.step_dir;
        let crate_key = dir.meta.key();
        if StepKey::new(&crate_key.step, &dir.meta.inputs) != crate_key
            || crate_key.dir_name() != dir.name
            || !safe_relative(&dir.shipped)
        {
            bail!(
                "{what}: its crate step {} is not described by its own inputs (or names a path outside it): refusing it",
                dir.name
            );
        }
        // A step's artifact brings that step's kind of store directory and no other: a
        // `base-...` in the NVSHMEM artifact would be taken by a later build that reads
        // the base (an unsigned artifact under --allow-unsigned included).
        if let Some(kind) = kind
            && crate_key.step != kind
        {
            bail!(
                "{what}: it carries the store step {}, but step {step} makes `{kind}-...` steps: refusing it",
                dir.name
            );
        }

        // The store steps the output names (the image's layers) first: the crate step is
        // sealed only when what it names is here. Their blobs the store lacks come
        // several at a time (hashed as they stream); each step then takes its files.
        let carried: Vec<(&CarriedStep, &[Descriptor])> = config
            .carried_steps
            .iter()
            .scan(2, |next, c| {
                let layers = &manifest.layers[*next..*next + c.files.len()];
                *next += c.files.len();
                Some((c, layers))
            })
            .collect();
        for (c, layers) in &carried {
            check_carried(c, layers, &what)?;
        }
        // Where each carried step is in this store already (None: it is to be pulled).
        let in_store: Vec<Option<PathBuf>> = carried
            .iter()
            .map(|(c, _)| store.lookup(&c.meta.key()))
            .collect();
        // The layer tars (their sha256 the diff_ids), which go on into an early docker load.
        let layer_tars: std::collections::BTreeSet<&str> = carried
            .iter()
            .flat_map(|(c, layers)| c.files.iter().zip(layers.iter()))
            .filter(|(f, _)| f.path == Path::new(LAYER_FILE))
            .map(|(_, l)| l.digest.as_str())
            .collect();
        // Layer steps this store has, above the first it lacks: their chain moved with the
        // one below, so Docker needs their tars too, and they go into an early load now,
        // while the rest downloads.
        if let Some(feed) = &self.early_load
            && let Some(first) = in_store.iter().position(Option::is_none)
        {
            for ((c, layers), dir) in carried.iter().zip(&in_store).skip(first) {
                let Some(dir) = dir else { continue };
                for (f, l) in c.files.iter().zip(layers.iter()) {
                    if layer_tars.contains(l.digest.as_str()) {
                        feed.landed(&l.digest, &dir.join(&f.path), say);
                    }
                }
            }
        }
        let wanted: Vec<commstack_registry::pull::Wanted> = carried
            .iter()
            .zip(&in_store)
            .filter(|(_, dir)| dir.is_none())
            .flat_map(|((c, layers), _)| {
                c.files
                    .iter()
                    .zip(layers.iter())
                    .map(move |(f, l)| (c, f, l))
            })
            // Once each: two downloads of one blob would share its file.
            .map(|(c, f, l)| {
                let wanted = commstack_registry::pull::Wanted {
                    digest: l.digest.clone(),
                    size: l.size,
                    part: pull_part(store, &l.digest),
                    name: format!("{}/{}", c.name, f.path.display()),
                };
                (l.digest.clone(), wanted)
            })
            .collect::<BTreeMap<_, _>>()
            .into_values()
            .collect();
        if !wanted.is_empty() {
            let bytes: u64 = wanted.iter().map(|w| w.size).sum();
            say(&format!(
                "downloading {} blobs of {} layer steps ({:.2} GB), {PULL_JOBS} at a time",
                wanted.len(),
                carried.len(),
                bytes as f64 / 1e9
            ));
            let landed = |w: &commstack_registry::pull::Wanted| {
                if let Some(feed) = &self.early_load
                    && layer_tars.contains(w.digest.as_str())
                {
                    feed.landed(&w.digest, &w.part, say);
                }
            };
            self.puller()?
                .pull_blobs(&wanted, PULL_JOBS, &landed)
                .with_context(|| format!("{what}: the layers it carries"))?;
        }
        let downloaded: std::collections::BTreeSet<&str> =
            wanted.iter().map(|w| w.digest.as_str()).collect();
        for (c, layers) in &carried {
            self.pull_carried(store, c, layers, &downloaded, &what, say)?;
        }

        let outcome = store.run(&crate_key, &dir.meta.inputs, false, |out| {
            // The first two layers: the shipped files and the rest of the directory.
            let own_layers = &manifest.layers[..2];
            let parts: Vec<PathBuf> = own_layers
                .iter()
                .map(|l| pull_part(store, &l.digest))
                .collect();
            for (i, (layer, part)) in own_layers.iter().zip(&parts).enumerate() {
                say(&format!(
                    "layer {} of 2 ({}): {} bytes",
                    i + 1,
                    layer.digest,
                    layer.size
                ));
                self.puller()?
                    .pull_blob(&layer.digest, layer.size, part)
                    .with_context(|| format!("{what}: layer {} of 2", i + 1))?;
                let unpacked = out.out.join(format!(".pull-{i}"));
                commstack_archive::unpack(part, &unpacked, &Default::default())
                    .with_context(|| format!("{what}: unpacking layer {} of 2", i + 1))?;
                match i {
                    0 => {
                        let root = out.out.join(&dir.shipped);
                        match dir.shipped_is_file {
                            true => {
                                let name = dir
                                    .shipped
                                    .file_name()
                                    .context("a shipped file with no name")?;
                                move_into(&unpacked.join(name), &root)?;
                            }
                            false => move_into(&unpacked, &root)?,
                        }
                        check_shipped(&root, dir.shipped_is_file, &shipped.files)
                            .with_context(|| format!("{what}: {}", dir.name))?;
                    }
                    _ => move_into(&unpacked, &out.out)?,
                }
                let _ = std::fs::remove_dir_all(&unpacked);
            }
            for part in &parts {
                let _ = std::fs::remove_file(part);
            }
            // Both layers together: still exactly the shipped files (the second layer
            // added none to them), and no link that leads out of the step.
            check_shipped(
                &out.out.join(&dir.shipped),
                dir.shipped_is_file,
                &shipped.files,
            )
            .with_context(|| format!("{what}: {}", dir.name))?;
            links_stay_inside(&out.out).with_context(|| format!("{what}: {}", dir.name))?;
            Ok(())
        })?;
        match outcome.was_cached() {
            true => {
                // Made here before (the crate key is the same): its bytes must be those the
                // signed manifest records, or the result would describe other files.
                check_shipped(
                    &outcome.path().join(&dir.shipped),
                    dir.shipped_is_file,
                    &shipped.files,
                )
                .with_context(|| {
                    format!(
                        "{what}: the store's {} differs from the signed output: build it here instead (`cargo xtask build --only {step} --force`, or the build with --no-substitute)",
                        dir.name
                    )
                })?;
                say(&format!(
                    "the store has {} already, the same files: not downloaded",
                    dir.name
                ))
            }
            false => say(&format!("unpacked into {}", outcome.path().display())),
        }

        // The result in this home's paths: the pusher's store root becomes this one. A
        // path of the pusher's home outside its store (its download cache, its reports)
        // would name nothing here, or another file.
        let mut result = serde_json::to_value(&config.result)?;
        let elsewhere = home_paths_outside_the_store(&result, &config.store_root);
        if !elsewhere.is_empty() {
            bail!(
                "{what}: its result names paths of the pushing machine outside its store ({}), which this home does not have: refusing it (build the step here with --no-substitute)",
                elsewhere.join(", ")
            );
        }
        relocate(&mut result, &config.store_root, store.root());
        let result: StoredResult = serde_json::from_value(result)?;
        if let Some(output) = &result.result.output
            && !output.exists()
        {
            bail!(
                "{what}: its output {} is not in this store after the pull (the result names a step the artifact does not carry)",
                output.display()
            );
        }
        if let Some(output) = &result.result.output {
            image_layers_present(store, output).with_context(|| what.clone())?;
        }
        Ok(result)
    }
}

impl Substituter {
    /// One carried store step (an image layer's `image-layer-<hash>`, checked by
    /// [`check_carried`]), made in this store as `Store::run` makes a step: each file's
    /// blob downloaded (its sha256 the one the signed config records), moved into the step
    /// directory, sealed. A step the store has already is not downloaded.
    fn pull_carried(
        &self,
        store: &Store,
        carried: &CarriedStep,
        layers: &[Descriptor],
        downloaded: &std::collections::BTreeSet<&str>,
        what: &str,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let key = carried.meta.key();
        let outcome = store.run(&key, &carried.meta.inputs, false, |out| {
            use std::os::unix::fs::PermissionsExt;
            for (file, layer) in carried.files.iter().zip(layers) {
                say(&format!(
                    "{}/{} ({}): {} bytes",
                    carried.name,
                    file.path.display(),
                    layer.digest,
                    layer.size
                ));
                let part = pull_part(store, &layer.digest);
                // Downloaded and hashed just now (above): not read again.
                if !(downloaded.contains(layer.digest.as_str()) && part.is_file()) {
                    self.puller()?
                        .pull_blob(&layer.digest, layer.size, &part)
                        .with_context(|| {
                            format!("{what}: {}/{}", carried.name, file.path.display())
                        })?;
                }
                let to = out.out.join(&file.path);
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::rename(&part, &to).with_context(|| {
                    format!("cannot move {} to {}", part.display(), to.display())
                })?;
                let mode = if file.executable { 0o755 } else { 0o644 };
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
            }
            Ok(())
        })?;
        match outcome.was_cached() {
            true => say(&format!(
                "the store has {} already: not downloaded",
                carried.name
            )),
            false => say(&format!("unpacked into {}", outcome.path().display())),
        }
        Ok(())
    }
}

/// A carried store step must be an image layer step described by its own inputs, with
/// paths inside it, each file's blob the one its config records: checked for every step
/// before any of them is fed to Docker or downloaded.
fn check_carried(carried: &CarriedStep, layers: &[Descriptor], what: &str) -> Result<()> {
    let key = carried.meta.key();
    if StepKey::new(&key.step, &carried.meta.inputs) != key
        || key.step != commstack_image::assemble::LAYER_STEP
        || key.dir_name() != carried.name
        || !carried.files.iter().all(|f| safe_relative(&f.path))
    {
        bail!(
            "{what}: the store step {} it carries is not described by its own inputs (or names a path outside it): refusing it",
            carried.name
        );
    }
    for (file, layer) in carried.files.iter().zip(layers) {
        if layer.digest != format!("sha256:{}", file.sha256) || layer.size != file.size {
            bail!(
                "{what}: the layer for {}/{} is {} ({} bytes), its config records sha256:{} ({} bytes): refusing it",
                carried.name,
                file.path.display(),
                layer.digest,
                layer.size,
                file.sha256,
                file.size
            );
        }
    }
    Ok(())
}

/// How many blobs of an image's layers download at once.
const PULL_JOBS: usize = 3;

/// Where the download of blob `digest` goes (and is continued from after a cut).
fn pull_part(store: &Store, digest: &str) -> PathBuf {
    let hex = digest.trim_start_matches("sha256:");
    store.root().join("tmp").join(format!("pull-{hex}.tar"))
}

/// An image step's output names its layers' tars relative to the store's `steps/`: each
/// must be in this store now, at its recorded size (the base's comes with the base step).
fn image_layers_present(store: &Store, output: &Path) -> Result<()> {
    let image_json = output.join(commstack_image::assemble::IMAGE_FILE);
    if !output.is_dir() || !image_json.is_file() {
        return Ok(());
    }
    let image: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&image_json)?)
        .with_context(|| format!("{} is not JSON", image_json.display()))?;
    let steps = store.root().join("steps");
    for layer in image["layers"].as_array().into_iter().flatten() {
        let (Some(file), Some(size)) = (layer["file"].as_str(), layer["size"].as_u64()) else {
            bail!("{}: a layer without a file or size", image_json.display());
        };
        let path = steps.join(file);
        match std::fs::metadata(&path) {
            Ok(m) if m.len() == size => {}
            _ => bail!(
                "the image names the layer {} ({size} bytes), which is not in this store after the pull: the artifact does not carry it and no step made it",
                path.display()
            ),
        }
    }
    Ok(())
}

impl Substituter {
    /// The signature under the trusted keys. An unsigned output, or one whose signature
    /// is not by a trusted key or does not verify, is refused, or with --allow-unsigned
    /// said and taken; a registry that cannot be read is an error either way.
    fn check_signature(&self, found: &Found, what: &str, say: &dyn Fn(&str)) -> Result<()> {
        let doc = self
            .puller()?
            .fetch_signature(&found.digest)
            .with_context(|| format!("checking the signature of {what}"))?;
        let verdict = match &doc {
            None => Err(anyhow::anyhow!(
                "it is not signed (no {})",
                self.place(&commstack_registry::sign::signature_tag(&found.digest)?)
            )),
            Some(doc) => commstack_registry::sign::verify(doc, &found.digest, &self.trusted),
        };
        // A signature that names a trusted key but does not verify is tampering, not a
        // missing signature: --allow-unsigned does not take it.
        let claims_trusted = doc
            .as_ref()
            .and_then(|d| commstack_registry::sign::parse_public_key(&d.key).ok())
            .is_some_and(|k| self.trusted.contains(&k));
        match (verdict, doc) {
            (Ok(()), Some(doc)) => {
                say(&format!("signature by {} verified", doc.key));
                Ok(())
            }
            (Ok(()), None) => unreachable!("an unsigned output never verifies"),
            (Err(err), _) if self.allow_unsigned && !claims_trusted => {
                say(&format!(
                    "WARNING: {what}: {err:#}; taken because of --allow-unsigned"
                ));
                Ok(())
            }
            (Err(err), _) => Err(err.context(format!(
                "refusing {what}: a pulled output must be signed by a key of stack.toml's [cache] trusted-keys (add the key that signs the cache there, or pass --allow-unsigned to take outputs without a trusted signature)"
            ))),
        }
    }
}

/// Relative, with no `..`: a path the config names inside a step directory.
fn safe_relative(path: &Path) -> bool {
    path.components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// Moves `from` (a file, a link or a directory) to `to`, merging into directories that
/// exist there.
fn move_into(from: &Path, to: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(from)
        .with_context(|| format!("{} is not in the layer", from.display()))?;
    // Never merged through a link: a link of one layer cannot carry the other outside.
    if meta.is_dir() && std::fs::symlink_metadata(to).is_ok_and(|m| m.is_dir()) {
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            move_into(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    if std::fs::symlink_metadata(to).is_ok() {
        bail!(
            "{} is in both layers of the artifact: refusing it",
            to.display()
        );
    }
    std::fs::rename(from, to)
        .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))
}

/// Every symbolic link under `root` leads inside it: resolved by the system where its
/// target exists, else read from its directory's real path (it may dangle, not escape).
fn links_stay_inside(root: &Path) -> Result<()> {
    let real_root = std::fs::canonicalize(root)?;
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry = entry?;
        if !entry.path_is_symlink() {
            continue;
        }
        let inside = match std::fs::canonicalize(entry.path()) {
            Ok(real) => real.starts_with(&real_root),
            Err(_) => {
                let target = std::fs::read_link(entry.path())?;
                let parent = entry.path().parent().context("a link with no directory")?;
                let mut at = std::fs::canonicalize(parent)?;
                let mut inside = !target.is_absolute();
                for part in target.components() {
                    match part {
                        std::path::Component::ParentDir => {
                            at.pop();
                        }
                        std::path::Component::Normal(name) => at.push(name),
                        _ => {}
                    }
                    inside &= at.starts_with(&real_root);
                }
                inside
            }
        };
        if !inside {
            bail!(
                "the link {} leads out of the step directory ({}): refusing it",
                entry.path().display(),
                std::fs::read_link(entry.path())?.display()
            );
        }
    }
    Ok(())
}

/// Every shipped file as the artifact's config records it: content, size, mode, links.
fn check_shipped(
    root: &Path,
    is_file: bool,
    want: &BTreeMap<String, commstack_digest::manifest::Entry>,
) -> Result<()> {
    let skip = |rel: &str| !is_file && crate::graph::not_shipped(rel);
    let now = commstack_digest::manifest::manifest(root, &skip)
        .with_context(|| format!("hashing {}", root.display()))?;
    let differences = commstack_digest::manifest::differences(want, &now);
    if !differences.is_empty() {
        let named = crate::util::named_differences(want, &now, "not in the manifest");
        bail!(
            "the pulled files are not those the signed manifest records ({} differ: {}): refusing them",
            differences.len(),
            named.join("; ")
        );
    }
    Ok(())
}

/// Every string of `value` that is `from` or starts with `from/` gets `to` instead.
fn relocate(value: &mut serde_json::Value, from: &Path, to: &Path) {
    match value {
        serde_json::Value::String(s) => {
            if let Ok(rest) = Path::new(s.as_str()).strip_prefix(from) {
                let moved = match rest.as_os_str().is_empty() {
                    true => to.to_path_buf(),
                    false => to.join(rest),
                };
                *s = moved.to_string_lossy().into_owned();
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                relocate(item, from, to);
            }
        }
        serde_json::Value::Object(map) => {
            for item in map.values_mut() {
                relocate(item, from, to);
            }
        }
        _ => {}
    }
}

/// The strings of `value` that are paths in the home of `store_root` (its parent) but not
/// in the store.
fn home_paths_outside_the_store(value: &serde_json::Value, store_root: &Path) -> Vec<String> {
    let Some(home) = store_root.parent().filter(|h| h.components().count() > 1) else {
        return Vec::new();
    };
    match value {
        serde_json::Value::String(s) => {
            let path = Path::new(s.as_str());
            match path.starts_with(home) && !path.starts_with(store_root) {
                true => vec![s.clone()],
                false => Vec::new(),
            }
        }
        serde_json::Value::Array(items) => items
            .iter()
            .flat_map(|v| home_paths_outside_the_store(v, store_root))
            .collect(),
        serde_json::Value::Object(map) => map
            .values()
            .flat_map(|v| home_paths_outside_the_store(v, store_root))
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_the_pushers_home_outside_its_store_are_found() {
        let v = serde_json::json!({
            "output": "/home/a/store/steps/x-1/out.whl",
            "facts": { "report": "/home/a/reports/image-1/verify.json", "n": 3,
                       "in_image": "/opt/commstack/venv", "list": ["/home/a/cache/ab"],
                       "near": "/home/a/storey/z" },
        });
        assert_eq!(
            home_paths_outside_the_store(&v, Path::new("/home/a/store")),
            [
                "/home/a/cache/ab",
                "/home/a/storey/z",
                "/home/a/reports/image-1/verify.json"
            ]
        );
        // A store at the root of a file system has no home to speak of.
        assert!(home_paths_outside_the_store(&v, Path::new("/store")).is_empty());
    }

    #[test]
    fn paths_of_the_pushers_store_move_into_this_one() {
        let mut v = serde_json::json!({
            "output": "/home/a/store/steps/x-1/out.whl",
            "facts": { "wheel": { "path": "/home/a/store/steps/y-2/w.whl" }, "n": 3,
                       "other": "/home/a/storey/z", "list": ["/home/a/store"] },
        });
        relocate(&mut v, Path::new("/home/a/store"), Path::new("/b/s"));
        assert_eq!(v["output"], "/b/s/steps/x-1/out.whl");
        assert_eq!(v["facts"]["wheel"]["path"], "/b/s/steps/y-2/w.whl");
        assert_eq!(
            v["facts"]["other"], "/home/a/storey/z",
            "a prefix of a name is not a directory"
        );
        assert_eq!(v["facts"]["list"][0], "/b/s");
        assert_eq!(v["facts"]["n"], 3);
    }
}
