//! What DeepEP V2's just-in-time compiler needs in the image beside the venv
//! (docs/deepep-v2.md): the CUDA toolchain from the stack's locked compiler wheels
//! (nvcc with its headers, cicc, ptxas, and cuobjdump, which the JIT runs on every kernel
//! it loads), unpacked under [`JIT_PREFIX`] as pip would install them, plus the toolkit
//! layout nvcc.profile expects; a writable cache directory owned by the image user. The
//! host gcc/g++ nvcc runs is Debian's (the base's `include`); the NCCL root
//! (nvidia/nccl: include/ and lib/) and DeepEP's include tree are in the venv.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use anyhow::{Context, Result, bail};
use commstack_deepep::LockedWheel;
use commstack_wheel::{InstallLayout, install};

use crate::provenance::{Claims, Origin};
use crate::venv::{check_wheel, tree_files};

/// Where the toolchain wheels are unpacked, relative to the image root.
pub const JIT_PREFIX: &str = "opt/commstack/cuda";
/// EP_JIT_CACHE_DIR: the JIT's cache (compiles in its tmp/), owned by the image user.
pub const JIT_CACHE_DIR: &str = "var/cache/deep_ep";

/// The files the JIT runs or includes, each with the wheel that ships it, relative to
/// CUDA_HOME: checked before the layer is written.
const NEEDED: [(&str, &str); 10] = [
    ("bin/nvcc", "nvidia-cuda-nvcc"),
    ("bin/nvcc.profile", "nvidia-cuda-nvcc"),
    ("bin/ptxas", "nvidia-cuda-nvcc"),
    ("nvvm/bin/cicc", "nvidia-nvvm"),
    ("bin/cuobjdump", "nvidia-cuda-cuobjdump"),
    ("include/cuda_runtime.h", "nvidia-cuda-runtime"),
    ("include/cuda_bf16.h", "nvidia-cuda-runtime"),
    ("include/cuda_fp8.h", "nvidia-cuda-runtime"),
    ("include/cooperative_groups.h", "nvidia-cuda-runtime"),
    ("include/cccl/cuda/std/tuple", "nvidia-cuda-cccl"),
];

/// The toolchain wheels the JIT layer is made of: the locked toolchain's CUDA wheels.
#[derive(Clone, Debug)]
pub struct JitToolchain {
    pub wheels: Vec<LockedWheel>,
}

impl JitToolchain {
    /// The CUDA major of the wheels (`nvidia-cuda-nvcc` 13.0.88: 13).
    pub fn cuda_major(&self) -> Result<u64> {
        nvcc_major(
            self.wheels
                .iter()
                .map(|w| (w.name.as_str(), w.version.as_str(), w.filename.as_str())),
        )
    }

    /// CUDA_HOME in the image: `/opt/commstack/cuda/nvidia/cu13`.
    pub fn cuda_home(&self) -> Result<String> {
        Ok(cuda_home(self.cuda_major()?))
    }

    /// What the image's environment adds for the JIT.
    pub fn env(&self) -> Result<Vec<String>> {
        Ok(jit_env(self.cuda_major()?))
    }
}

/// Which of the lock's `[[toolchain]]` wheels the JIT layer holds: CUDA's (`nvidia-*`),
/// not cmake or ninja, which only the build host runs.
pub fn is_jit_wheel(name: &str) -> bool {
    name.starts_with("nvidia-")
}

/// The CUDA major of the `nvidia-cuda-nvcc` wheel among `wheels` (name, version, file).
pub fn nvcc_major<'a>(
    wheels: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
) -> Result<u64> {
    let (_, version, filename) = wheels
        .into_iter()
        .find(|(name, _, _)| *name == "nvidia-cuda-nvcc")
        .context("the JIT toolchain has no nvidia-cuda-nvcc wheel: the lock's [[toolchain]] lacks it; run `cargo xtask lock`")?;
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("{filename}: no CUDA major in version {version}"))
}

/// CUDA_HOME in the image for toolchain wheels of CUDA `major`.
fn cuda_home(major: u64) -> String {
    format!("/{JIT_PREFIX}/nvidia/cu{major}")
}

/// What the image's environment adds for a JIT toolchain of CUDA `major`.
pub fn jit_env(major: u64) -> Vec<String> {
    vec![
        format!("CUDA_HOME={}", cuda_home(major)),
        format!("EP_JIT_CACHE_DIR=/{JIT_CACHE_DIR}"),
    ]
}

/// Installs the toolchain wheels (sha256-checked) under [`JIT_PREFIX`] in `stage`, adds
/// the toolkit layout (`targets/x86_64-linux/{include,lib}`, `lib64`) and checks that
/// every file the JIT needs is there. `source` names the layer step (the links' origin).
pub fn install_toolchain(stage: &Path, jit: &JitToolchain, source: &str) -> Result<Claims> {
    let prefix = stage.join(JIT_PREFIX);
    let mut claims = Claims::new();
    for locked in &jit.wheels {
        check_wheel(locked)?;
        let work = tempfile::Builder::new()
            .prefix(".cuda-wheel-")
            .tempdir_in(stage.parent().unwrap_or(stage))
            .with_context(|| format!("cannot create a directory beside {}", stage.display()))?;
        let root = work.path();
        let layout = InstallLayout {
            purelib: root.to_path_buf(),
            platlib: root.to_path_buf(),
            scripts: root.join("bin"),
            data: root.to_path_buf(),
            headers: root.join("include"),
        };
        let installed = install(&locked.path, &layout)
            .with_context(|| format!("cannot unpack {} for the JIT toolchain", locked.filename))?;
        let hashes: std::collections::BTreeMap<&str, &str> = installed
            .wheel
            .record
            .iter()
            .map(|e| (e.path.as_str(), e.hash.as_deref().unwrap_or_default()))
            .collect();
        for rel in tree_files(root)? {
            let (from, to) = (root.join(&rel), prefix.join(&rel));
            if to.symlink_metadata().is_ok() {
                if fs::read(&from)? == fs::read(&to)? {
                    continue;
                }
                bail!(
                    "{JIT_PREFIX}/{rel} is shipped by {} and by another toolchain wheel with other bytes",
                    locked.filename
                );
            }
            fs::create_dir_all(to.parent().unwrap_or(&prefix))?;
            fs::rename(&from, &to)
                .with_context(|| format!("cannot move {} to {}", from.display(), to.display()))?;
            claims.insert(
                format!("{JIT_PREFIX}/{rel}"),
                Origin::Wheel {
                    wheel: locked.name.clone(),
                    version: locked.version.clone(),
                    sha256: locked.sha256.clone(),
                    hash: hashes.get(rel.as_str()).unwrap_or(&"").to_string(),
                    record: rel,
                },
            );
        }
    }
    let home_rel = jit.cuda_home()?.trim_start_matches('/').to_string();
    let home = stage.join(&home_rel);
    for (rel, why) in NEEDED {
        if !home.join(rel).is_file() {
            bail!(
                "the JIT toolchain has no {rel} under /{home_rel}: the {why} wheel is missing or changed its layout (the lock's [[toolchain]] must hold it; `cargo xtask lock`)"
            );
        }
    }
    // nvcc.profile adds -I$(TOP)/targets/x86_64-linux/include; the wheels have no targets/.
    let target = home.join("targets/x86_64-linux");
    fs::create_dir_all(&target)?;
    for (link, to) in [
        ("targets/x86_64-linux/include", "../../include"),
        ("targets/x86_64-linux/lib", "../../lib"),
        ("lib64", "lib"),
    ] {
        symlink(to, home.join(link))
            .with_context(|| format!("cannot link {link} -> {to} in {}", home.display()))?;
        claims.insert(
            format!("{home_rel}/{link}"),
            Origin::Own {
                name: "generated:cuda-toolkit-layout".into(),
                sha256: None,
                source: source.to_string(),
            },
        );
    }
    // Directories written by the links are not files: the claims cover every file.
    let present: Vec<String> = tree_files(stage)?;
    if let Some(unclaimed) = present.iter().find(|p| !claims.contains_key(*p)) {
        bail!("the JIT toolchain layer holds {unclaimed}, which no wheel claims");
    }
    Ok(claims)
}
