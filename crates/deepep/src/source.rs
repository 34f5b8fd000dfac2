//! The DeepEP source: where it comes from (the lock's archive in the fetch cache, or a
//! `--source` override), a private copy to build in, and what it says about itself (the
//! API it implements, the RDC fix), read from the real files at build time.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_stack::manifest::DeepEpApi;
use serde::{Deserialize, Serialize};

/// One DeepEP source tree or archive, with its tree hash (commstack_fetch::tree).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInput {
    /// A directory, or a `.tar.gz` / `.tgz` / `.tar` archive.
    pub path: PathBuf,
    pub tree_sha256: String,
    /// The git revision the lock names for it.
    pub rev: String,
    /// `locked` when the tree hash is the lock's, else what replaced it.
    pub provenance: String,
}

impl SourceInput {
    /// A user-given directory or archive: hashed here, compared with the lock's tree hash.
    pub fn from_path(path: &Path, locked_tree: Option<&str>, rev: &str) -> Result<SourceInput> {
        let path = path
            .canonicalize()
            .with_context(|| format!("no DeepEP source at {}", path.display()))?;
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tree = commstack_fetch::tree::tree_sha256(&path, &name)
            .with_context(|| format!("cannot hash the DeepEP source {}", path.display()))?;
        let provenance = match locked_tree {
            Some(t) if t == tree => "locked".to_string(),
            Some(t) => format!("OVERRIDE: tree {tree} is not the locked {t}"),
            None => format!("OVERRIDE: tree {tree}; the lock pins no tree"),
        };
        Ok(SourceInput {
            path,
            tree_sha256: tree,
            rev: rev.to_string(),
            provenance,
        })
    }

    pub fn is_locked(&self) -> bool {
        self.provenance == "locked"
    }

    /// Copy (directory, without `.git`) or unpack (archive, through commstack-archive)
    /// into `dest`, which must not exist. An archive's single top directory (GitHub's,
    /// `git archive --prefix`'s) is dropped by the rule the tree hash uses, so what is
    /// unpacked hashes like the archive.
    pub fn materialize(&self, dest: &Path) -> Result<()> {
        if self.path.is_dir() {
            commstack_archive::copy_tree_except(&self.path, dest, |rel| {
                rel.file_name() == Some(".git".as_ref())
            })
        } else {
            let options =
                commstack_archive::Options::strip(commstack_archive::Strip::TopDirIfSingle);
            commstack_archive::unpack(&self.path, dest, &options)
                .map(|_| ())
                .with_context(|| format!("cannot unpack the DeepEP source {}", self.path.display()))
        }
    }
}

/// The API a DeepEP tree implements, from its layout: V1 has `csrc/deep_ep.cpp` and
/// builds `deep_ep_cpp`; V2 has `deep_ep/utils/find_pkgs.py` and builds `deep_ep._C`.
pub fn detect_api(src: &Path) -> Result<DeepEpApi> {
    let v1 = src.join("csrc/deep_ep.cpp").is_file();
    let v2 = src.join("deep_ep/utils/find_pkgs.py").is_file();
    match (v1, v2) {
        (true, false) => Ok(DeepEpApi::V1),
        (false, true) => Ok(DeepEpApi::V2),
        _ => bail!(
            "{} does not look like DeepEP: expected csrc/deep_ep.cpp (V1) or deep_ep/utils/find_pkgs.py (V2) and a setup.py",
            src.display()
        ),
    }
}

/// V1 against NVSHMEM >= 3.3.20 needs the RDC fix (DeepEP 29d31c0): decided from the real
/// `csrc/kernels/configs.cuh` by [`commstack_stack::rules::deepep_v1_has_rdc_fix`].
/// Returns whether the fix is present; errors when it is needed and absent, unless the
/// rule is allowed.
pub fn check_rdc_fix(src: &Path, nvshmem_version: Option<&str>, allowed: bool) -> Result<bool> {
    let path = src.join("csrc/kernels/configs.cuh");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let has_fix = commstack_stack::rules::deepep_v1_has_rdc_fix(&text);
    let sensitive: pep440_rs::Version = commstack_stack::rules::NVSHMEM_RDC_SENSITIVE
        .parse()
        .expect("a version");
    let needs_fix = match nvshmem_version.map(str::parse::<pep440_rs::Version>) {
        Some(Ok(v)) => v >= sensitive,
        _ => true,
    };
    if needs_fix && !has_fix && !allowed {
        bail!(
            "{} does not force RDC (no `#define __CUDACC_RDC__` under `#ifndef DISABLE_NVSHMEM`), and NVSHMEM {} defines nvshmemi_ibgda_device_state_d itself: \
             the link would fail with `multiple definition of nvshmemi_ibgda_device_state_d` [rule deepep-v1-rdc-fix]. \
             Use DeepEP 567632d (the last V1 commit, includes the fix of 29d31c0), or NVSHMEM < {sensitive}",
            path.display(),
            nvshmem_version.unwrap_or("(unknown version)")
        );
    }
    Ok(has_fix)
}

/// The version setup.py will write (`1.2.1` for V1 567632d), for messages.
pub fn declared_version(src: &Path) -> Option<String> {
    let re =
        regex::Regex::new(r#"(?m)(?:version\s*=\s*|__version__\s*=\s*)['"]([0-9][^'"+]*)['"]"#)
            .expect("valid regex");
    for file in ["setup.py", "deep_ep/__init__.py"] {
        if let Ok(text) = fs::read_to_string(src.join(file))
            && let Some(c) = re.captures(&text)
        {
            return Some(c[1].to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn tar_gz(dir: &Path, entries: &[(&str, &[u8])]) -> PathBuf {
        let path = dir.join("src.tar.gz");
        let file = File::create(&path).unwrap();
        let mut b = tar::Builder::new(flate2::write::GzEncoder::new(
            file,
            flate2::Compression::fast(),
        ));
        for (name, bytes) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *bytes).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap();
        path
    }

    #[test]
    fn archives_unpack_without_their_top_directory_and_hash_like_the_tree() {
        let d = tempfile::tempdir().unwrap();
        let a = tar_gz(
            d.path(),
            &[
                ("DeepEP-567632d/setup.py", b"version='1.2.1'\n"),
                ("DeepEP-567632d/csrc/deep_ep.cpp", b"int x;\n"),
            ],
        );
        let out = d.path().join("out");
        let from_archive = SourceInput::from_path(&a, None, "567632d").unwrap();
        from_archive.materialize(&out).unwrap();
        assert!(out.join("setup.py").is_file() && out.join("csrc/deep_ep.cpp").is_file());
        assert_eq!(detect_api(&out).unwrap(), DeepEpApi::V1);
        assert_eq!(declared_version(&out).as_deref(), Some("1.2.1"));
        // The tree hash of the archive and of what it unpacked to agree (so --source
        // accepts either).
        let from_dir =
            SourceInput::from_path(&out, Some(&from_archive.tree_sha256), "567632d").unwrap();
        assert!(from_dir.is_locked());
        assert!(!from_archive.is_locked() && from_archive.provenance.starts_with("OVERRIDE"));
    }

    #[test]
    fn entries_leaving_the_tree_are_refused() {
        let d = tempfile::tempdir().unwrap();
        // tar::Builder refuses `..` paths itself; write the header name by hand.
        let path = d.path().join("evil.tar");
        let mut b = tar::Builder::new(File::create(&path).unwrap());
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"../x.txt\0");
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        b.finish().unwrap();
        let src = SourceInput::from_path(&path, None, "567632d").unwrap();
        let err = format!("{:#}", src.materialize(&d.path().join("out")).unwrap_err());
        assert!(err.contains("leaves") && err.contains("../x.txt"), "{err}");
        assert!(!d.path().join("out").exists() && !d.path().join("x.txt").exists());
    }

    #[test]
    fn rdc_fix_is_required_from_nvshmem_3_3_20_on() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("csrc/kernels")).unwrap();
        let cfg = d.path().join("csrc/kernels/configs.cuh");
        fs::write(
            &cfg,
            "#pragma once\n#ifndef DISABLE_NVSHMEM\n#include <nvshmem.h>\n#endif\n",
        )
        .unwrap();
        let err = check_rdc_fix(d.path(), Some("3.4.5"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("multiple definition of nvshmemi_ibgda_device_state_d")
                && err.contains("567632d"),
            "{err}"
        );
        assert!(!check_rdc_fix(d.path(), Some("3.3.19"), false).unwrap());
        assert!(!check_rdc_fix(d.path(), Some("3.4.5"), true).unwrap());
        fs::write(&cfg, "#pragma once\n#ifndef DISABLE_NVSHMEM\n#ifndef __CUDACC_RDC__\n#define __CUDACC_RDC__\n#endif\n#endif\n").unwrap();
        assert!(check_rdc_fix(d.path(), Some("3.4.5"), false).unwrap());
    }

    /// The real DeepEP 567632d, when its archive is at hand (`git archive` of the mirror).
    #[test]
    #[ignore = "needs scratch/src/DeepEP-567632dd….tar.gz (git --git-dir=<mirror> archive --prefix=DeepEP-<rev>/ 567632d | gzip)"]
    fn real_567632d_is_v1_with_the_rdc_fix_and_its_locked_tree() {
        let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scratch/src/DeepEP-567632dd59810d77b3cc05553df953cc0f779799.tar.gz");
        let known = commstack_stack::known::deepep_rev("567632d").unwrap();
        let src = SourceInput::from_path(&archive, known.tree.as_deref(), &known.rev).unwrap();
        assert!(src.is_locked(), "{}", src.provenance);
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("src");
        src.materialize(&out).unwrap();
        assert_eq!(detect_api(&out).unwrap(), DeepEpApi::V1);
        assert!(check_rdc_fix(&out, Some("3.4.5"), false).unwrap());
        assert_eq!(declared_version(&out).as_deref(), Some("1.2.1"));
    }
}
