//! The binary cache's wire format: the config of a step artifact, one type that `cache
//! push` writes (crate::push) and `build --substitute` reads
//! (crate::pull), and the check a puller makes of it before anything of it
//! is written ([`StepConfig::validate`]).
//!
//! Nothing in it names a path of the machine that pushed it. The step's output is a path
//! inside the crate step directory the artifact carries, every store path in the result's
//! facts is written relative to the store (`store:steps/<name>/...`), and a puller makes
//! every path from its own store root and the names the config gives, each checked: a
//! step name is `[A-Za-z0-9_-]+`, a path inside a step has only plain components (no
//! `/` at its start, no `..`, no control character). Which kinds of store step an
//! artifact may bring is the caller's to say ([`ArtifactKinds`]; for the stack's own
//! steps, commstack_steps::stack_steps).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_digest::manifest::Entry;
use commstack_store::{StepKey, StepMeta, valid_step_name};
use serde::{Deserialize, Serialize};

pub use commstack_steps::stack_steps::ArtifactKinds;

/// The artifact type of a step output, and its config's media type.
pub const STEP_ARTIFACT_TYPE: &str = "application/vnd.dev.commstack.step.v1";
pub const STEP_CONFIG_MEDIA_TYPE: &str = "application/vnd.dev.commstack.step.config.v1+json";
/// An uncompressed tar: wheels and the base's tar are compressed or large already, and
/// the tar (commstack_image::write_layer) is the same bytes for the same files anywhere.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// A file of a carried store step (an image layer's `layer.tar`, `layer.json`), as it is.
pub const CARRIED_FILE_MEDIA_TYPE: &str = "application/vnd.dev.commstack.step.file.v1";
/// The manifest annotation that names the graph step's key (the signature covers it).
pub const KEY_ANNOTATION: &str = "dev.commstack.step.key";
/// The config's schema: 2 added the crate step directory and the second layer; 3 the
/// store steps carried beside it (`carried_steps`); 4 no path of the pushing machine (the
/// output relative to the crate step, store paths in the facts relative to the store).
pub const CONFIG_SCHEMA: u64 = 4;
/// How a store path is written in the facts: `store:steps/<name>/<path in the step>`.
pub const STORE_PATH: &str = "store:";
/// The longest path the config may name, and the longest component of one.
const MAX_PATH: usize = 4096;
const MAX_COMPONENT: usize = 255;

/// The config of a step artifact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepConfig {
    pub schema: u64,
    /// The graph step's store directory name (`pipeline-nvshmem-<hash>`): its key.
    pub key: String,
    /// The graph step's inputs: their hash is the key.
    pub inputs: serde_json::Value,
    pub result: ResultConfig,
    /// The crate step the result lives in.
    pub step_dir: StepDirConfig,
    /// Store steps carried whole, their files the layers after the first two.
    #[serde(default)]
    pub carried_steps: Vec<CarriedStep>,
    /// What the layers are, in order: for whoever reads the registry (not read back).
    #[serde(default)]
    pub layers: Vec<String>,
    /// `commstack <version>` of the pusher.
    #[serde(default)]
    pub pushed_by: String,
    /// Who made it (`commstack_steps::util::builder`).
    #[serde(default)]
    pub builder: Option<Builder>,
}

/// The graph step's result, with no path of the pushing machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultConfig {
    /// The output, relative to the crate step directory (empty: the directory itself).
    pub output: Option<PathBuf>,
    /// The facts, every store path as `store:<path relative to the store root>`.
    #[serde(default)]
    pub facts: serde_json::Value,
    /// Every shipped file (sha256, size, mode; a link's target), relative to
    /// `step_dir.shipped`: what the first layer must hold.
    pub shipped: BTreeMap<String, Entry>,
}

/// The crate step directory the result lives in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepDirConfig {
    /// Its store name, `<kind>-<hash>`.
    pub name: String,
    /// Its `.step.json`: the key and the inputs it was made from.
    pub meta: StepMeta,
    /// Where the shipped files lie in it (empty: the directory itself).
    pub shipped: PathBuf,
    /// The shipped root is one file (a wheel), not a directory.
    pub shipped_is_file: bool,
}

/// A store step the artifact carries whole beside the crate step, one layer per file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CarriedStep {
    pub name: String,
    /// Its `.step.json`: its key and inputs.
    pub meta: StepMeta,
    pub files: Vec<CarriedFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CarriedFile {
    /// Relative to the step directory.
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
    pub executable: bool,
}

/// Who pushed: commstack's version and commit, the host, its kernel and architecture.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Builder {
    #[serde(default)]
    pub commstack: String,
    #[serde(default)]
    pub commit: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub kernel: String,
    #[serde(default)]
    pub arch: String,
}

/// What a config must be for: the graph step (its key and name) and the kinds of store
/// step its artifact may bring, and the manifest's layer count.
pub struct Expected<'a> {
    pub key: &'a StepKey,
    /// `nvshmem`: the graph step, for messages.
    pub step: &'a str,
    pub kinds: &'a ArtifactKinds,
    pub layers: usize,
}

impl StepConfig {
    /// Everything a puller takes from the config, checked before anything is written:
    /// the schema and layer count, the key and the inputs it is the hash of, the crate
    /// step and every carried step described by their own inputs and of the kinds
    /// `expected` allows, every name a step name, every path a plain relative path, no
    /// path of the pushing machine in the facts.
    pub fn validate(&self, expected: &Expected) -> Result<()> {
        let carried_files: usize = self.carried_steps.iter().map(|c| c.files.len()).sum();
        if self.schema != CONFIG_SCHEMA || expected.layers != 2 + carried_files {
            bail!(
                "pushed by another commstack (config schema {}, {} layers; this one reads schema {CONFIG_SCHEMA}, {} layers): push it again with this one (`cargo xtask cache push`)",
                self.schema,
                expected.layers,
                2 + carried_files
            );
        }
        // The key is the hash of the inputs: the config must hold the inputs of this key.
        let key = expected.key;
        if self.key != key.dir_name() || StepKey::new(&key.step, &self.inputs) != *key {
            bail!(
                "its config is for {} with other inputs, not for {}: refusing it",
                shown(&self.key),
                key.dir_name()
            );
        }
        let dir = &self.step_dir;
        let kind = described(&dir.name, &dir.meta).context("its crate step")?;
        // A step's artifact brings that step's kind of store directory and no other: a
        // `base-...` in NVSHMEM's artifact would be taken by a later build that reads the
        // base.
        if kind != expected.kinds.own {
            bail!(
                "it carries the store step {}, but step {} makes `{}-...` steps: refusing it",
                shown(&dir.name),
                expected.step,
                expected.kinds.own
            );
        }
        plain_path(&dir.shipped, true).context("its crate step's shipped root")?;
        if let Some(output) = &self.result.output {
            plain_path(output, true).context("its result's output")?;
        }
        for rel in self.result.shipped.keys() {
            plain_path(Path::new(rel), false).context("its shipped files")?;
        }
        check_facts(&self.result.facts).context("its result's facts")?;
        let mut names = BTreeSet::from([dir.name.as_str()]);
        for c in &self.carried_steps {
            let kind = described(&c.name, &c.meta).context("a store step it carries")?;
            if !expected.kinds.carried.contains(&kind) {
                bail!(
                    "it carries the store step {}, of kind `{kind}`, and step {}'s artifact may carry {}: refusing it",
                    shown(&c.name),
                    expected.step,
                    match expected.kinds.carried.is_empty() {
                        true => "none".to_string(),
                        false => format!(
                            "only `{}-...` steps",
                            expected.kinds.carried.join("-...`, `")
                        ),
                    }
                );
            }
            if !names.insert(&c.name) {
                bail!("it carries the store step {} twice: refusing it", c.name);
            }
            let mut paths = BTreeSet::new();
            for f in &c.files {
                plain_path(&f.path, false)
                    .with_context(|| format!("a file of the store step {} it carries", c.name))?;
                if !paths.insert(&f.path) || !is_sha256_hex(&f.sha256) {
                    bail!(
                        "the store step {} it carries names {} twice or with no sha256: refusing it",
                        c.name,
                        shown(&f.path.to_string_lossy())
                    );
                }
            }
        }
        Ok(())
    }

    /// The crate step directory in the store at `store_root` (checked: a step name).
    pub fn step_dir_in(&self, store_root: &Path) -> PathBuf {
        store_root.join("steps").join(&self.step_dir.name)
    }

    /// Where the output is in the store at `store_root`.
    pub fn output_in(&self, store_root: &Path) -> Option<PathBuf> {
        let dir = self.step_dir_in(store_root);
        self.result
            .output
            .as_ref()
            .map(|o| match o.as_os_str().is_empty() {
                true => dir,
                false => dir.join(o),
            })
    }

    /// Where the shipped files are in the store at `store_root`.
    pub fn shipped_root_in(&self, store_root: &Path) -> PathBuf {
        let dir = self.step_dir_in(store_root);
        match self.step_dir.shipped.as_os_str().is_empty() {
            true => dir,
            false => dir.join(&self.step_dir.shipped),
        }
    }

    /// The facts with every store path in the store at `store_root`.
    pub fn facts_in(&self, store_root: &Path) -> serde_json::Value {
        let mut facts = self.result.facts.clone();
        map_strings(&mut facts, &mut |s| {
            s.strip_prefix(STORE_PATH)
                .map(|rel| store_root.join(rel).to_string_lossy().into_owned())
        });
        facts
    }
}

/// The facts of a result made in the store at `store_root`, for the wire: each store path
/// as `store:<relative>`. Another absolute path is an error: another home has no such
/// file (the pusher's download cache, its reports).
pub fn facts_for_the_wire(
    facts: &serde_json::Value,
    store_root: &Path,
) -> Result<serde_json::Value> {
    let mut out = facts.clone();
    let mut outside = Vec::new();
    map_strings(&mut out, &mut |s| {
        let path = Path::new(s);
        match path.strip_prefix(store_root) {
            Ok(rel) => Some(format!("{STORE_PATH}{}", rel.to_string_lossy())),
            Err(_) if path.is_absolute() => {
                outside.push(s.to_string());
                None
            }
            Err(_) => None,
        }
    });
    if !outside.is_empty() {
        bail!(
            "the result names paths outside the store {} ({}), which another home does not have: it cannot go to a binary cache",
            store_root.display(),
            outside.join(", ")
        );
    }
    Ok(out)
}

/// The kind of a store step the config describes by its name and `.step.json`: the name
/// must be the key its inputs hash to, and the kind a step name.
fn described(name: &str, meta: &StepMeta) -> Result<String> {
    let key = StepKey::try_new(&meta.step, &meta.inputs)
        .with_context(|| format!("the store step {}: refusing it", shown(name)))?;
    if key.hash != meta.hash || key.dir_name() != name {
        bail!(
            "the store step {} is not described by its own inputs: refusing it",
            shown(name)
        );
    }
    Ok(key.step)
}

/// `path` has only plain components, each a name of at most 255 bytes without control
/// characters (empty when `may_be_empty`): a path inside a step directory.
fn plain_path(path: &Path, may_be_empty: bool) -> Result<()> {
    let text = path.to_str().unwrap_or("\u{fffd}");
    let plain = path.components().all(|c| match c {
        Component::Normal(name) => name
            .to_str()
            .is_some_and(|n| n.len() <= MAX_COMPONENT && !n.chars().any(char::is_control)),
        _ => false,
    });
    if !plain || text.len() > MAX_PATH || (!may_be_empty && text.is_empty()) {
        bail!(
            "{:?} is not a plain relative path inside a step (no leading `/`, no `..`, no control character): refusing it",
            shown(text)
        );
    }
    Ok(())
}

/// No absolute path in the facts; every `store:` path is a plain path in a step of the
/// store (`store:steps/<step>-<hash>/...`); no `..` anywhere.
fn check_facts(facts: &serde_json::Value) -> Result<()> {
    let mut bad = None;
    let mut probe = facts.clone();
    map_strings(&mut probe, &mut |s| {
        if bad.is_some() {
            return None;
        }
        let ok = match s.strip_prefix(STORE_PATH) {
            Some(rel) => {
                let mut parts = Path::new(rel).components();
                plain_path(Path::new(rel), false).is_ok()
                    && parts.next() == Some(Component::Normal("steps".as_ref()))
                    && parts
                        .next()
                        .and_then(|c| c.as_os_str().to_str())
                        .is_some_and(valid_step_dir_name)
            }
            None => {
                !Path::new(s).is_absolute()
                    && !Path::new(s).components().any(|c| c == Component::ParentDir)
            }
        };
        if !ok {
            bad = Some(s.to_string());
        }
        None
    });
    match bad {
        Some(s) => bail!(
            "they name {:?}, a path outside this store (a pulled result may name files in the store only): refusing it",
            shown(&s)
        ),
        None => Ok(()),
    }
}

/// `<step>-<32 lowercase hex>`: a store step directory's name.
fn valid_step_dir_name(name: &str) -> bool {
    name.rsplit_once('-')
        .is_some_and(|(step, hash)| valid_step_name(step) && hash.len() == 32 && is_hex(hash))
}

fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && is_hex(text)
}

fn is_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Every string of `value` that `map` gives a replacement for, replaced.
fn map_strings(value: &mut serde_json::Value, map: &mut dyn FnMut(&str) -> Option<String>) {
    match value {
        serde_json::Value::String(s) => {
            if let Some(new) = map(s) {
                *s = new;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| map_strings(v, map)),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(|v| map_strings(v, map)),
        _ => {}
    }
}

/// Untrusted text for a message: control characters escaped, cut after 120 characters.
pub fn shown(text: &str) -> String {
    const MAX: usize = 120;
    let cut: String = text.chars().take(MAX).collect();
    let more = if text.chars().count() > MAX {
        "..."
    } else {
        ""
    };
    format!("{}{more}", commstack_digest::terminal_safe(&cut))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(step: &str, inputs: serde_json::Value) -> StepMeta {
        let key = StepKey::new(step, &inputs);
        StepMeta {
            schema: 1,
            step: step.into(),
            hash: key.hash,
            inputs,
            created: "2026-01-01T00:00:00Z".parse().unwrap(),
            build_seconds: 1.0,
            unsigned: None,
        }
    }

    /// A config as `cache push` makes one: NVSHMEM's, from the store at /home/a/store.
    fn config() -> (StepConfig, StepKey) {
        let inputs = json!({"recipe": 1});
        let key = StepKey::new("pipeline-nvshmem", &inputs);
        let crate_meta = meta("nvshmem", json!({"source": "x"}));
        let name = crate_meta.key().dir_name();
        let facts = facts_for_the_wire(
            &json!({"version": "3.4.5", "report": format!("/home/a/store/steps/{name}/build-report.json")}),
            Path::new("/home/a/store"),
        )
        .unwrap();
        let config = StepConfig {
            schema: CONFIG_SCHEMA,
            key: key.dir_name(),
            inputs,
            result: ResultConfig {
                output: Some(PathBuf::new()),
                facts,
                shipped: [(
                    "lib/libnvshmem_host.so.3".to_string(),
                    Entry::File {
                        sha256: "ab".repeat(32),
                        size: 3,
                        mode: 0o755,
                    },
                )]
                .into(),
            },
            step_dir: StepDirConfig {
                name,
                meta: crate_meta,
                shipped: PathBuf::from("install"),
                shipped_is_file: false,
            },
            carried_steps: Vec::new(),
            layers: vec!["shipped".into(), "rest".into()],
            pushed_by: "commstack 0.1.0".into(),
            builder: Some(Builder {
                commstack: "0.1.0".into(),
                ..Builder::default()
            }),
        };
        (config, key)
    }

    fn kinds(own: &str, carried: &[&str]) -> ArtifactKinds {
        ArtifactKinds {
            own: own.into(),
            carried: carried.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn check(config: &StepConfig, key: &StepKey, kinds: &ArtifactKinds) -> Result<()> {
        let layers = 2 + config
            .carried_steps
            .iter()
            .map(|c| c.files.len())
            .sum::<usize>();
        config.validate(&Expected {
            key,
            step: "nvshmem",
            kinds,
            layers,
        })
    }

    #[test]
    fn the_config_goes_through_json_and_back_unchanged_and_names_no_local_path() {
        let (config, key) = config();
        let text = commstack_digest::canonical_json(&serde_json::to_value(&config).unwrap());
        assert!(!text.contains("/home/a"), "{text}");
        let back: StepConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(back, config);
        check(&back, &key, &kinds("nvshmem", &[])).unwrap();
        // Every path comes from the puller's store.
        let here = Path::new("/b/store");
        let dir = here.join("steps").join(&config.step_dir.name);
        assert_eq!(back.output_in(here), Some(dir.clone()));
        assert_eq!(back.shipped_root_in(here), dir.join("install"));
        assert_eq!(
            back.facts_in(here)["report"],
            dir.join("build-report.json").to_string_lossy().as_ref()
        );
        assert_eq!(back.facts_in(here)["version"], "3.4.5");
    }

    #[test]
    fn a_path_outside_the_store_is_not_pushed() {
        let err = facts_for_the_wire(
            &json!({"cache": "/home/a/cache/ab", "in_store": "/home/a/store/steps/x-1/y"}),
            Path::new("/home/a/store"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("/home/a/cache/ab"), "{err}");
    }

    #[test]
    fn paths_and_names_that_leave_the_store_are_refused() {
        let (good, key) = config();
        let own = kinds("nvshmem", &[]);
        type Edit = fn(&mut StepConfig);
        let cases: [(&str, Edit); 10] = [
            ("absolute output", |c| c.result.output = Some("/etc".into())),
            ("output up", |c| c.result.output = Some("../../x".into())),
            ("shipped root up", |c| c.step_dir.shipped = "../x".into()),
            ("absolute fact", |c| {
                c.result.facts["report"] = "/etc/passwd".into()
            }),
            ("fact up", |c| c.result.facts["report"] = "../../x".into()),
            ("store fact up", |c| {
                c.result.facts["report"] = "store:steps/../../x".into()
            }),
            ("store fact off steps", |c| {
                c.result.facts["report"] = "store:locks/x".into()
            }),
            ("crate step name", |c| {
                c.step_dir.meta.step = "../../evil".into()
            }),
            ("crate dir name", |c| c.step_dir.name = "../evil".into()),
            ("control character", |c| {
                c.result
                    .shipped
                    .insert("a\nb".into(), Entry::Link { target: "x".into() });
            }),
        ];
        for (what, edit) in cases {
            let mut bad = good.clone();
            edit(&mut bad);
            let err = format!("{:#}", check(&bad, &key, &own).unwrap_err());
            assert!(err.contains("refusing it"), "{what}: {err}");
            assert!(!err.contains('\n'), "{what}: {err}");
        }
    }

    #[test]
    fn only_the_kinds_the_step_names_are_brought() {
        let (mut config, key) = config();
        let err = check(&config, &key, &kinds("base", &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("step nvshmem makes `base-...` steps"), "{err}");

        let layer = meta("image-layer", json!({"layer": 1}));
        config.carried_steps.push(CarriedStep {
            name: layer.key().dir_name(),
            meta: layer,
            files: vec![CarriedFile {
                path: "layer.tar".into(),
                sha256: "cd".repeat(32),
                size: 10,
                executable: false,
            }],
        });
        let err = check(&config, &key, &kinds("nvshmem", &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("of kind `image-layer`") && err.contains("may carry none"),
            "{err}"
        );
        check(&config, &key, &kinds("nvshmem", &["image-layer"])).unwrap();
    }
}
