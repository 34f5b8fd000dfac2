//! The drop-in wheel: our NCCL build under the distribution name and the locked version
//! (`nvidia-nccl-cu13` `2.30.7+commstack.g1a2b3c4`, which `==2.30.7` accepts under PEP
//! 440), laid out like NVIDIA's wheel (`nvidia/nccl/lib/libnccl.so.2`,
//! `nvidia/nccl/include/`), so that installing it puts one libnccl.so.2 where torch
//! loads it from.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use commstack_elf::{self as elf, ElfFile};
use commstack_store::{Outcome, StepKey, Store};
use commstack_wheel::{Wheel, WheelBuilder};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::SONAME;
use crate::build::Built;

pub const STEP: &str = "nccl-wheel";
pub const RECIPE: &str = "nccl-dropin-1";
pub const WHEEL_REPORT_FILE: &str = "wheel-report.json";
/// Where NVIDIA's wheel puts NCCL inside site-packages.
const ROOT: &str = "nvidia/nccl";

/// `nvidia-nccl-cu13`.
pub fn distribution(cuda_major: u32) -> String {
    format!("nvidia-nccl-cu{cuda_major}")
}

/// `wheel-report.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NcclDropIn {
    pub wheel: PathBuf,
    pub filename: String,
    pub sha256: String,
    pub distribution: String,
    pub version: String,
    pub nccl_version: String,
    pub platform_tags: Vec<String>,
    /// Paths inside the wheel (without .dist-info).
    pub files: Vec<String>,
}

/// Package `built` as the drop-in wheel in its own store step (keyed by the build).
pub fn build_dropin_wheel(
    store: &Store,
    built: &Built,
    cuda_major: u32,
    force: bool,
) -> Result<(NcclDropIn, Outcome)> {
    let label = &built.key.hash[..7];
    let version = format!("{}+commstack.g{label}", built.report.version);
    let inputs = serde_json::json!({
        "recipe": RECIPE, "build": built.key.hash, "cuda_major": cuda_major, "version": version,
    });
    let key = StepKey::new(STEP, &inputs);
    let outcome = store.run(&key, &inputs, force, |dir| {
        let report = write_wheel(
            &built.prefix,
            &dir.out.join("dist"),
            &distribution(cuda_major),
            &version,
            &built.report.version,
        )?;
        fs::write(
            dir.out.join(WHEEL_REPORT_FILE),
            serde_json::to_string_pretty(&report)?,
        )?;
        Ok(())
    })?;
    let mut report: NcclDropIn =
        commstack_store::read_json(&outcome.path().join(WHEEL_REPORT_FILE), "a wheel report")?;
    report.wheel = outcome.path().join("dist").join(&report.filename);
    Ok((report, outcome))
}

/// The prefix's files as (path in the wheel, file): the library and every header.
fn select_files(prefix: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = vec![(
        format!("{ROOT}/lib/{SONAME}"),
        prefix.join("lib").join(SONAME),
    )];
    let include = prefix.join("include");
    for e in walkdir::WalkDir::new(&include).sort_by_file_name() {
        let e = e.with_context(|| format!("cannot walk {}", include.display()))?;
        if e.file_type().is_file() {
            let rel = e.path().strip_prefix(&include).expect("under include");
            out.push((
                format!("{ROOT}/include/{}", rel.to_string_lossy()),
                e.path().to_path_buf(),
            ));
        }
    }
    Ok(out)
}

fn write_wheel(
    prefix: &Path,
    out_dir: &Path,
    distribution: &str,
    version: &str,
    nccl_version: &str,
) -> Result<NcclDropIn> {
    let files = select_files(prefix)?;
    let lib = ElfFile::open(&files[0].1)
        .with_context(|| format!("{} is not an ELF library", files[0].1.display()))?;
    let glibc = elf::newest_glibc(&lib.needed_versions()?);
    let tag = elf::ManylinuxTag::for_glibc(glibc.as_ref(), "x86_64");
    let platform_tags = tag.wheel_platform_tags();
    let mut b = WheelBuilder::new(distribution, version)?
        .root_is_purelib(true) // as NVIDIA's wheel: site-packages/nvidia/nccl either way
        .metadata(
            "Summary",
            &format!("NCCL {nccl_version} built from source by commstack"),
        )
        .metadata("Requires-Python", ">=3")
        .description(&format!(
            "NCCL {nccl_version} built from its release source by commstack, as a drop-in for NVIDIA's {distribution} wheel."
        ));
    for t in &platform_tags {
        b = b.tag("py3", "none", t);
    }
    for (inner, path) in &files {
        b.add_file(inner, path)?;
    }
    b.add_dist_info_bytes("top_level.txt", b"nvidia\n".to_vec())?;
    let written = b.write(out_dir)?;
    Wheel::open(&written.path)?.verify()?;
    let sha256 = hex::encode(Sha256::digest(fs::read(&written.path)?));
    Ok(NcclDropIn {
        wheel: written.path.clone(),
        filename: written.filename.to_string(),
        sha256,
        distribution: distribution.to_string(),
        version: written.filename.version.to_string(),
        nccl_version: nccl_version.to_string(),
        platform_tags,
        files: files.into_iter().map(|(p, _)| p).collect(),
    })
}
