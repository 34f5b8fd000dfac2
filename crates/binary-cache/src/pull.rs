//! `build --substitute`: the binary cache's pull side. Before a keyed step runs, the graph
//! looks for `<step>-<key>` (what `cache push` tags, crate::push) in the cache
//! repository; when it is there, this takes it instead of building:
//!
//! 1. the signature (cosign's format: a referrer of the manifest, else its tag
//!    `sha256-<hex>.sig`) is verified under stack.toml's `[cache]
//!    trusted-keys` (an unsigned or untrusted output is refused unless `--allow-unsigned`,
//!    and then every store step it brings is marked so);
//! 2. the manifest must be a step artifact of this very key (its annotation), and its
//!    config ([`crate::config::StepConfig`], read within its bound) is checked
//!    whole before anything is written: this key and its inputs, the crate step and the
//!    carried steps described by their own inputs and of the kinds the step's artifact
//!    may bring, every name a step name and every path a plain path inside a step;
//! 3. each layer is downloaded into the store's tmp/ with its sha256 checked as it streams
//!    (an interrupted download continues on the rerun), unpacked with the one unpacker
//!    into that crate step's directory as `Store::run` builds it (so it is sealed, or
//!    moved to failed/, exactly as a local build is), the shipped files compared with the
//!    config's manifest before anything is sealed;
//! 4. the result is made in this store's paths (the config names none of the pusher's),
//!    and the engine seals the graph step with it (commstack_steps::graph).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_registry::pull::{Found, Puller, Wanted};
use commstack_registry::{Document, PushOptions, Target, VerifyingKey};
use commstack_store::{StepKey, Store};
use serde::Deserialize;

use crate::config::{
    ArtifactKinds, CarriedStep, Expected, KEY_ANNOTATION, STEP_ARTIFACT_TYPE, StepConfig, shown,
};
use commstack_graph::Substitute;
use commstack_image::assemble::LAYER_FILE;
use commstack_steps::graph::{Decision, Pulled, Shipped, StepId, StepResult, StoredResult};

/// Where to substitute from, and whom to trust.
#[derive(Clone, Debug)]
pub struct SubstituteRequest {
    /// `HOST[:PORT]/REPO`.
    pub registry: String,
    /// `ed25519:<base64>` each (stack.toml's `[cache] trusted-keys`).
    pub trusted_keys: Vec<String>,
    /// Accept outputs that are unsigned or signed by no trusted key (said on each, and
    /// marked in the store).
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
    early_load: Option<std::sync::Arc<commstack_steps::flow::image::EarlyLoadFeed>>,
    /// The kinds of store step each step's artifact may bring, None for a step never
    /// pulled (the stack's [`commstack_steps::stack_steps::artifact_kinds`], or a test's).
    artifact_kinds: Box<dyn Fn(StepId) -> Option<ArtifactKinds>>,
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

/// An artifact whose manifest and config passed their checks.
struct Checked {
    manifest: Manifest,
    config: StepConfig,
    /// Why it is taken without a trusted signature (None: signed by a trusted key).
    unsigned: Option<String>,
    /// `the output of step S (HOST/REPO:TAG@sha256:...)`, for messages.
    what: String,
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
                // `ed25519:<base64>`, or a PEM public key file (cosign.pub) beside stack.toml.
                match k.starts_with("ed25519:") {
                    true => commstack_registry::sign::parse_public_key(k),
                    false => commstack_registry::sign::read_public_key(
                        &stack_path.parent().unwrap_or(Path::new(".")).join(k),
                    ),
                }
                .with_context(|| format!("{}: [cache] trusted-keys", stack_path.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        if trusted.is_empty() && !request.allow_unsigned {
            bail!(
                "substituting from {}: {} trusts no key ([cache] trusted-keys is empty or absent), so no pulled output could be accepted: add the public key the cache is signed with (`trusted-keys = [\"ed25519:...\"]`, the key `cache push` prints, or the path of its PEM file, `openssl pkey -in KEY.pem -pubout -out cosign.pub`), or pass --allow-unsigned to accept outputs without a trusted signature",
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
            artifact_kinds: Box::new(commstack_steps::stack_steps::artifact_kinds),
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
    pub fn set_artifact_kinds(
        &mut self,
        kinds: impl Fn(StepId) -> Option<ArtifactKinds> + 'static,
    ) {
        self.artifact_kinds = Box::new(kinds);
    }

    /// Tell `feed` of each image layer tar as soon as it is downloaded and checked.
    pub fn feed_layers_to(
        &mut self,
        feed: std::sync::Arc<commstack_steps::flow::image::EarlyLoadFeed>,
    ) {
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
    /// artifact kinds, what `cache push` pushes) is pulled when the cache has its key,
    /// else built here.
    fn decide(&self, step: StepId, key: &StepKey) -> Result<Decision> {
        if (self.artifact_kinds)(step).is_none() {
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
    ) -> Result<Pulled> {
        let kinds = (self.artifact_kinds)(step)
            .with_context(|| format!("step {step} cannot come from a binary cache"))?;
        let kinds = &kinds;
        // Downloads go to files named by the blob: one process at a time writes them.
        let _downloads = store.lock_downloads()?;
        let artifact = self.checked(step, key, kinds, say)?;
        if let Some(b) = &artifact.config.builder {
            say(&format!(
                "pushed by commstack {} (commit {}) on {}",
                shown(&b.commstack),
                shown(b.commit.get(..12).unwrap_or(&b.commit)),
                if b.host.is_empty() {
                    "?".into()
                } else {
                    shown(&b.host)
                }
            ));
        }
        // The store steps the output names (the image's layers) first: the crate step is
        // sealed only when what it names is here.
        self.pull_carried_steps(store, &artifact, say)?;
        self.pull_crate_step(store, step, &artifact, say)?;
        let stored = result_here(store, &artifact.config).with_context(|| artifact.what.clone())?;
        Ok(Pulled {
            stored,
            unsigned: artifact.unsigned,
        })
    }
}

impl Substituter {
    /// The artifact of `key`: its signature verified (or, with --allow-unsigned, why it is
    /// taken without), its manifest a step artifact of this key, its config read within
    /// its bound and checked whole ([`StepConfig::validate`]) before anything is written.
    fn checked(
        &self,
        step: StepId,
        key: &StepKey,
        kinds: &ArtifactKinds,
        say: &dyn Fn(&str),
    ) -> Result<Checked> {
        let tag = tag_of(key);
        let place = self.place(&tag);
        let found = match self.found.borrow().get(&tag).cloned() {
            Some(found) => found,
            None => self
                .puller()?
                .find_tag(&tag)?
                .with_context(|| format!("the binary cache has no {place} (any more)"))?,
        };
        let what = format!("the output of step {step} ({place}@{})", found.digest);
        let unsigned = self.check_signature(&found, &what, say)?;
        let manifest: Manifest = serde_json::from_slice(&found.manifest)
            .with_context(|| format!("{what}: the manifest is not an OCI image manifest"))?;
        let annotated = manifest.annotations.get(KEY_ANNOTATION);
        if manifest.artifact_type.as_deref() != Some(STEP_ARTIFACT_TYPE)
            || annotated != Some(&key.dir_name())
        {
            bail!(
                "{what}: not the step artifact of {} (artifact type {}, key {}): refusing it",
                key.dir_name(),
                shown(manifest.artifact_type.as_deref().unwrap_or("none")),
                shown(annotated.map_or("none", String::as_str))
            );
        }
        let config = self
            .puller()?
            .pull_document(
                &manifest.config.digest,
                manifest.config.size,
                Document::Config,
            )
            .with_context(|| format!("{what}: its config"))?;
        let config: StepConfig = serde_json::from_slice(&config).with_context(|| {
            format!(
                "{what}: its config is not a step's provenance (config schema {})",
                crate::config::CONFIG_SCHEMA
            )
        })?;
        config
            .validate(&Expected {
                key,
                step: step.name(),
                kinds,
                layers: manifest.layers.len(),
            })
            .with_context(|| what.clone())?;
        Ok(Checked {
            manifest,
            config,
            unsigned,
            what,
        })
    }

    /// The store steps the artifact carries whole (the image's layer steps), each made as
    /// `Store::run` makes a step: their blobs the store lacks come several at a time
    /// (hashed as they stream), then each step takes its files.
    fn pull_carried_steps(
        &self,
        store: &Store,
        artifact: &Checked,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let what = &artifact.what;
        let carried: Vec<(&CarriedStep, &[Descriptor])> = artifact
            .config
            .carried_steps
            .iter()
            .scan(2, |next, c| {
                let layers = &artifact.manifest.layers[*next..*next + c.files.len()];
                *next += c.files.len();
                Some((c, layers))
            })
            .collect();
        for (c, layers) in &carried {
            check_carried(c, layers, what)?;
        }
        // Where each carried step is in this store already (None: it is to be pulled; a
        // step marked unsigned is made again).
        let in_store: Vec<Option<PathBuf>> = carried
            .iter()
            .map(|(c, _)| {
                let key = c.meta.key();
                store
                    .lookup(&key)
                    .filter(|_| store.unsigned(&key).is_none())
            })
            .collect();
        // The layer tars (their sha256 the diff_ids), which go on into an early docker load.
        let layer_tars: BTreeSet<&str> = carried
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
        let wanted: Vec<Wanted> = carried
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
                let wanted = Wanted {
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
            let landed = |w: &Wanted| {
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
        let downloaded: BTreeSet<&str> = wanted.iter().map(|w| w.digest.as_str()).collect();
        for (c, layers) in &carried {
            self.pull_carried(store, c, layers, &downloaded, artifact, say)?;
        }
        Ok(())
    }

    /// The crate step the result lives in: its first two layers (the shipped files, the
    /// rest of the directory) unpacked with the one unpacker, the shipped files compared
    /// with the config's manifest before the second layer joins them and again after, no
    /// link leading out, sealed as a local build is (or moved to failed/). A crate step the
    /// store has already must hold the same shipped files.
    fn pull_crate_step(
        &self,
        store: &Store,
        step: StepId,
        artifact: &Checked,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let (config, what) = (&artifact.config, &artifact.what);
        let dir = &config.step_dir;
        let shipped = &config.result.shipped;
        let outcome = store.run(&dir.meta.key(), &dir.meta.inputs, false, |out| {
            if let Some(why) = &artifact.unsigned {
                out.mark_unsigned(why);
            }
            // The first two layers: the shipped files and the rest of the directory.
            let own_layers = &artifact.manifest.layers[..2];
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
                        check_shipped(&root, dir.shipped_is_file, shipped)
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
            check_shipped(&out.out.join(&dir.shipped), dir.shipped_is_file, shipped)
                .with_context(|| format!("{what}: {}", dir.name))?;
            links_stay_inside(&out.out).with_context(|| format!("{what}: {}", dir.name))?;
            Ok(())
        })?;
        match outcome.was_cached() {
            true => {
                // Made here before (the crate key is the same): its bytes must be those the
                // manifest records, or the result would describe other files.
                check_shipped(
                    &outcome.path().join(&dir.shipped),
                    dir.shipped_is_file,
                    shipped,
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
        Ok(())
    }

    /// One carried store step (an image layer's `image-layer-<hash>`, checked by
    /// [`check_carried`]), made in this store as `Store::run` makes a step: each file's
    /// blob downloaded (its sha256 the one the config records), moved into the step
    /// directory, sealed. A step the store has already is not downloaded.
    fn pull_carried(
        &self,
        store: &Store,
        carried: &CarriedStep,
        layers: &[Descriptor],
        downloaded: &BTreeSet<&str>,
        artifact: &Checked,
        say: &dyn Fn(&str),
    ) -> Result<()> {
        let what = &artifact.what;
        let key = carried.meta.key();
        let outcome = store.run(&key, &carried.meta.inputs, false, |out| {
            use std::os::unix::fs::PermissionsExt;
            if let Some(why) = &artifact.unsigned {
                out.mark_unsigned(why);
            }
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

/// The result of a pulled step in this store: every path made from this store's root and
/// the names the (checked) config gives. Its output must be there now, and an image's
/// layers too.
fn result_here(store: &Store, config: &StepConfig) -> Result<StoredResult> {
    let root = store.root();
    let output = config.output_in(root);
    if let Some(output) = &output
        && std::fs::symlink_metadata(output).is_err()
    {
        bail!(
            "its output {} is not in this store after the pull (the artifact does not carry it): refusing it",
            output.display()
        );
    }
    if let Some(output) = &output {
        image_layers_present(store, output)?;
    }
    Ok(StoredResult {
        result: StepResult {
            output,
            facts: config.facts_in(root),
        },
        shipped: Some(Shipped {
            root: config.shipped_root_in(root),
            files: config.result.shipped.clone(),
        }),
    })
}

/// A carried store step's files are the blobs its config records (digest and size):
/// checked for every step before any of them is fed to Docker or downloaded. (Its kind,
/// name and paths are checked with the config, [`StepConfig::validate`].)
fn check_carried(carried: &CarriedStep, layers: &[Descriptor], what: &str) -> Result<()> {
    for (file, layer) in carried.files.iter().zip(layers) {
        if layer.digest != format!("sha256:{}", file.sha256) || layer.size != file.size {
            bail!(
                "{what}: the layer for {}/{} is {} ({} bytes), its config records sha256:{} ({} bytes): refusing it",
                carried.name,
                file.path.display(),
                shown(&layer.digest),
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
/// must be a plain path in a step of this store (never elsewhere on this machine), there
/// now at its recorded size (the base's comes with the base step).
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
        let in_a_step = Path::new(file).components().count() >= 2
            && Path::new(file)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
        if !in_a_step {
            bail!(
                "{}: the layer {} is not a path in a step of the store: refusing it",
                image_json.display(),
                shown(file)
            );
        }
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
    /// The signature under the trusted keys: Ok(None) when it verifies. An unsigned
    /// output, or one signed by a key not trusted, is refused, or with --allow-unsigned
    /// said and taken: Ok(Some(why)), which marks what it brings. A signature that names a
    /// trusted key and does not verify is tampering: refused even then. A registry that
    /// cannot be read is an error either way.
    fn check_signature(
        &self,
        found: &Found,
        what: &str,
        say: &dyn Fn(&str),
    ) -> Result<Option<String>> {
        let signatures = self
            .puller()?
            .fetch_signatures(&found.digest)
            .with_context(|| format!("checking the signature of {what}"))?;
        let verdict = signatures.verify(&found.digest, &self.trusted);
        let claims_trusted = signatures.claims_trusted(&self.trusted);
        match (verdict, signatures) {
            (Ok(key), signatures) => {
                say(&format!(
                    "signature by {} verified ({})",
                    commstack_registry::sign::public_key_text(&key),
                    signatures.place()
                ));
                Ok(None)
            }
            (Err(err), _) if claims_trusted => Err(err.context(format!(
                "refusing {what}: its signature names a trusted key and does not verify, so the artifact or its signature was altered (--allow-unsigned does not take that): push it again (`cargo xtask cache push`), or build it here with --no-substitute"
            ))),
            (Err(err), _) if self.allow_unsigned => {
                let why = format!(
                    "pulled from {}@{} with --allow-unsigned: {err:#}",
                    self.place(&found.tag),
                    found.digest
                );
                say(&format!("WARNING: {what}: {err:#}; taken because of --allow-unsigned"));
                Ok(Some(why))
            }
            (Err(err), _) => Err(err.context(format!(
                "refusing {what}: a pulled output must be signed by a key of stack.toml's [cache] trusted-keys (add the key that signs the cache there, or pass --allow-unsigned to take outputs without a trusted signature)"
            ))),
        }
    }
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
    let skip = |rel: &str| !is_file && commstack_steps::graph::not_shipped(rel);
    let now = commstack_digest::manifest::manifest(root, &skip)
        .with_context(|| format!("hashing {}", root.display()))?;
    let differences = commstack_digest::manifest::differences(want, &now);
    if !differences.is_empty() {
        let named =
            commstack_digest::manifest::named_differences(want, &now, "not in the manifest");
        bail!(
            "the pulled files are not those the signed manifest records ({} differ: {}): refusing them",
            differences.len(),
            named.join("; ")
        );
    }
    Ok(())
}
