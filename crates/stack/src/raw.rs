//! `stack.toml` as written: serde structs that mirror the file, strict (unknown keys and
//! wrong types are errors), every value kept with its span so validation can point at it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::OnceLock;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use toml::Spanned;

use crate::switches::{self, Switch};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawManifest {
    pub(crate) target: RawTarget,
    pub(crate) torch: RawTorch,
    pub(crate) nvshmem: RawNvshmem,
    /// Absent: NCCL is torch's pin (`version = "match-torch"`), as before `[nccl]` existed.
    pub(crate) nccl: Option<RawNccl>,
    pub(crate) deepep: RawDeepEp,
    #[serde(default)]
    pub(crate) toolchain: RawToolchain,
    #[serde(default)]
    pub(crate) resolve: RawResolve,
    /// Absent: the stack makes no image (and its lock has no `[base]`).
    pub(crate) image: Option<RawImage>,
    /// The binary cache (`build --substitute`); not part of the lock.
    #[serde(default)]
    pub(crate) cache: RawCache,
    /// Absent: `deploy render` refuses the stack, naming the section to add.
    pub(crate) deploy: Option<RawDeploy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawTarget {
    pub(crate) python: Spanned<String>,
    pub(crate) arch: Option<Spanned<String>>,
    pub(crate) glibc: Option<Spanned<String>>,
    pub(crate) base: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawTorch {
    pub(crate) version: Spanned<String>,
    pub(crate) cuda: Spanned<i64>,
}

/// `[nvshmem]`. Its switches are not fields but the stack rows of
/// [`crate::switches::SWITCHES`], so a new switch needs no edit here; the Deserialize
/// below reads them as the derived one reads fields (same messages, same spans).
pub(crate) struct RawNvshmem {
    pub(crate) version: Spanned<String>,
    pub(crate) cuda_archs: Spanned<Vec<Spanned<String>>>,
    /// The switches written, by their row.
    pub(crate) switches: Vec<(&'static Switch, Spanned<bool>)>,
    pub(crate) static_lib: Option<Spanned<bool>>,
    pub(crate) pass_env: Vec<Spanned<String>>,
    /// The source archive's URL and sha256, when not the known table's release.
    pub(crate) url: Option<Spanned<String>>,
    pub(crate) sha256: Option<Spanned<String>>,
}

enum NvshmemField {
    Version,
    CudaArchs,
    Switch(&'static Switch),
    StaticLib,
    PassEnv,
    Url,
    Sha256,
}

/// Every key of `[nvshmem]`, in the order an unknown-key error lists them.
fn nvshmem_fields() -> &'static [&'static str] {
    static FIELDS: OnceLock<Vec<&'static str>> = OnceLock::new();
    FIELDS.get_or_init(|| {
        let mut v = vec!["version", "cuda-archs"];
        v.extend(switches::in_stack().map(|s| s.key));
        v.extend(["static-lib", "pass-env", "url", "sha256"]);
        v
    })
}

impl<'de> Deserialize<'de> for NvshmemField {
    // Through deserialize_identifier, as derive does, so that an unknown key's error
    // carries the key's span.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = NvshmemField;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an [nvshmem] key")
            }
            fn visit_str<E: de::Error>(self, key: &str) -> Result<NvshmemField, E> {
                Ok(match key {
                    "version" => NvshmemField::Version,
                    "cuda-archs" => NvshmemField::CudaArchs,
                    "static-lib" => NvshmemField::StaticLib,
                    "pass-env" => NvshmemField::PassEnv,
                    "url" => NvshmemField::Url,
                    "sha256" => NvshmemField::Sha256,
                    _ => match switches::in_stack().find(|s| s.key == key) {
                        Some(s) => NvshmemField::Switch(s),
                        None => return Err(E::unknown_field(key, nvshmem_fields())),
                    },
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

impl<'de> Deserialize<'de> for RawNvshmem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawNvshmem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the [nvshmem] table")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawNvshmem, A::Error> {
                let mut version = None;
                let mut cuda_archs = None;
                let mut switches = Vec::new();
                let mut static_lib = None;
                let mut pass_env = None;
                let mut url = None;
                let mut sha256 = None;
                // TOML itself refuses a key written twice.
                while let Some(field) = map.next_key::<NvshmemField>()? {
                    match field {
                        NvshmemField::Version => version = Some(map.next_value()?),
                        NvshmemField::CudaArchs => cuda_archs = Some(map.next_value()?),
                        NvshmemField::Switch(s) => switches.push((s, map.next_value()?)),
                        NvshmemField::StaticLib => static_lib = Some(map.next_value()?),
                        NvshmemField::PassEnv => pass_env = Some(map.next_value()?),
                        NvshmemField::Url => url = Some(map.next_value()?),
                        NvshmemField::Sha256 => sha256 = Some(map.next_value()?),
                    }
                }
                Ok(RawNvshmem {
                    version: version.ok_or_else(|| de::Error::missing_field("version"))?,
                    cuda_archs: cuda_archs.ok_or_else(|| de::Error::missing_field("cuda-archs"))?,
                    switches,
                    static_lib,
                    pass_env: pass_env.unwrap_or_default(),
                    url,
                    sha256,
                })
            }
        }
        d.deserialize_struct("RawNvshmem", nvshmem_fields(), V)
    }
}

/// `[nccl]`: the NCCL the environment holds, torch's pin or an override of it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawNccl {
    pub(crate) version: Spanned<String>,
    /// Build NCCL from its release source instead of taking NVIDIA's wheel.
    pub(crate) from_source: Option<Spanned<bool>>,
    /// The source tree's hash, when the user vouches for it.
    pub(crate) tree: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawDeepEp {
    pub(crate) repo: Option<Spanned<String>>,
    pub(crate) rev: Spanned<String>,
    pub(crate) api: Spanned<String>,
    pub(crate) tree: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) submodule: Vec<RawSubmodule>,
}

/// `[[deepep.submodule]]`: what fills one of the source's `.gitmodules` paths.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawSubmodule {
    pub(crate) path: Spanned<String>,
    pub(crate) repo: Spanned<String>,
    pub(crate) rev: Spanned<String>,
    pub(crate) tree: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawToolchain {
    pub(crate) cmake: Option<Spanned<String>>,
    pub(crate) ninja: Option<Spanned<String>>,
    pub(crate) host_glibc: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawResolve {
    pub(crate) index_url: Option<Spanned<String>>,
    pub(crate) exclude_newer: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) extra_requirements: Vec<Spanned<String>>,
    #[serde(default)]
    pub(crate) allow: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawImage {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) mirror: Option<Spanned<String>>,
    pub(crate) keyring: Option<Spanned<String>>,
    pub(crate) include: Option<Spanned<Vec<Spanned<String>>>>,
    pub(crate) user: Option<Spanned<String>>,
    pub(crate) index_max_age_days: Option<Spanned<i64>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawCache {
    pub(crate) registry: Option<Spanned<String>>,
    #[serde(default)]
    pub(crate) trusted_keys: Vec<Spanned<String>>,
}

/// `[deploy]`: how `cargo xtask deploy render` runs the image (crates/deploy). Not part of
/// the lock: it changes where and how the image runs, never what is built.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawDeploy {
    pub(crate) name: Option<Spanned<String>>,
    pub(crate) namespace: Option<Spanned<String>>,
    pub(crate) nodes: Spanned<i64>,
    pub(crate) gpus_per_node: Spanned<i64>,
    pub(crate) replicas: Option<Spanned<i64>>,
    pub(crate) network: Spanned<String>,
    pub(crate) rdma_resource: Option<Spanned<String>>,
    pub(crate) rdma_per_node: Option<Spanned<i64>>,
    pub(crate) gid_index: Option<Spanned<i64>>,
    pub(crate) socket_ifname: Option<Spanned<String>>,
    pub(crate) command: Spanned<Vec<Spanned<String>>>,
    /// Keys with their spans, so a finding about one variable points at its line.
    #[serde(default)]
    pub(crate) env: BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    pub(crate) shm_size: Option<Spanned<String>>,
    pub(crate) ibgda_access: Option<Spanned<String>>,
    pub(crate) run_as_root: Option<Spanned<bool>>,
    pub(crate) host_network: Option<Spanned<bool>>,
    #[serde(default)]
    pub(crate) node_selector: BTreeMap<Spanned<String>, Spanned<String>>,
    pub(crate) image_pull_secret: Option<Spanned<String>>,
    pub(crate) cpu: Option<Spanned<String>>,
    pub(crate) memory: Option<Spanned<String>>,
    pub(crate) ephemeral_storage: Option<Spanned<String>>,
    pub(crate) restart_policy: Option<Spanned<String>>,
    pub(crate) master_port: Option<Spanned<i64>>,
    pub(crate) gate_deadline_seconds: Option<Spanned<i64>>,
    #[serde(default)]
    pub(crate) slurm: RawSlurm,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawSlurm {
    pub(crate) container: Option<Spanned<String>>,
    pub(crate) partition: Option<Spanned<String>>,
    pub(crate) account: Option<Spanned<String>>,
    pub(crate) time: Option<Spanned<String>>,
    pub(crate) bundle_dir: Option<Spanned<String>>,
}
