//! The NVSHMEM DeepEP builds against: an NVSHMEM build step of the store (preferred: its
//! hash keys the DeepEP build, and the drop-in wheel is made from it), or any install
//! prefix (keyed by its tree hash). Either way it is checked before anything compiles:
//! the layout DeepEP's link line needs, and NVSHMEM_USE_NCCL=OFF.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_elf::{ElfFile, NvshmemHostInfo};
use commstack_nvshmem::{Built, INSTALL_DIR, load_report};
use commstack_stack::CudaArch;
use commstack_store::{META_FILE, Outcome, StepMeta, Store};
use serde::Serialize;

/// The NVSHMEM DeepEP is built against.
#[derive(Debug)]
pub struct NvshmemInput {
    /// The install prefix (`include/`, `lib/`).
    pub prefix: PathBuf,
    /// What keys the DeepEP build: the build step's name and hash, or the prefix's tree hash.
    pub identity: serde_json::Value,
    /// What its libnvshmem_host says about itself (version, build variables).
    pub host: NvshmemHostInfo,
    pub host_lib: PathBuf,
    /// The NVSHMEM build step, when the input is one (the drop-in wheel is made from it).
    pub built: Option<Built>,
}

/// How the prefix is laid out, as far as DeepEP's link line cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkLayout {
    /// `lib/libnvshmem_host.so` exists (what V1's `-l:libnvshmem_host.so` needs).
    pub unversioned_host: bool,
    /// The `libnvshmem_host.so.N` files.
    pub versioned_host: Vec<String>,
}

impl NvshmemInput {
    /// A store step directory (`.step.json` + `build-report.json` + `nvshmem/`) or an
    /// install prefix.
    pub fn open(path: &Path) -> Result<NvshmemInput> {
        let path = path
            .canonicalize()
            .with_context(|| format!("no NVSHMEM at {}", path.display()))?;
        if path.join(META_FILE).is_file() && path.join(INSTALL_DIR).is_dir() {
            NvshmemInput::from_step(&path)
        } else {
            NvshmemInput::from_prefix(&path)
        }
    }

    /// An NVSHMEM build step (`<store>/steps/nvshmem-<hash>`, or a copy of one).
    pub fn from_step(dir: &Path) -> Result<NvshmemInput> {
        let meta_path = dir.join(META_FILE);
        let meta: StepMeta = serde_json::from_str(
            &fs::read_to_string(&meta_path)
                .with_context(|| format!("cannot read {}", meta_path.display()))?,
        )
        .with_context(|| format!("{} is not a step description", meta_path.display()))?;
        if meta.step != "nvshmem" {
            bail!(
                "{} is a `{}` step, not an NVSHMEM build (`nvshmem-<hash>`)",
                dir.display(),
                meta.step
            );
        }
        let report = load_report(dir)?;
        let prefix = dir.join(INSTALL_DIR);
        let (host_lib, host) = read_host(&prefix)?;
        let built = Built {
            key: meta.key(),
            outcome: Outcome::Cached {
                path: dir.to_path_buf(),
            },
            prefix: prefix.clone(),
            report,
        };
        Ok(NvshmemInput {
            identity: serde_json::json!({ "step": meta.step, "hash": meta.hash }),
            prefix,
            host,
            host_lib,
            built: Some(built),
        })
    }

    /// Any NVSHMEM install prefix; keyed by its tree hash.
    pub fn from_prefix(prefix: &Path) -> Result<NvshmemInput> {
        let (host_lib, host) = read_host(prefix)?;
        let tree = commstack_fetch::tree::tree_sha256_dir(prefix)
            .with_context(|| format!("cannot hash the NVSHMEM install {}", prefix.display()))?;
        Ok(NvshmemInput {
            identity: serde_json::json!({ "prefix_tree": tree }),
            prefix: prefix.to_path_buf(),
            host,
            host_lib,
            built: None,
        })
    }

    /// `3.4.5`, from the library's vendor string.
    pub fn version(&self) -> Option<String> {
        self.host.version.map(|v| v.to_string())
    }

    /// The SONAME DeepEP's extension will need (`libnvshmem_host.so.3`).
    pub fn host_soname(&self) -> Result<String> {
        let info = ElfFile::open(&self.host_lib)?.dynamic_info()?;
        info.soname.with_context(|| {
            format!(
                "{} has no SONAME: not an NVSHMEM release build",
                self.host_lib.display()
            )
        })
    }

    /// Refuse an NVSHMEM built with NCCL: torch's process would load it as its only
    /// NVSHMEM, and it dlopens libnccl.so.2 next to torch's NCCL.
    pub fn require_nccl_off(&self) -> Result<()> {
        match self.host.build_vars.use_nccl() {
            Some(false) => Ok(()),
            found => bail!(
                "{} is built with NVSHMEM_USE_NCCL={}: the stack's NVSHMEM is always built without NCCL (one NCCL per process, torch's). \
                 Build it with `cargo xtask build nvshmem` and pass that step (or its prefix) with --nvshmem",
                self.host_lib.display(),
                match found {
                    Some(true) => "ON",
                    _ => "(absent)",
                }
            ),
        }
    }
}

fn read_host(prefix: &Path) -> Result<(PathBuf, NvshmemHostInfo)> {
    let lib = prefix.join("lib");
    let layout = link_layout(prefix)?;
    let name = if layout.unversioned_host {
        "libnvshmem_host.so".to_string()
    } else {
        layout.versioned_host.first().cloned().with_context(|| {
            format!("{} has no libnvshmem_host.so*: not an NVSHMEM install prefix (want include/ and lib/)", lib.display())
        })?
    };
    let path = lib.join(name);
    let info = ElfFile::open(&path)?
        .nvshmem_host_info()
        .with_context(|| format!("{} does not read as NVSHMEM's host library", path.display()))?;
    Ok((path, info))
}

/// What `prefix/lib` holds of libnvshmem_host, and the other files DeepEP needs.
pub fn link_layout(prefix: &Path) -> Result<LinkLayout> {
    let lib = prefix.join("lib");
    let mut versioned: Vec<String> = fs::read_dir(&lib)
        .with_context(|| {
            format!(
                "cannot read {}: not an NVSHMEM install prefix (want include/ and lib/)",
                lib.display()
            )
        })?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("libnvshmem_host.so."))
        .collect();
    versioned.sort();
    Ok(LinkLayout {
        unversioned_host: lib.join("libnvshmem_host.so").exists(),
        versioned_host: versioned,
    })
}

/// Before a V1 build: the prefix must have what DeepEP 567632d's setup.py links and
/// includes. NVIDIA's wheel (`nvidia/nvshmem`) has only `libnvshmem_host.so.3`, and the
/// link then fails late with `cannot find -l:libnvshmem_host.so`: say so now.
pub fn check_v1_prefix(prefix: &Path) -> Result<()> {
    let layout = link_layout(prefix)?;
    let lib = prefix.join("lib");
    if !layout.unversioned_host {
        let wheel_like = prefix.ends_with("nvidia/nvshmem");
        bail!(
            "{} has {} but no unversioned libnvshmem_host.so{}: DeepEP V1's setup.py links `-l:libnvshmem_host.so` when NVSHMEM_DIR is set, \
             and the link would fail with `cannot find -l:libnvshmem_host.so`. Point --nvshmem at an install prefix that has the link: \
             the stack's NVSHMEM build (`cargo xtask build nvshmem`, step nvshmem-<hash> or its nvshmem/ prefix)",
            lib.display(),
            if layout.versioned_host.is_empty() {
                "no libnvshmem_host.so.N".to_string()
            } else {
                layout.versioned_host.join(", ")
            },
            if wheel_like {
                " (a pip wheel's directory: wheels carry only the SONAME file)"
            } else {
                ""
            },
        );
    }
    for needed in ["lib/libnvshmem_device.a", "include/nvshmem.h"] {
        if !prefix.join(needed).is_file() {
            bail!(
                "{} has no {needed}: DeepEP's device code links libnvshmem_device.a and includes nvshmem.h; is it a complete NVSHMEM install?",
                prefix.display()
            );
        }
    }
    Ok(())
}

/// The first NVSHMEM header that includes `<infiniband/mlx5dv.h>` (the IBGDA transport's
/// device headers do): code compiled against these headers needs rdma-core's headers too.
pub fn header_needing_mlx5dv(prefix: &Path) -> Option<PathBuf> {
    let include = prefix.join("include");
    walkdir::WalkDir::new(&include)
        .sort_by_file_name()
        .into_iter()
        .filter_map(|e| e.ok())
        .find_map(|e| {
            if !e.file_type().is_file() {
                return None;
            }
            let text = fs::read_to_string(e.path()).ok()?;
            text.lines()
                .any(|l| {
                    let l = l.trim_start();
                    l.starts_with('#') && l.contains("include") && l.contains("infiniband/mlx5dv.h")
                })
                .then(|| e.path().to_path_buf())
        })
}

/// Where rdma-core's headers come from for a DeepEP build whose NVSHMEM headers need
/// them: `explicit` (`--rdma-core`), else the NVSHMEM build's own (if present here), else
/// the system's default include path. `Ok(None)`: not needed.
pub fn rdma_core_for(input: &NvshmemInput, explicit: Option<&Path>) -> Result<Option<RdmaHeaders>> {
    let Some(header) = header_needing_mlx5dv(&input.prefix) else {
        return Ok(None);
    };
    let found = match explicit {
        Some(dir) => Some(commstack_nvshmem::find_rdma_core(dir)?),
        None => {
            let from_build = input
                .built
                .as_ref()
                .and_then(|b| b.report.rdma_core.clone())
                .filter(|r| r.include_dir.join("infiniband/mlx5dv.h").is_file());
            from_build.or_else(|| commstack_nvshmem::find_rdma_core(Path::new("/")).ok())
        }
    };
    let Some(r) = found else {
        bail!(
            "{} includes <infiniband/mlx5dv.h> (NVSHMEM's IBGDA headers), and no rdma-core headers are here: install libibverbs-dev              (rdma-core), or pass --rdma-core DIR (a `dpkg -x` tree of libibverbs-dev + ibverbs-providers, as the NVSHMEM build used)",
            header.display()
        );
    };
    // The compiler searches /usr/include anyway; naming it in CPATH would put it before
    // the C++ library's own headers and break their #include_next.
    let system = matches!(
        r.include_dir.to_str(),
        Some("/usr/include" | "/include" | "/usr/local/include")
    );
    Ok(Some(RdmaHeaders {
        include_dir: r.include_dir,
        mlx5dv_h_sha256: r.mlx5dv_h_sha256,
        system,
    }))
}

/// rdma-core's headers as a DeepEP build uses them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RdmaHeaders {
    pub include_dir: PathBuf,
    /// Names the rdma-core release in the build key.
    pub mlx5dv_h_sha256: String,
    /// In the compiler's default search path (nothing to add to CPATH).
    pub system: bool,
}

/// The store's NVSHMEM build for this stack: the `nvshmem` steps whose report says
/// `version` and `cuda_archs`, newest first. Empty when none.
pub fn find_in_store(
    store: &Store,
    version: &str,
    cuda_archs: &[CudaArch],
) -> Result<Vec<PathBuf>> {
    let mut found: Vec<(jiff::Timestamp, PathBuf)> = Vec::new();
    for step in store.list()? {
        let Some(meta) = &step.meta else { continue };
        if meta.step != "nvshmem" {
            continue;
        }
        let Ok(report) = load_report(&step.path) else {
            continue;
        };
        if report.source.version == version && report.options.cuda_archs == cuda_archs {
            found.push((meta.created, step.path.clone()));
        }
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    Ok(found.into_iter().map(|(_, p)| p).collect())
}
