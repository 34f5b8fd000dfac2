//! commstack-selftest (the kernel crate) built reproducibly against an NVSHMEM install
//! with a CUDA toolkit: both linked into the fixed build directory and keyed by their
//! contents, the archs and the RUNPATH (relative: the binary names no directory of the
//! build machine).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use commstack_stack::CudaArch;
use commstack_store::Store;

use crate::build::{OwnTool, Say, ToolRecipe, own_tool};

/// Where the NVSHMEM a kernel build compiles against came from.
pub struct NvshmemForKernels {
    pub prefix: PathBuf,
    pub describe: String,
}

/// COMMSTACK_CUDA_ARCHS for the kernel crate's build script, which parses it back with
/// the same CUDA-arch type.
pub fn env_archs(archs: &[CudaArch]) -> String {
    let entries: Vec<String> = archs.iter().map(CudaArch::cmake).collect();
    entries.join(";")
}

/// The RUNPATH of a bundle's self-test: `bin/commstack-selftest` beside `lib/nvshmem/`
/// (kernels/gpu/run-selftest.sh).
pub const BUNDLE_RUNPATH: &str = "$ORIGIN/../lib/nvshmem";

/// What one reproducible build of commstack-selftest takes.
pub struct SelftestBuild<'a> {
    /// The workspace whose sources are built (copied; a checkout anywhere).
    pub root: &'a Path,
    /// nvcc of a CUDA toolkit (a toolchain step's, or a system one).
    pub nvcc: &'a Path,
    pub nvshmem: &'a NvshmemForKernels,
    pub archs: &'a [CudaArch],
    /// RUNPATH entries, relative to the binary (`$ORIGIN/...`): where NVSHMEM is beside
    /// it where it runs.
    pub runpath: Vec<String>,
    /// Build even when the store has it.
    pub force: bool,
}

/// Build commstack-selftest (release) for a GPU bundle and return its path: reproducible
/// and stripped, in the store, RUNPATH [`BUNDLE_RUNPATH`].
pub fn build_selftest(
    store: &Store,
    say: Say,
    nvcc: &Path,
    nvshmem: &NvshmemForKernels,
    archs: &[CudaArch],
) -> Result<PathBuf> {
    let built = selftest_step(
        store,
        say,
        &SelftestBuild {
            root: &crate::workspace::workspace_root(),
            nvcc,
            nvshmem,
            archs,
            runpath: vec![BUNDLE_RUNPATH.to_string()],
            force: false,
        },
    )?;
    Ok(built.path)
}

/// commstack-selftest built reproducibly and stripped, in a store step keyed by the
/// sources, rustc, the CUDA toolkit's and NVSHMEM's identities (contents, not paths), the
/// archs and the RUNPATH.
pub fn selftest_step(store: &Store, say: Say, b: &SelftestBuild) -> Result<OwnTool> {
    if let Some(entry) = b.runpath.iter().find(|e| !e.starts_with("$ORIGIN")) {
        bail!(
            "RUNPATH entry {entry:?} is not relative to the binary ($ORIGIN/...): it would \
             name a directory of this machine in the binary"
        );
    }
    if let Some(say) = say {
        say(&format!(
            "commstack-selftest: nvcc {}, {}, archs {}, RUNPATH {}",
            b.nvcc.display(),
            b.nvshmem.describe,
            env_archs(b.archs),
            b.runpath.join(":")
        ));
    }
    let built = own_tool(store, say, &selftest_recipe(b)?)?;
    if let Some(say) = say {
        say(&format!(
            "commstack-selftest: {} (sha256 {}{})",
            built.path.display(),
            built.sha256,
            if built.cached { ", in the store" } else { "" }
        ));
    }
    Ok(built)
}

/// How [`selftest_step`] builds: the toolchain and NVSHMEM linked into the build
/// directory, keyed by their identities.
fn selftest_recipe<'a>(b: &'a SelftestBuild) -> Result<ToolRecipe<'a>> {
    let cuda = CudaToolkit::of(b.nvcc)?;
    let archs = env_archs(b.archs);
    Ok(ToolRecipe {
        root: b.root,
        package: "commstack-kernels",
        bin: "commstack-selftest",
        features: &["cuda"],
        dir: "kernels",
        links: vec![
            ("cuda", cuda.link_target.clone()),
            ("nvshmem", b.nvshmem.prefix.clone()),
        ],
        env: vec![
            (
                "COMMSTACK_NVCC",
                format!("{{build}}/cuda/{}", cuda.nvcc_in_link),
            ),
            ("NVSHMEM_HOME", "{build}/nvshmem".to_string()),
            ("COMMSTACK_CUDA_ARCHS", archs.clone()),
            ("COMMSTACK_SELFTEST_RUNPATH", b.runpath.join(":")),
        ],
        inputs: serde_json::json!({
            "cuda": cuda.identity,
            "nvshmem": nvshmem_identity(&b.nvshmem.prefix)?,
            "archs": archs,
            "runpath": b.runpath,
        }),
        force: b.force,
    })
}

/// The CUDA toolkit an nvcc belongs to, as a reproducible build sees and keys it.
struct CudaToolkit {
    /// What the build directory's `cuda` link points to: the toolchain's store step, or
    /// the toolkit's root (`<nvcc>/../..`).
    link_target: PathBuf,
    /// nvcc relative to `link_target`.
    nvcc_in_link: String,
    /// The key's part: the toolchain's wheels and versions (a store step), or nvcc's
    /// version and the compilers' bytes (a system toolkit). No path of the store.
    identity: serde_json::Value,
}

impl CudaToolkit {
    fn of(nvcc: &Path) -> Result<CudaToolkit> {
        // nvcc finds nvcc.profile beside itself: a link to the binary is resolved first.
        let nvcc = match std::fs::symlink_metadata(nvcc) {
            Ok(m) if m.file_type().is_symlink() => nvcc.canonicalize()?,
            Ok(_) => std::path::absolute(nvcc)?,
            Err(e) => return Err(e).with_context(|| format!("no nvcc at {}", nvcc.display())),
        };
        let step = nvcc
            .ancestors()
            .skip(1)
            .find(|d| d.join(commstack_toolchain::TOOLCHAIN_FILE).is_file());
        let (link_target, identity) = match step {
            Some(step) => (
                step.to_path_buf(),
                commstack_toolchain::load_provisioned(step)?.identity(),
            ),
            None => {
                let home = nvcc.parent().and_then(Path::parent).with_context(|| {
                    format!("{} is not in a CUDA toolkit's bin/", nvcc.display())
                })?;
                let version = Command::new(&nvcc)
                    .arg("--version")
                    .output()
                    .with_context(|| format!("cannot run {} --version", nvcc.display()))?;
                // The programs that make the device code; the headers go with nvcc's version.
                let mut bytes = serde_json::Map::new();
                for tool in [
                    "bin/nvcc",
                    "bin/ptxas",
                    "bin/nvlink",
                    "bin/fatbinary",
                    "bin/cudafe++",
                    "nvvm/bin/cicc",
                ] {
                    let path = home.join(tool);
                    if path.is_file() {
                        bytes.insert(
                            tool.to_string(),
                            commstack_digest::sha256_file(&path)?.into(),
                        );
                    }
                }
                (
                    home.to_path_buf(),
                    serde_json::json!({
                        "kind": "toolkit",
                        "nvcc_version": String::from_utf8_lossy(&version.stdout).trim(),
                        "sha256": bytes,
                    }),
                )
            }
        };
        let nvcc_in_link = nvcc
            .strip_prefix(&link_target)
            .with_context(|| format!("{} is not under {}", nvcc.display(), link_target.display()))?
            .display()
            .to_string();
        Ok(CudaToolkit {
            link_target,
            nvcc_in_link,
            identity,
        })
    }
}

/// sha256 of what the kernel build reads from an NVSHMEM prefix: every header, the device
/// library and the host library it links against. The same install anywhere hashes alike.
pub fn nvshmem_identity(prefix: &Path) -> Result<String> {
    use sha2::Digest;
    let mut files: Vec<PathBuf> = Vec::new();
    for entry in walkdir::WalkDir::new(prefix.join("include")).sort_by_file_name() {
        let entry = entry.with_context(|| format!("cannot read {}/include", prefix.display()))?;
        if entry.file_type().is_file() {
            files.push(entry.into_path());
        }
    }
    files.push(prefix.join("lib/libnvshmem_device.a"));
    files.push(prefix.join("lib/libnvshmem_host.so.3"));
    let mut hasher = sha2::Sha256::new();
    for f in &files {
        let rel = f.strip_prefix(prefix).unwrap_or(f);
        let sha = commstack_digest::sha256_file(f)
            .with_context(|| format!("cannot read {}", f.display()))?;
        hasher.update(format!("{} {sha}\n", rel.display()).as_bytes());
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::tool_key;
    use commstack_store::StepKey;

    #[test]
    fn the_build_copies_every_member_and_no_target_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("src");
        crate::workspace::copy_workspace(&crate::workspace::workspace_root(), &dest).unwrap();
        for file in [
            "Cargo.toml",
            "Cargo.lock",
            "kernels/Cargo.toml",
            "kernels/cu/kernels.cu",
            "crates/verify/Cargo.toml",
            "xtask/Cargo.toml",
        ] {
            assert!(dest.join(file).is_file(), "{file} is not copied");
        }
        assert!(!dest.join("target").exists() && !dest.join(".git").exists());
    }

    /// Each place `needle` occurs in `bytes`, as the printable text around it.
    fn occurrences(bytes: &[u8], needle: &[u8]) -> Vec<String> {
        let printable = |b: &u8| b.is_ascii_graphic() || *b == b' ';
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(needle.len()).position(|w| w == needle) {
            let i = at + i;
            let start = bytes[..i]
                .iter()
                .rposition(|b| !printable(b))
                .map_or(0, |p| p + 1);
            let end = bytes[i..]
                .iter()
                .position(|b| !printable(b))
                .map_or(bytes.len(), |p| i + p);
            out.push(
                String::from_utf8_lossy(&bytes[start.max(i.saturating_sub(200))..end.min(i + 300)])
                    .into_owned(),
            );
            at = end.max(i + 1);
        }
        out
    }

    /// Fails naming each of `places` the binary at `path` holds, and any other path under
    /// the fixed build root than `fixed` (the build directory nvlink's options record).
    fn assert_names_no_path(path: &Path, places: &[PathBuf], fixed: Option<&Path>) {
        let bytes = std::fs::read(path).unwrap();
        let mut named: Vec<String> = places
            .iter()
            .flat_map(|p| occurrences(&bytes, p.as_os_str().as_encoded_bytes()))
            .collect();
        named.extend(occurrences(&bytes, b"tmpxft_"));
        let root = commstack_store::FIXED_BUILD_ROOT.as_bytes();
        let fixed = fixed.map(|f| f.as_os_str().as_encoded_bytes());
        let mut pos = 0;
        while let Some(i) = bytes[pos..].windows(root.len()).position(|w| w == root) {
            let i = pos + i;
            if !fixed.is_some_and(|f| bytes[i..].starts_with(f)) {
                named.extend(occurrences(&bytes[i..], root).into_iter().take(1));
            }
            pos = i + 1;
        }
        assert!(
            named.is_empty(),
            "{} names paths of the build machine:\n{}",
            path.display(),
            named.join("\n")
        );
    }

    /// The RUNPATH of the self-test at `path` is `runpath`, and in the image's layout it
    /// finds the NVSHMEM of `prefix` with no LD_LIBRARY_PATH.
    fn assert_finds_nvshmem_in_the_image(path: &Path, runpath: &str, prefix: &Path, at: &Path) {
        let dynamic = Command::new("readelf")
            .args(["-d", "-W"])
            .arg(path)
            .output()
            .unwrap();
        let dynamic = String::from_utf8_lossy(&dynamic.stdout);
        assert!(
            dynamic.contains(&format!("Library runpath: [{runpath}]")),
            "{dynamic}"
        );
        assert!(dynamic.contains("[libnvshmem_host.so.3]"), "{dynamic}");
        let bin = at.join("opt/commstack/bin");
        let lib = at.join("opt/commstack/venv/lib/python3.11/site-packages/nvidia/nvshmem/lib");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::copy(path, bin.join("commstack-selftest")).unwrap();
        std::fs::copy(
            prefix.join("lib/libnvshmem_host.so.3"),
            lib.join("libnvshmem_host.so.3"),
        )
        .unwrap();
        let ldd = Command::new("ldd")
            .arg(bin.join("commstack-selftest"))
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .unwrap();
        let ldd = String::from_utf8_lossy(&ldd.stdout);
        let found = ldd
            .lines()
            .find(|l| l.contains("libnvshmem_host.so.3 =>"))
            .and_then(|l| l.split("=> ").nth(1))
            .and_then(|l| l.split(" (").next())
            .and_then(|p| Path::new(p.trim()).canonicalize().ok());
        assert_eq!(
            found,
            Some(lib.join("libnvshmem_host.so.3").canonicalize().unwrap()),
            "{ldd}"
        );
    }

    /// One of the two builds: where everything is, and what is set.
    struct Variant {
        at: PathBuf,
        root: PathBuf,
        prefix: PathBuf,
        toolchain: PathBuf,
        cargo_home: PathBuf,
        jobs: &'static str,
        tz: &'static str,
        lang: &'static str,
        umask: libc::mode_t,
        stray_flags: bool,
        epoch: u32,
    }

    impl Variant {
        /// A copy of the workspace, NVSHMEM where another machine's store would have it,
        /// the toolchain behind another path, another CARGO_HOME (links to this one's
        /// contents) under `at`.
        fn new(at: PathBuf, nvshmem: &Path, toolchain: &Path, cargo_home: &Path) -> Variant {
            let root = at.join("checkout");
            crate::workspace::copy_workspace(&crate::workspace::workspace_root(), &root).unwrap();
            let prefix = at.join("store/nvshmem");
            std::fs::create_dir_all(prefix.join("lib")).unwrap();
            commstack_archive::copy_tree(&nvshmem.join("include"), &prefix.join("include"))
                .unwrap();
            for lib in ["libnvshmem_device.a", "libnvshmem_host.so.3"] {
                std::fs::copy(nvshmem.join("lib").join(lib), prefix.join("lib").join(lib)).unwrap();
            }
            let link = at.join("toolchain");
            std::os::unix::fs::symlink(toolchain, &link).unwrap();
            let home = at.join("cargo-home");
            std::fs::create_dir_all(&home).unwrap();
            for entry in std::fs::read_dir(cargo_home).unwrap() {
                let entry = entry.unwrap();
                std::os::unix::fs::symlink(entry.path(), home.join(entry.file_name())).unwrap();
            }
            Variant {
                at,
                root,
                prefix,
                toolchain: link,
                cargo_home: home,
                jobs: "1",
                tz: "UTC",
                lang: "C",
                umask: 0o022,
                stray_flags: false,
                epoch: 1_700_000_000,
            }
        }

        /// This variant's environment and umask, in this process.
        fn enter(&self) {
            // SAFETY: this test runs alone (`--exact`, as the xtask runs it): no other
            // thread reads the environment meanwhile.
            unsafe {
                std::env::set_var("CARGO_HOME", &self.cargo_home);
                std::env::set_var("CARGO_TARGET_DIR", self.at.join("target"));
                std::env::set_var("CARGO_BUILD_JOBS", self.jobs);
                std::env::set_var("TZ", self.tz);
                std::env::set_var("LANG", self.lang);
                std::env::set_var("SOURCE_DATE_EPOCH", self.epoch.to_string());
                // What the build must not pass on: each would change the bytes.
                for (var, value) in [
                    ("RUSTFLAGS", "-C debuginfo=2"),
                    ("NVCC_APPEND_FLAGS", "-lineinfo"),
                    ("CFLAGS", "-g3"),
                ] {
                    match self.stray_flags {
                        true => std::env::set_var(var, value),
                        false => std::env::remove_var(var),
                    }
                }
                libc::umask(self.umask);
            }
        }

        fn store(&self) -> Store {
            Store::open(self.at.join("home/store")).unwrap()
        }
    }

    /// Our two binaries, each built twice from two copies of the sources at different
    /// paths, with different stores, target directories, CARGO_HOMEs, toolchain and NVSHMEM
    /// locations, jobs, time zones, locales, umasks, SOURCE_DATE_EPOCHs and stray compiler
    /// flags, have the same keys and give the same bytes, naming none of those paths; the
    /// self-test's RUNPATH finds NVSHMEM where the image has it.
    #[test]
    #[ignore = "four release builds, two with nvcc (minutes): `cargo xtask build kernels --test` runs it, with COMMSTACK_NVCC and NVSHMEM_HOME set"]
    fn own_tools_build_byte_for_byte() {
        let need = |var: &str| {
            PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
                panic!("{var} is not set: run this through `cargo xtask build kernels --test`")
            }))
        };
        let (nvcc, nvshmem) = (need("COMMSTACK_NVCC"), need("NVSHMEM_HOME"));
        let archs: Vec<CudaArch> = std::env::var("COMMSTACK_CUDA_ARCHS")
            .unwrap_or_else(|_| "90".into())
            .split(';')
            .map(|a| a.parse().unwrap())
            .collect();
        let real_cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| dirs::home_dir().unwrap().join(".cargo"));
        let cuda = CudaToolkit::of(&nvcc).unwrap();
        // Where an image of a Python 3.11 base has the drop-in NVSHMEM, from its tools.
        let runpath = "$ORIGIN/../venv/lib/python3.11/site-packages/nvidia/nvshmem/lib".to_string();
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let new =
            |dir: &str| Variant::new(t.join(dir), &nvshmem, &cuda.link_target, &real_cargo_home);
        let variants = [
            new("a"),
            Variant {
                jobs: "2",
                tz: "Asia/Kolkata",
                lang: "de_DE.UTF-8",
                umask: 0o077,
                stray_flags: true,
                epoch: 1_800_000_000,
                ..new("b/some/deeper/place")
            },
        ];
        let mut places = vec![
            crate::workspace::workspace_root(),
            real_cargo_home.canonicalize().unwrap(),
            cuda.link_target.canonicalize().unwrap(),
            nvshmem.canonicalize().unwrap(),
            t.to_path_buf(),
        ];
        for v in &variants {
            places.extend([
                v.root.clone(),
                v.prefix.clone(),
                v.toolchain.clone(),
                v.cargo_home.clone(),
                v.at.join("home"),
            ]);
        }
        let nvshmem_of = |v: &Variant| NvshmemForKernels {
            prefix: v.prefix.clone(),
            describe: format!("a copy of {}", nvshmem.display()),
        };

        // The same inputs give the same keys: another machine finds the steps by them.
        let mut keys = Vec::new();
        for v in &variants {
            v.enter();
            let n = nvshmem_of(v);
            let b = SelftestBuild {
                root: &v.root,
                nvcc: &v.toolchain.join(&cuda.nvcc_in_link),
                nvshmem: &n,
                archs: &archs,
                runpath: vec![runpath.clone()],
                force: false,
            };
            keys.push((
                tool_key(&selftest_recipe(&b).unwrap()).unwrap(),
                tool_key(&crate::verify::verify_recipe(&v.root, false)).unwrap(),
            ));
        }
        for which in 0..2 {
            let pick =
                |k: &((StepKey, serde_json::Value), (StepKey, serde_json::Value))| match which {
                    0 => k.0.clone(),
                    _ => k.1.clone(),
                };
            let (a, b) = (pick(&keys[0]), pick(&keys[1]));
            assert_eq!(
                a.0,
                b.0,
                "the keys differ:\n{}\n{}",
                serde_json::to_string_pretty(&a.1).unwrap(),
                serde_json::to_string_pretty(&b.1).unwrap()
            );
        }

        let mut shas: Vec<(String, String)> = Vec::new();
        for (i, v) in variants.iter().enumerate() {
            v.enter();
            let store = v.store();
            let n = nvshmem_of(v);
            let selftest = selftest_step(
                &store,
                Some(&|l: &str| eprintln!("{l}")),
                &SelftestBuild {
                    root: &v.root,
                    nvcc: &v.toolchain.join(&cuda.nvcc_in_link),
                    nvshmem: &n,
                    archs: &archs,
                    runpath: vec![runpath.clone()],
                    force: false,
                },
            )
            .unwrap();
            let verify = crate::verify::build_verify_tool(
                &store,
                Some(&|l: &str| eprintln!("{l}")),
                &v.root,
                false,
            )
            .unwrap();
            unsafe { libc::umask(0o022) };
            assert!(!selftest.cached && !verify.cached, "a fresh store builds");
            eprintln!(
                "build {i}: commstack-selftest sha256 {}, commstack-verify sha256 {}",
                selftest.sha256, verify.sha256
            );
            shas.push((selftest.sha256.clone(), verify.sha256.clone()));
            let fixed = crate::build::tool_build_dir("commstack-selftest");
            assert_names_no_path(&selftest.path, &places, Some(&fixed));
            assert_names_no_path(&verify.path, &places, None);
            assert_finds_nvshmem_in_the_image(
                &selftest.path,
                &runpath,
                &v.prefix,
                &v.at.join("image"),
            );
        }
        assert_eq!(shas[0], shas[1], "two builds of the same inputs differ");
    }
}
