//! `stack.toml` as written: serde structs that mirror the file, strict (unknown keys and
//! wrong types are errors), every value kept with its span so validation can point at it.

use serde::Deserialize;
use toml::Spanned;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawManifest {
    pub(crate) target: RawTarget,
    pub(crate) torch: RawTorch,
    pub(crate) nvshmem: RawNvshmem,
    pub(crate) deepep: RawDeepEp,
    #[serde(default)]
    pub(crate) toolchain: RawToolchain,
    #[serde(default)]
    pub(crate) resolve: RawResolve,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawNvshmem {
    pub(crate) version: Spanned<String>,
    pub(crate) cuda_archs: Spanned<Vec<Spanned<String>>>,
    pub(crate) ibgda: Option<Spanned<bool>>,
    pub(crate) ibrc: Option<Spanned<bool>>,
    pub(crate) ibdevx: Option<Spanned<bool>>,
    pub(crate) ucx: Option<Spanned<bool>>,
    pub(crate) libfabric: Option<Spanned<bool>>,
    pub(crate) gdrcopy: Option<Spanned<bool>>,
    pub(crate) mpi: Option<Spanned<bool>>,
    pub(crate) shmem: Option<Spanned<bool>>,
    pub(crate) pmix: Option<Spanned<bool>>,
    pub(crate) static_lib: Option<Spanned<bool>>,
    #[serde(default)]
    pub(crate) pass_env: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct RawDeepEp {
    pub(crate) rev: Spanned<String>,
    pub(crate) api: Spanned<String>,
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
