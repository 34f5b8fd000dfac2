//! The drop-in wheel: our install packaged under the name and version torch pins
//! (`nvidia-nvshmem-cu13==3.4.5` is satisfied by `3.4.5+commstack.g1a2b3c4` under PEP
//! 440), laid out like NVIDIA's wheel, so pip installs ours instead of NVIDIA's and torch
//! and DeepEP load one NVSHMEM: this one.
//!
//! NVIDIA's 3.4.5 wheel holds `nvidia/nvshmem/lib/` with each shared object under its
//! SONAME only (`libnvshmem_host.so.3`, `nvshmem_transport_ibgda.so.3`, no unversioned
//! link, no `.so.3.4.5`), `libnvshmem_device.a`, `libnvshmem_device.bc`, and
//! `nvidia/nvshmem/include/`. The same selection is made here from our install.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_elf::{self as elf, ElfFile};
use commstack_store::{Outcome, StepKey, Store};
use commstack_wheel::{Wheel, WheelBuilder};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::build::Built;

pub const WHEEL_REPORT_FILE: &str = "wheel-report.json";
/// The store step name of the drop-in wheel.
pub const STEP: &str = "nvshmem-wheel";
pub const RECIPE: &str = "nvshmem-dropin-1";
/// Where NVIDIA's wheel puts NVSHMEM inside site-packages.
const ROOT: &str = "nvidia/nvshmem";

/// What the wheel is named and versioned as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropInSpec {
    /// torch's CUDA major: the `cuXX` of the distribution name.
    pub cuda_major: u32,
    /// The version torch's wheel pins (`Requires-Dist: nvidia-nvshmem-cu13==3.4.5`).
    pub torch_pin: String,
    /// Build the wheel even though the source is another NVSHMEM version than torch's
    /// pin: the wheel then carries the pin's version and another NVSHMEM inside it.
    pub allow_version_mismatch: bool,
}

/// `nvidia-nvshmem-cu13`.
pub fn dropin_distribution(cuda_major: u32) -> String {
    format!("nvidia-nvshmem-cu{cuda_major}")
}

/// Rule `nvshmem-version-matches-torch` for the wheel, as the lock decides it
/// ([`commstack_stack::rules::nvshmem_matches_torch_pin`]): None when NVSHMEM
/// `nvshmem_version` is torch's pin; the wheel's OVERRIDE note when it is not and the spec
/// allows it; else the error.
fn version_note(nvshmem_version: &str, spec: &DropInSpec) -> Result<Option<String>> {
    use commstack_stack::rules::{RuleId, nvshmem_matches_torch_pin};
    let build: pep440_rs::Version = nvshmem_version.parse().map_err(|e| {
        anyhow::anyhow!(
            "the NVSHMEM source's version {nvshmem_version:?} is not a PEP 440 version: {e}"
        )
    })?;
    let pin_version = spec.torch_pin.parse().map_err(|e| {
        anyhow::anyhow!(
            "torch's NVSHMEM pin {:?} is not a PEP 440 version: {e}",
            spec.torch_pin
        )
    })?;
    let pin = commstack_stack::Pin::new(dropin_distribution(spec.cuda_major), pin_version);
    let Err(conflict) = nvshmem_matches_torch_pin(&build, &pin) else {
        return Ok(None);
    };
    let rule = RuleId::NvshmemMatchesTorch.as_str();
    if !spec.allow_version_mismatch {
        bail!(
            "{conflict} [rule {rule}]. The drop-in wheel carries torch's version {pin_version}: build NVSHMEM \
             {pin_version} (nvshmem.version = \"match-torch\"), or allow rule {rule} (resolve.allow in \
             stack.toml, or --allow-version-mismatch) to ship NVSHMEM {build} under it (torch's \
             libtorch_nvshmem was compiled against {pin_version}; its device code and the host library must \
             agree, so test before use)",
            pin_version = pin.version
        );
    }
    Ok(Some(format!(
        "OVERRIDE: contains NVSHMEM {build} under torch's pinned version {}; torch was built against it [rule {rule} allowed]",
        pin.version
    )))
}

/// `commstack.g1a2b3c4`: starts with a letter so PEP 440 normalisation keeps it as is
/// (numeric segments lose leading zeros).
pub fn local_label(build_hash: &str) -> String {
    format!("commstack.g{}", &build_hash[..7.min(build_hash.len())])
}

/// `wheel-report.json` and the result of [`build_dropin_wheel`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DropIn {
    pub wheel: PathBuf,
    pub filename: String,
    pub sha256: String,
    pub distribution: String,
    pub version: String,
    pub nvshmem_version: String,
    pub platform_tags: Vec<String>,
    pub newest_glibc: Option<String>,
    /// Paths inside the wheel (without .dist-info).
    pub files: Vec<String>,
    /// Things a user must know (a version override, a missing bitcode library).
    pub notes: Vec<String>,
}

/// Package `built` as the drop-in wheel, in its own store step (keyed by the build step
/// and the spec). Returns the step outcome too.
pub fn build_dropin_wheel(
    store: &Store,
    built: &Built,
    spec: &DropInSpec,
    force: bool,
) -> Result<(DropIn, Outcome)> {
    let nvshmem_version = built.report.source.version.clone();
    let mut notes: Vec<String> = version_note(&nvshmem_version, spec)?.into_iter().collect();
    if built.report.options.bitcode_llvm.is_none() {
        notes.push(
            "no libnvshmem_device.bc: torch's Triton NVSHMEM kernels (symmetric memory, NVSHMEM backend) cannot load it; \
             DeepEP and torch's host-side NVSHMEM use do not need it"
                .into(),
        );
    }
    let version = format!("{}+{}", spec.torch_pin, local_label(&built.key.hash));
    let distribution = dropin_distribution(spec.cuda_major);
    let inputs = serde_json::json!({ "recipe": RECIPE, "build": built.key.hash, "spec": spec, "version": version });
    let key = StepKey::new(STEP, &inputs);
    let outcome = store.run(&key, &inputs, force, |dir| {
        let report = write_wheel(
            &built.prefix,
            &dir.out.join("dist"),
            &distribution,
            &version,
            &nvshmem_version,
            &notes,
        )?;
        let path = dir.out.join(WHEEL_REPORT_FILE);
        fs::write(&path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    })?;
    let mut report: DropIn =
        commstack_store::read_json(&outcome.path().join(WHEEL_REPORT_FILE), "a wheel report")?;
    report.wheel = outcome.path().join("dist").join(&report.filename);
    Ok((report, outcome))
}

/// The files of the install that NVIDIA's wheel layout has, as (path in wheel, file).
pub fn select_files(prefix: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let lib = prefix.join("lib");
    let soname_style = regex::Regex::new(r"^(lib)?nvshmem\w*\.so\.\d+$").expect("valid regex");
    let mut names: Vec<String> = fs::read_dir(&lib)
        .with_context(|| format!("cannot read {}", lib.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    for name in names {
        let path = lib.join(&name);
        let keep = soname_style.is_match(&name)
            || name == "libnvshmem_device.a"
            || name == "libnvshmem_device.bc";
        if keep && path.is_file() {
            out.push((format!("{ROOT}/lib/{name}"), path));
        }
    }
    let include = prefix.join("include");
    for e in walkdir::WalkDir::new(&include)
        .follow_links(true)
        .sort_by_file_name()
    {
        let e = e.with_context(|| format!("cannot walk {}", include.display()))?;
        if e.file_type().is_file() {
            let rel = e
                .path()
                .strip_prefix(&include)
                .expect("under include")
                .to_string_lossy()
                .replace('\\', "/");
            out.push((format!("{ROOT}/include/{rel}"), e.path().to_path_buf()));
        }
    }
    if !out
        .iter()
        .any(|(p, _)| p.ends_with("/libnvshmem_host.so.3") || p.contains("/libnvshmem_host.so."))
    {
        bail!(
            "{} has no libnvshmem_host.so.<major>: not an NVSHMEM install",
            lib.display()
        );
    }
    Ok(out)
}

fn write_wheel(
    prefix: &Path,
    out_dir: &Path,
    distribution: &str,
    version: &str,
    nvshmem_version: &str,
    notes: &[String],
) -> Result<DropIn> {
    let files = select_files(prefix)?;
    let mut needs = Vec::new();
    for (_, path) in &files {
        let mut head = [0u8; 4];
        let n = std::io::Read::read(&mut fs::File::open(path)?, &mut head)?;
        if head[..n] == *b"\x7fELF" {
            needs.extend(ElfFile::open(path)?.needed_versions()?);
        }
    }
    let glibc = elf::newest_glibc(&needs);
    let tag = elf::ManylinuxTag::for_glibc(glibc.as_ref(), "x86_64");
    let platform_tags = tag.wheel_platform_tags();

    let mut b = WheelBuilder::new(distribution, version)?
        .root_is_purelib(true) // as NVIDIA's wheel: site-packages/nvidia/nvshmem either way
        .metadata("Summary", &format!("NVSHMEM {nvshmem_version} built from source by commstack, NVSHMEM_USE_NCCL=OFF"))
        .metadata("Requires-Python", ">=3")
        .metadata("License-File", "License.txt")
        .description(&format!(
            "NVSHMEM {nvshmem_version} built from source by commstack with NVSHMEM_USE_NCCL=OFF, as a drop-in for NVIDIA's \
             {distribution} wheel.\n{}",
            notes.iter().map(|n| format!("\nNote: {n}\n")).collect::<String>()
        ));
    for t in &platform_tags {
        b = b.tag("py3", "none", t);
    }
    for (inner, path) in &files {
        b.add_file(inner, path)?;
    }
    let license = prefix.join("License.txt");
    if license.is_file() {
        b.add_dist_info_file("licenses/License.txt", &license)?;
    }
    b.add_dist_info_bytes("top_level.txt", b"nvidia\n".to_vec())?;
    let written = b.write(out_dir)?;
    Wheel::open(&written.path)?.verify()?;
    let sha256 = hex::encode(Sha256::digest(fs::read(&written.path)?));
    Ok(DropIn {
        wheel: written.path.clone(),
        filename: written.filename.to_string(),
        sha256,
        distribution: distribution.to_string(),
        version: written.filename.version.to_string(),
        nvshmem_version: nvshmem_version.to_string(),
        platform_tags,
        newest_glibc: glibc.map(|v| v.to_string()),
        files: files.into_iter().map(|(p, _)| p).collect(),
        notes: notes.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert_eq!(dropin_distribution(13), "nvidia-nvshmem-cu13");
        let v = commstack_wheel::parse_version(&format!("3.4.5+{}", local_label("0123abcdef")))
            .unwrap();
        assert_eq!(v.to_string(), "3.4.5+commstack.g0123abc");
        // torch's `==3.4.5` accepts it (PEP 440: a local version matches its public one).
        let spec: pep440_rs::VersionSpecifier = "==3.4.5".parse().unwrap();
        assert!(spec.contains(&v));
    }

    /// The wheel decides torch's version rule as the lock does, in the lock's words: a
    /// stack the lock accepted is not refused here, nor the other way round.
    #[test]
    fn the_version_rule_is_the_locks() {
        use commstack_stack::rules::nvshmem_matches_torch_pin;
        let spec = |pin: &str, allow: bool| DropInSpec {
            cuda_major: 13,
            torch_pin: pin.into(),
            allow_version_mismatch: allow,
        };
        let rule = |build: &str, pin: &str| {
            nvshmem_matches_torch_pin(
                &build.parse().unwrap(),
                &commstack_stack::Pin::new("nvidia-nvshmem-cu13", pin.parse().unwrap()),
            )
        };
        assert_eq!(version_note("3.4.5", &spec("3.4.5", false)).unwrap(), None);
        // The lock compares release segments: a post release of the pin is the same NVSHMEM.
        assert!(rule("3.4.5", "3.4.5.post1").is_ok());
        assert_eq!(
            version_note("3.4.5", &spec("3.4.5.post1", false)).unwrap(),
            None
        );
        // Another version: refused with the lock's sentence, and the ways out.
        let err = version_note("3.3.24", &spec("3.4.5", false))
            .unwrap_err()
            .to_string();
        let conflict = rule("3.3.24", "3.4.5").unwrap_err();
        assert!(err.starts_with(&conflict), "{err}");
        assert!(
            err.contains("[rule nvshmem-version-matches-torch]")
                && err.contains("--allow-version-mismatch"),
            "{err}"
        );
        // Allowed: shipped with a note that says so.
        let note = version_note("3.3.24", &spec("3.4.5", true))
            .unwrap()
            .unwrap();
        assert!(
            note.starts_with("OVERRIDE: contains NVSHMEM 3.3.24"),
            "{note}"
        );
        // A pin that is no version is an error naming it, not a mismatch.
        let err = version_note("3.4.5", &spec("three", false)).unwrap_err();
        assert!(err.to_string().contains("\"three\""), "{err}");
    }
}
