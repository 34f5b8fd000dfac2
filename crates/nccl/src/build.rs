//! The build step: NCCL's Makefile on a copy of the locked source, in the step store.
//!
//! Step layout (`<store>/steps/nccl-<hash>/`):
//! ```text
//! nccl/lib/libnccl.so.2   the library, under its soname (as NVIDIA's wheel ships it)
//! nccl/include/           nccl.h, nccl_device/ ... as `make src.build` generates them
//! logs/build.log
//! build-report.json       inputs, command line, seconds, the checked version and soname
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_elf::ElfFile;
use commstack_stack::CudaArch;
use commstack_store::{Outcome, StepKey, Store};
use serde::{Deserialize, Serialize};

use crate::SONAME;

pub const STEP: &str = "nccl";
pub const INSTALL_DIR: &str = "nccl";
pub const REPORT_FILE: &str = "build-report.json";
/// Bumped when the recipe changes what it produces.
pub const RECIPE: &str = "nccl-make-1";

/// What one build needs; the caller fills it from stack.lock and the toolchain.
pub struct MakeRequest<'a> {
    /// The unpacked NCCL source (never written to: the build uses a copy).
    pub source_dir: &'a Path,
    /// Its tree hash, as locked.
    pub source_tree: &'a str,
    /// The locked NCCL version the source must be (`2.30.7`).
    pub version: &'a str,
    /// CUDA_HOME for NCCL's Makefile (nvcc in its bin/).
    pub cuda_home: &'a Path,
    /// What keys the toolchain (its identity JSON).
    pub toolchain_identity: serde_json::Value,
    pub cuda_archs: &'a [CudaArch],
    /// Parallel jobs (not in the key: the output does not depend on it).
    pub jobs: usize,
    pub progress: &'a dyn Fn(&str),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BuildReport {
    pub recipe: String,
    pub version: String,
    pub soname: String,
    pub source_tree: String,
    pub nvcc_gencode: String,
    pub command: Vec<String>,
    pub seconds: f64,
}

/// A build in the store.
pub struct Built {
    pub key: StepKey,
    pub outcome: Outcome,
    /// `<step>/nccl`: lib/libnccl.so.2 and include/.
    pub prefix: PathBuf,
    pub report: BuildReport,
}

/// NVCC_GENCODE for `archs`: SASS for each SM (PTX for `-virtual` entries), as the
/// kernel crate compiles them.
pub fn nvcc_gencode(archs: &[CudaArch]) -> String {
    archs
        .iter()
        .map(|a| {
            format!(
                "-gencode=arch={},code={}",
                a.ptx_name(),
                a.sass_name().unwrap_or_else(|| a.ptx_name())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Build (or find) NCCL for `req`.
pub fn build(store: &Store, req: &MakeRequest, force: bool) -> Result<Built> {
    if req.cuda_archs.is_empty() {
        bail!(
            "no CUDA archs to build NCCL for: set nvshmem.cuda-archs in stack.toml (e.g. [\"90\"])"
        );
    }
    let gencode = nvcc_gencode(req.cuda_archs);
    let inputs = serde_json::json!({
        "recipe": RECIPE,
        "source_tree": req.source_tree,
        "version": req.version,
        "nvcc_gencode": gencode,
        "toolchain": req.toolchain_identity,
    });
    let key = StepKey::new(STEP, &inputs);
    let outcome = store.run(&key, &inputs, force, |dir| {
        let work = dir.out.join("work");
        commstack_archive::copy_tree_except(req.source_dir, &work, |rel| {
            rel.file_name() == Some(".git".as_ref())
        })?;
        let build_dir = work.join("build");
        let mut make = Command::new("make");
        make.current_dir(&work)
            .env_clear()
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", req.cuda_home.join("bin").display()),
            )
            .env("HOME", &work)
            .env("LC_ALL", "C.UTF-8")
            .env("TZ", "UTC")
            .env("SOURCE_DATE_EPOCH", "0")
            .arg(format!("-j{}", req.jobs.max(1)))
            .arg("src.build")
            .arg(format!("BUILDDIR={}", build_dir.display()))
            .arg(format!("CUDA_HOME={}", req.cuda_home.display()))
            .arg(format!("NVCC_GENCODE={gencode}"));
        let command: Vec<String> = std::iter::once("make".to_string())
            .chain(make.get_args().map(|a| a.to_string_lossy().into_owned()))
            .collect();
        (req.progress)(&format!(
            "building NCCL {} ({gencode}, {} jobs): {}",
            req.version,
            req.jobs,
            dir.logs.join("build.log").display()
        ));
        let header = format!("$ {}\n", command.join(" "));
        let seconds = commstack_exec::logged::run_logged(
            make,
            &header,
            &dir.logs.join("build.log"),
            "NCCL's make src.build",
        )?;
        let prefix = dir.out.join(INSTALL_DIR);
        let soname = install(&build_dir, &prefix, req.version)?;
        fs::remove_dir_all(&work).with_context(|| format!("cannot remove {}", work.display()))?;
        let report = BuildReport {
            recipe: RECIPE.into(),
            version: req.version.into(),
            soname,
            source_tree: req.source_tree.into(),
            nvcc_gencode: gencode.clone(),
            command,
            seconds,
        };
        fs::write(
            dir.out.join(REPORT_FILE),
            serde_json::to_string_pretty(&report)?,
        )?;
        Ok(())
    })?;
    let report: BuildReport =
        commstack_store::read_json(&outcome.path().join(REPORT_FILE), "an NCCL build report")?;
    Ok(Built {
        prefix: outcome.path().join(INSTALL_DIR),
        key,
        outcome,
        report,
    })
}

/// From `make src.build`'s BUILDDIR to the prefix: the library under its soname and the
/// headers, after checking both are the locked version. Returns the soname.
fn install(build_dir: &Path, prefix: &Path, version: &str) -> Result<String> {
    let include = build_dir.join("include");
    let header = include.join("nccl.h");
    let text = fs::read_to_string(&header).with_context(|| {
        format!(
            "{}: make src.build made no nccl.h: not an NCCL source?",
            header.display()
        )
    })?;
    let found = header_version(&text).with_context(|| {
        format!(
            "{} has no NCCL_MAJOR/NCCL_MINOR/NCCL_PATCH",
            header.display()
        )
    })?;
    if found != version {
        bail!(
            "the NCCL source built NCCL {found} ({}), not the locked {version}: the locked source is another release; \
             run `cargo xtask lock` again",
            header.display()
        );
    }
    let lib = build_dir.join("lib").join(format!("libnccl.so.{version}"));
    let soname = ElfFile::open(&lib)
        .with_context(|| format!("make src.build made no {}", lib.display()))?
        .dynamic_info()?
        .soname
        .unwrap_or_default();
    if soname != SONAME {
        bail!(
            "{} has the soname {soname:?}, not {SONAME}: torch and DeepEP load {SONAME} [rule nccl-soname]",
            lib.display()
        );
    }
    fs::create_dir_all(prefix.join("lib"))?;
    fs::copy(&lib, prefix.join("lib").join(SONAME))
        .with_context(|| format!("cannot copy {}", lib.display()))?;
    commstack_archive::copy_tree_except(&include, &prefix.join("include"), |_| false)?;
    Ok(soname)
}

/// `2.30.7` from nccl.h's `#define NCCL_MAJOR 2` / `NCCL_MINOR 30` / `NCCL_PATCH 7`.
pub fn header_version(text: &str) -> Option<String> {
    let get = |name: &str| {
        let re =
            regex::Regex::new(&format!(r"(?m)^#define\s+{name}\s+(\d+)\s*$")).expect("valid regex");
        re.captures(text).map(|c| c[1].to_string())
    };
    Some(format!(
        "{}.{}.{}",
        get("NCCL_MAJOR")?,
        get("NCCL_MINOR")?,
        get("NCCL_PATCH")?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gencode_and_header_version() {
        let archs: Vec<CudaArch> = ["90", "100f", "90-virtual"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            nvcc_gencode(&archs),
            "-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_100f,code=sm_100f -gencode=arch=compute_90,code=compute_90"
        );
        let h = "#define NCCL_MAJOR 2\n#define NCCL_MINOR 30\n#define NCCL_PATCH 7\n#define NCCL_SUFFIX \"\"\n";
        assert_eq!(header_version(h).as_deref(), Some("2.30.7"));
        assert_eq!(header_version("#define NCCL_MAJOR 2\n"), None);
    }
}
