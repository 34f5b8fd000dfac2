//! The validated stack: what the other crates use. Built only by validation
//! (`Stack::parse`); it knows nothing of the rules (they check it, not the other way
//! round).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::Requirement;
use sha2::{Digest, Sha256};

use crate::arch::CudaArch;
use crate::bases::Base;
use crate::diag::{Diagnostic, Location};
use crate::switches::{self, Scope, Switch};

pub const DEFAULT_INDEX: &str = "https://pypi.org/simple";
pub const DEFAULT_CMAKE: &str = ">=3.28,<4.2";
pub const DEFAULT_NINJA: &str = ">=1.11";
/// Toolchain wheels run on the build host, not the target: manylinux_2_28 covers every
/// build host we support (Debian 12, Ubuntu 24.04, RHEL 8+).
pub const DEFAULT_HOST_GLIBC: (u32, u32) = (2, 28);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NvshmemVersion {
    /// Build the version torch pins (`nvidia-nvshmem-cuXX==V` in torch's metadata).
    MatchTorch,
    Exact(Version),
}

/// `[nccl] version`: the NCCL (`nvidia-nccl-cuXX`) the environment holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NcclVersion {
    /// torch's own pin (`nvidia-nccl-cuXX==V` in torch's metadata); also what a stack
    /// without `[nccl]` gets.
    MatchTorch,
    /// This version instead of torch's pin: torch's Requires-Dist on NCCL is overridden
    /// (as uv's `override-dependencies` does). Rules `nccl-not-older-than-torch` and
    /// `nccl-soname` keep it one torch can load.
    Exact(Version),
}

// Serialized as `as_str` spells it: the lock's `deepep-api`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeepEpApi {
    /// NVSHMEM-based (DeepEP <= the last V1 commit, 567632d).
    V1,
    /// NCCL device API (DeepEP main since 2026); needs NCCL >= 2.30.4.
    V2,
}

impl DeepEpApi {
    pub fn as_str(self) -> &'static str {
        match self {
            DeepEpApi::V1 => "v1",
            DeepEpApi::V2 => "v2",
        }
    }
}

/// The NVSHMEM switches stack.toml sets, on or off: the [`Scope::Stack`] rows of
/// [`crate::switches::SWITCHES`], keyed by the stack.toml key (`"ibgda"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvshmemTransports {
    on: BTreeMap<&'static str, bool>,
}

impl Default for NvshmemTransports {
    /// Every row's default: DeepEP's documented build, IBGDA on, everything else off.
    fn default() -> Self {
        NvshmemTransports {
            on: switches::in_stack().map(|s| (s.key, s.default)).collect(),
        }
    }
}

impl NvshmemTransports {
    /// Whether `key` is on. Panics on a key that is not a stack switch: callers name
    /// table rows, so that is a bug, not an input error.
    pub fn get(&self, key: &str) -> bool {
        match self.on.get(key) {
            Some(on) => *on,
            None => panic!("{key:?} is not a stack switch of commstack_stack::switches"),
        }
    }

    /// Panics on a key that is not a stack switch, as [`NvshmemTransports::get`] does.
    pub fn set(&mut self, key: &str, on: bool) {
        let row = switches::find(key)
            .filter(|s| s.scope == Scope::Stack)
            .unwrap_or_else(|| {
                panic!("{key:?} is not a stack switch of commstack_stack::switches")
            });
        self.on.insert(row.key, on);
    }

    /// Every stack switch with its value, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Switch, bool)> + '_ {
        switches::in_stack().map(|s| (s, self.get(s.key)))
    }
}

#[derive(Clone, Debug)]
pub struct Target {
    /// (major, minor) of CPython.
    pub python: (u64, u64),
    pub arch: Arch,
    /// Newest glibc wheels may need (manylinux_2_X with X <= this).
    pub glibc: (u32, u32),
    pub base: &'static Base,
}

impl Target {
    /// The full Python version markers are evaluated with: the base image's own CPython
    /// when it is the target's minor version, else X.Y.0.
    pub fn python_full(&self) -> (u64, u64, u64) {
        let (maj, min, micro) = self.base.python;
        if (maj, min) == self.python {
            (maj, min, micro)
        } else {
            (self.python.0, self.python.1, 0)
        }
    }
}

#[derive(Clone, Debug)]
pub struct Torch {
    pub version: Version,
    pub cuda_major: u64,
}

#[derive(Clone, Debug)]
pub struct Nvshmem {
    pub version: NvshmemVersion,
    /// As written, e.g. "90", "90a", "100f", "90-real".
    pub cuda_archs: Vec<CudaArch>,
    pub transports: NvshmemTransports,
    /// Environment variables passed through to the NVSHMEM build (all others are cleared).
    pub pass_env: Vec<String>,
    /// Also build libnvshmem.a, nvshmem-info and the CMake package (NVIDIA's wheel has
    /// none of them; they double the compile work). Default false.
    pub static_lib: bool,
    /// `url` + `sha256`: the source archive to build, when it is not the known table's
    /// release of `version` (docs/sources.md).
    pub source: Option<NvshmemSource>,
}

/// `[nvshmem] url` and `sha256`: an NVSHMEM source the user names and vouches for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvshmemSource {
    pub url: String,
    /// 64 lowercase hex digits.
    pub sha256: String,
}

#[derive(Clone, Debug)]
pub struct Nccl {
    pub version: NcclVersion,
    /// `from-source = true`: NCCL is built from its release source (the tag
    /// `v<version>-1` of [`NCCL_REPO`]) where NVIDIA's wheel cannot go (a GPU machine
    /// without a network, reached with at most 64 MiB: the wheel is 216 MB), and shipped
    /// as a drop-in wheel under the locked version.
    pub source: Option<NcclSource>,
}

/// The lock's name of the NCCL source (`[[source]] name`).
pub const NCCL_SOURCE: &str = "nccl";

/// NVIDIA's NCCL repository; release `X.Y.Z` is its tag `vX.Y.Z-1`.
pub const NCCL_REPO: &str = "https://github.com/NVIDIA/nccl";

/// `[nccl] from-source = true` (and `tree`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NcclSource {
    /// `sha256:<hex>`: the tree the user vouches for (`nccl.tree`); else trust on first use.
    pub tree: Option<String>,
}

impl NcclSource {
    /// The release tag of NCCL `version`: NVIDIA tags `v2.30.7-1`.
    pub fn tag(version: &str) -> String {
        format!("v{version}-1")
    }

    /// GitHub's archive of the tag, and the name it downloads as (`nccl-2.30.7-1.tar.gz`).
    pub fn archive(version: &str) -> (String, String) {
        let tag = Self::tag(version);
        (
            format!("{NCCL_REPO}/archive/refs/tags/{tag}.tar.gz"),
            format!("nccl-{}.tar.gz", &tag[1..]),
        )
    }
}

#[derive(Clone, Debug)]
pub struct DeepEp {
    /// The git repository, default [`DEFAULT_DEEPEP_REPO`]; its archive of `rev` is
    /// `<repo>/archive/<rev>.tar.gz` (GitHub's form).
    pub repo: String,
    /// As written: 7 to 40 hex digits (40 for a revision the known table lacks).
    pub rev: String,
    pub api: DeepEpApi,
    /// The tree hash (`sha256:<hex>`) the user vouches for, if any.
    pub tree: Option<String>,
    /// `[[deepep.submodule]]`: what fills the source's `.gitmodules` paths.
    pub submodules: Vec<Submodule>,
}

pub const DEFAULT_DEEPEP_REPO: &str = "https://github.com/deepseek-ai/DeepEP";

/// One `[[deepep.submodule]]`: a git archive of a commit has no gitlinks, so the commit
/// each `.gitmodules` path holds is declared here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submodule {
    /// Relative to the DeepEP tree, as `.gitmodules` writes it (`third-party/fmt`).
    pub path: String,
    pub repo: String,
    /// 40 hex digits.
    pub rev: String,
    pub tree: Option<String>,
}

/// `<repo>/archive/<rev>.tar.gz`: GitHub's archive of a commit.
pub fn git_archive_url(repo: &str, rev: &str) -> String {
    format!("{}/archive/{rev}.tar.gz", repo.trim_end_matches('/'))
}

/// `<last segment of repo>-<rev>.tar.gz`: the name GitHub gives that archive (and a
/// mirror holds it under).
pub fn git_archive_filename(repo: &str, rev: &str) -> String {
    let name = repo
        .trim_end_matches('/')
        .trim_end_matches(".git")
        .rsplit('/')
        .next()
        .unwrap_or("source");
    format!("{name}-{rev}.tar.gz")
}

#[derive(Clone, Debug)]
pub struct Toolchain {
    pub cmake: VersionSpecifiers,
    pub ninja: VersionSpecifiers,
    pub host_glibc: (u32, u32),
}

#[derive(Clone, Debug)]
pub struct Resolve {
    pub index_url: String,
    pub exclude_newer: Option<jiff::Timestamp>,
    pub extra_requirements: Vec<Requirement>,
    /// Rule ids (`python-matches-base`) as validation checked them against the rules;
    /// kept as text so the model needs no rules (see `Stack::is_allowed`).
    pub allow: Vec<String>,
}

/// `[image]`: the container image made from the stack, and the Debian base under it.
/// Defaults are filled in by validation, so the echo and the lock show what is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    /// The image's name (tag without the version), default `commstack/<target.base>`.
    pub name: String,
    /// The Debian/Ubuntu mirror the base's packages are locked from, without a trailing
    /// slash. Debian bases default to [`DEFAULT_DEBIAN_MIRROR`]; Ubuntu bases have no
    /// default (this network does not reach archive.ubuntu.com), so it may be None here
    /// and `lock` refuses the stack, saying so.
    pub mirror: Option<String>,
    /// The archive keyring gpgv checks the mirror's InRelease with.
    pub keyring: String,
    /// Packages on top of mmdebstrap's `essential` variant.
    pub include: Vec<String>,
    /// The image's non-root user.
    pub user: String,
    /// The oldest a signed index without `Valid-Until` may be, in days, when `lock` reads
    /// it (default [`DEFAULT_INDEX_MAX_AGE_DAYS`]). Not part of the echo: it decides
    /// whether an index is accepted, not what the lock holds.
    pub index_max_age_days: u32,
}

/// `[cache]`: the binary cache of step outputs (docs/registry.md).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cache {
    /// `HOST[:PORT]/REPO` that `build` substitutes from when `--substitute` names no other.
    pub registry: Option<String>,
    /// The public keys whose signatures a pulled output may carry, each
    /// `ed25519:<base64 of the 32-byte key>` (checked here for form only).
    pub trusted_keys: Vec<String>,
}

pub const DEFAULT_DEBIAN_MIRROR: &str = "http://deb.debian.org/debian";
/// Two years. A supported release's index is signed again at each point release (every
/// few months); after its last one it may never change again: bookworm's is dated
/// 2026-07-11, so two years keep the shipped stack lockable until after bookworm's LTS
/// ends (2028-06-30), while an index frozen or replayed for longer is refused.
pub const DEFAULT_INDEX_MAX_AGE_DAYS: u32 = 730;
pub const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
pub const UBUNTU_KEYRING: &str = "/usr/share/keyrings/ubuntu-archive-keyring.gpg";
/// The base's packages beyond `essential`: the stack's Python, the C++ runtime torch
/// needs, the verbs libraries NVSHMEM's IBGDA transport loads (libmlx5 is in
/// ibverbs-providers), librdmacm (the CUDA wheels' libcufile_rdma needs it: without it
/// the image's ELF closure is open), and CA certificates.
pub const DEFAULT_INCLUDE: &[&str] = &[
    "python3",
    "libstdc++6",
    "libibverbs1",
    "ibverbs-providers",
    "librdmacm1",
    "ca-certificates",
];
pub const DEFAULT_USER: &str = "commstack";

/// A validated stack.toml, with the source text kept so later errors can point into it.
#[derive(Clone, Debug)]
pub struct Stack {
    pub target: Target,
    pub torch: Torch,
    pub nvshmem: Nvshmem,
    /// `[nccl]` (absent: match-torch).
    pub nccl: Nccl,
    pub deepep: DeepEp,
    pub toolchain: Toolchain,
    pub resolve: Resolve,
    /// `[image]`, when the stack makes one.
    pub image: Option<Image>,
    /// `[cache]`: where `build --substitute` pulls step outputs from, and whose
    /// signatures it accepts. Not in the echo or the fingerprint: it changes where
    /// outputs come from, never what they are, so the lock does not go stale.
    pub cache: Cache,
    /// `[deploy]`: how `deploy render` runs the image. Not in the echo or the fingerprint,
    /// as `[cache]`: it says where and how the image runs, never what is built, so a lock
    /// stays fresh when it changes.
    pub deploy: Option<crate::deploy::Deploy>,
    pub(crate) path: PathBuf,
    pub(crate) text: String,
    pub(crate) spans: BTreeMap<String, Range<usize>>,
}

impl Stack {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where a field (e.g. `"torch.version"`) is written in the manifest.
    pub fn locate(&self, field: &str) -> Option<Location> {
        self.spans
            .get(field)
            .map(|span| Location::of_offset(&self.path, &self.text, span.start))
    }

    /// A diagnostic pointing at a field of the manifest.
    pub fn diag(&self, field: &str, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(self.locate(field), message)
    }

    /// Every value of the manifest, flattened to `section.key = value` strings. Stored in
    /// the lock so `lock --check` can say what changed without the network.
    pub fn echo(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let t = &self.target;
        m.insert(
            "target.python".into(),
            format!("{}.{}", t.python.0, t.python.1),
        );
        m.insert("target.arch".into(), t.arch.as_str().into());
        m.insert(
            "target.glibc".into(),
            format!("{}.{}", t.glibc.0, t.glibc.1),
        );
        m.insert("target.base".into(), t.base.name.into());
        m.insert("torch.version".into(), self.torch.version.to_string());
        m.insert("torch.cuda".into(), self.torch.cuda_major.to_string());
        m.insert(
            "nvshmem.version".into(),
            match &self.nvshmem.version {
                NvshmemVersion::MatchTorch => "match-torch".into(),
                NvshmemVersion::Exact(v) => v.to_string(),
            },
        );
        m.insert(
            "nvshmem.cuda-archs".into(),
            self.nvshmem
                .cuda_archs
                .iter()
                .map(CudaArch::cmake)
                .collect::<Vec<_>>()
                .join(","),
        );
        for (switch, on) in self.nvshmem.transports.iter() {
            m.insert(format!("nvshmem.{}", switch.key), on.to_string());
        }
        m.insert("nvshmem.pass-env".into(), self.nvshmem.pass_env.join(","));
        m.insert(
            "nvshmem.static-lib".into(),
            self.nvshmem.static_lib.to_string(),
        );
        // Only an override: a stack on torch's pin (with or without [nccl]) keeps the echo
        // and fingerprint it had before [nccl] existed.
        if let NcclVersion::Exact(v) = &self.nccl.version {
            m.insert("nccl.version".into(), v.to_string());
        }
        m.insert("deepep.rev".into(), self.deepep.rev.clone());
        m.insert("deepep.api".into(), self.deepep.api.as_str().into());
        self.echo_sources(&mut m);
        m.insert("toolchain.cmake".into(), self.toolchain.cmake.to_string());
        m.insert("toolchain.ninja".into(), self.toolchain.ninja.to_string());
        m.insert(
            "toolchain.host-glibc".into(),
            format!(
                "{}.{}",
                self.toolchain.host_glibc.0, self.toolchain.host_glibc.1
            ),
        );
        m.insert("resolve.index-url".into(), self.resolve.index_url.clone());
        m.insert(
            "resolve.exclude-newer".into(),
            self.resolve
                .exclude_newer
                .map(|t| t.to_string())
                .unwrap_or_default(),
        );
        m.insert(
            "resolve.extra-requirements".into(),
            self.resolve
                .extra_requirements
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(";"),
        );
        m.insert("resolve.allow".into(), self.resolve.allow.join(","));
        // Only when present: a stack without [image] keeps the echo (and fingerprint) it
        // had before [image] existed.
        if let Some(image) = &self.image {
            m.insert("image.name".into(), image.name.clone());
            m.insert(
                "image.mirror".into(),
                image.mirror.clone().unwrap_or_default(),
            );
            m.insert("image.keyring".into(), image.keyring.clone());
            m.insert("image.include".into(), image.include.join(","));
            m.insert("image.user".into(), image.user.clone());
            // Not image.index-max-age-days: it changes what `lock` accepts, not what the
            // lock says, so a lock stays fresh when it is raised.
        }
        m
    }

    /// The named sources (docs/sources.md), only where written: a stack that names none
    /// keeps the echo (and the fingerprint) it had before they existed.
    fn echo_sources(&self, m: &mut BTreeMap<String, String>) {
        let d = &self.deepep;
        if d.repo != DEFAULT_DEEPEP_REPO {
            m.insert("deepep.repo".into(), d.repo.clone());
        }
        if let Some(tree) = &d.tree {
            m.insert("deepep.tree".into(), tree.clone());
        }
        for s in &d.submodules {
            let tree = s.tree.as_deref().unwrap_or("");
            m.insert(
                format!("deepep.submodule.{}", s.path),
                format!("{} {} {tree}", s.repo, s.rev)
                    .trim_end()
                    .to_string(),
            );
        }
        if let Some(source) = &self.nccl.source {
            m.insert(
                "nccl.from-source".into(),
                source.tree.clone().unwrap_or_else(|| "true".into()),
            );
        }
        if let Some(source) = &self.nvshmem.source {
            m.insert("nvshmem.url".into(), source.url.clone());
            m.insert("nvshmem.sha256".into(), source.sha256.clone());
        }
    }

    /// sha256 of the manifest's meaning (not its bytes: comments and layout don't count).
    pub fn fingerprint(&self) -> String {
        let json = serde_json::to_value(self.echo()).expect("a string map serialises");
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(commstack_digest::canonical_json(&json)))
        )
    }
}
