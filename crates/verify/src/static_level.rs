//! The static level (no GPU): every shared object of the stack in an environment's
//! site-packages, read with the ELF library.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::check::{Check, Status, overall};
use crate::expect::Expectations;
use crate::facts::{FileFacts, file_facts, map_whole, wanted};
use commstack_elf::{DeviceCode, DottedVersion, LibraryTree, TreeLibrary};

/// The newest symbol versions one library needs.
#[derive(Debug, Clone, Serialize)]
pub struct LibraryNeeds {
    pub path: PathBuf,
    pub glibc: Option<DottedVersion>,
    pub glibcxx: Option<DottedVersion>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StaticFindings {
    pub roots: Vec<PathBuf>,
    /// How many shared objects of the stack were read.
    pub libraries: usize,
    pub needs: Vec<LibraryNeeds>,
    pub device_code: Vec<DeviceCode>,
    pub checks: Vec<Check>,
}

impl StaticFindings {
    pub fn status(&self) -> Status {
        overall(&self.checks)
    }
}

/// Libraries that belong to the stack: torch's, NVIDIA's wheels (NVSHMEM, NCCL, CUDA),
/// DeepEP's. Other packages of an adopted environment are not ours to judge.
pub fn is_stack_library(root: &Path, path: &Path) -> bool {
    let rel = path
        .strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned();
    rel.starts_with("torch/") || rel.starts_with("nvidia/") || rel.starts_with("deep_ep")
}

/// The environment as the checks see it: the libraries under each root and the facts of
/// every file they look at, read from directories here ([`gather_dirs`]) or from an
/// image's layers ([`crate::layers::ImageFiles::gather`]).
pub struct Gathered<'a> {
    pub roots: Vec<PathBuf>,
    pub trees: Vec<LibraryTree>,
    /// The facts of each file of the roots that the checks read.
    pub facts: BTreeMap<PathBuf, FileFacts>,
    /// Why a root could not be walked.
    pub unwalkable: Vec<String>,
    /// Whether a path is a file of the environment, following symbolic links (for
    /// DT_NEEDED resolution, which also looks outside the roots).
    pub is_file: Box<dyn Fn(&Path) -> bool + 'a>,
}

/// Reads `roots` (site-packages directories of this machine).
pub fn gather_dirs(roots: &[PathBuf]) -> Gathered<'static> {
    let mut gathered = Gathered {
        roots: roots.to_vec(),
        trees: Vec::new(),
        facts: BTreeMap::new(),
        unwalkable: Vec::new(),
        is_file: Box::new(|p: &Path| p.is_file()),
    };
    for root in roots {
        match walk_dir(root, &mut gathered.facts) {
            Ok(tree) => gathered.trees.push(tree),
            Err(e) => gathered.unwalkable.push(e),
        }
    }
    gathered
}

/// Every file of `root` the checks read (not following symbolic links; a second hard
/// link to a file is not a copy), its facts into `facts`; the root's libraries.
fn walk_dir(root: &Path, facts: &mut BTreeMap<PathBuf, FileFacts>) -> Result<LibraryTree, String> {
    let mut seen_inodes = std::collections::HashSet::new();
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry
            .map_err(|e| format!("cannot read {}: {e}", e.path().unwrap_or(root).display()))?;
        if !entry.file_type().is_file() || !wanted(entry.path()) {
            continue;
        }
        let meta = entry
            .metadata()
            .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
        if !seen_inodes.insert((meta.dev(), meta.ino())) {
            continue;
        }
        let path = entry.path().to_path_buf();
        let data = map_whole(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if let Some(f) = file_facts(&path, &data) {
            files.push(path.clone());
            facts.insert(path, f);
        }
    }
    Ok(tree_of(
        root,
        files.iter().map(|p| (p.as_path(), &facts[p])),
    ))
}

/// The libraries of `root` from the facts of its files (in the order given).
pub fn tree_of<'f>(
    root: &Path,
    files: impl Iterator<Item = (&'f Path, &'f FileFacts)>,
) -> LibraryTree {
    let mut tree = LibraryTree {
        root: root.to_path_buf(),
        libraries: Vec::new(),
        unreadable: Vec::new(),
    };
    for (path, f) in files {
        match &f.library {
            Some(Ok(l)) => tree.libraries.push(TreeLibrary {
                path: path.to_path_buf(),
                name: l.name.clone(),
                dynamic: l.dynamic.clone(),
            }),
            Some(Err(why)) => tree.unreadable.push((path.to_path_buf(), why.clone())),
            None => {}
        }
    }
    tree
}

/// Runs every static check over `roots` (site-packages directories of this machine).
pub fn check_static(roots: &[PathBuf], expect: &Expectations) -> StaticFindings {
    check_gathered(&gather_dirs(roots), expect)
}

/// Runs every static check over what was gathered.
pub fn check_gathered(env: &Gathered<'_>, expect: &Expectations) -> StaticFindings {
    let mut checks = Vec::new();
    let mut libs: Vec<(PathBuf, TreeLibrary)> = Vec::new();
    for why in &env.unwalkable {
        checks.push(Check::fail(
            "static.readable",
            why.clone(),
            "check the path and its permissions",
        ));
    }
    for tree in &env.trees {
        let root = &tree.root;
        for (path, why) in &tree.unreadable {
            if is_stack_library(root, path) {
                checks.push(Check::fail(
                    "static.readable",
                    format!("{}: {why}", path.display()),
                    "reinstall the package that owns this file",
                ));
            }
        }
        libs.extend(
            tree.libraries
                .iter()
                .filter(|l| is_stack_library(root, &l.path))
                .map(|l| (root.clone(), l.clone())),
        );
    }
    let stack: Vec<&TreeLibrary> = libs.iter().map(|(_, l)| l).collect();

    checks.extend(nvshmem_checks(&stack, &env.facts, expect));
    checks.extend(deepep_device_check(env, &stack));
    checks.extend(crate::libstdcxx::deepep_libstdcxx_checks(
        &stack, &env.facts,
    ));
    checks.extend(crate::deepep_links::deepep_links_checks(
        &stack,
        &expect.system_lib_dirs,
        &env.is_file,
    ));
    checks.extend(one_copy_checks(&stack, expect));
    checks.push(nccl_check(env, expect));
    checks.push(resolution_check(env, &libs, expect));
    let (needs, glibc_checks) = symbol_version_checks(&stack, &env.facts, expect);
    checks.extend(glibc_checks);
    let (device_code, device_checks) = device_code_checks(env, expect);
    checks.extend(device_checks);

    StaticFindings {
        roots: env.roots.clone(),
        libraries: stack.len(),
        needs,
        device_code,
        checks,
    }
}

fn nvshmem_checks(
    stack: &[&TreeLibrary],
    facts: &BTreeMap<PathBuf, FileFacts>,
    expect: &Expectations,
) -> Vec<Check> {
    let hosts: Vec<&&TreeLibrary> = stack
        .iter()
        .filter(|l| l.name.starts_with("libnvshmem_host"))
        .collect();
    if hosts.is_empty() {
        let status = if expect.nvshmem_version.is_some() || expect.nvshmem_prefix.is_some() {
            Check::fail(
                "static.nvshmem-host.build-vars",
                "no libnvshmem_host in the environment",
                "install the stack's NVSHMEM drop-in wheel",
            )
        } else {
            Check::not_run(
                "static.nvshmem-host.build-vars",
                "no libnvshmem_host in the environment",
            )
        };
        return vec![status];
    }
    let mut checks = Vec::new();
    for lib in hosts {
        let path = &lib.path;
        let Some(host) = facts.get(path).and_then(|f| f.nvshmem_host.as_ref()) else {
            checks.push(Check::fail(
                "static.nvshmem-host.build-vars",
                format!("{}: not read as an NVSHMEM host library", path.display()),
                "reinstall NVSHMEM",
            ));
            continue;
        };
        match &host.info {
            Ok(info) => {
                let check = info.build_vars.check(&expect.nvshmem_build_vars);
                let version = info
                    .version
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "?".into());
                checks.push(if check.passed() {
                    Check::pass("static.nvshmem-host.build-vars", format!("{}: NVSHMEM {version}, NVSHMEM_USE_NCCL=OFF and every expected option", path.display()))
                } else {
                    let list: Vec<String> = check.mismatches.iter().map(|m| m.to_string()).collect();
                    Check::fail(
                        "static.nvshmem-host.build-vars",
                        format!("{} (NVSHMEM {version}): {}", path.display(), list.join("; ")),
                        "install the NVSHMEM built by `cargo xtask build nvshmem` (the drop-in wheel) in place of this one",
                    )
                });
                if let Some(want) = expect.nvshmem_version {
                    checks.push(match info.version {
                        Some(v) if v == want => {
                            Check::pass("static.nvshmem-host.version", format!("{v}"))
                        }
                        other => Check::fail(
                            "static.nvshmem-host.version",
                            format!(
                                "{} is NVSHMEM {}; the stack expects {want}",
                                path.display(),
                                other.map(|v| v.to_string()).unwrap_or_else(|| "?".into())
                            ),
                            "install the NVSHMEM the lock pins",
                        ),
                    });
                }
            }
            Err(e) => checks.push(Check::fail(
                "static.nvshmem-host.build-vars",
                e.clone(),
                "this is not an NVSHMEM host library the stack built",
            )),
        }
        checks.push(match &host.libnccl {
            Ok(hits) if hits.is_empty() => Check::pass("static.nvshmem-host.no-libnccl", format!("{}: no `libnccl` in any byte", path.display())),
            Ok(hits) => Check::fail(
                "static.nvshmem-host.no-libnccl",
                format!(
                    "{} names NCCL {} time(s): {} (it can dlopen NCCL without any DT_NEEDED)",
                    path.display(),
                    hits.len(),
                    hits.iter().map(|h| format!("`{}` in {} at {:#x}", h.context, h.section.as_deref().unwrap_or("no section"), h.offset)).collect::<Vec<_>>().join(", ")
                ),
                "build NVSHMEM with NVSHMEM_USE_NCCL=OFF (`cargo xtask build nvshmem`) and install that",
            ),
            Err(e) => Check::fail("static.nvshmem-host.no-libnccl", e.clone(), "reinstall NVSHMEM"),
        });
    }
    checks
}

/// What `cargo xtask build deepep` records in DeepEP's wheel (`commstack-build.json`).
#[derive(serde::Deserialize)]
struct DeepEpRecord {
    nvshmem: DeepEpNvshmem,
}

#[derive(serde::Deserialize)]
struct DeepEpNvshmem {
    version: Option<String>,
    device_library_sha256: String,
}

const DEEPEP_DEVICE: &str = "static.deepep.nvshmem-device";

/// DeepEP V1 links NVSHMEM's device library into its extension; that device code must run
/// with a host library of the same build (a 3.4.5 device with a 3.6.5 host hung NeMo's
/// nodes; SGLang hit "device library version does not match host library version"). The
/// device code's payload is compressed, so the proof is the build's record in the wheel:
/// the device library it linked (sha256) must be the one beside the environment's
/// libnvshmem_host, and its version the host's.
/// No check when no DeepEP extension links libnvshmem_host (none installed, or DeepEP V2,
/// which uses NCCL's device API and links no NVSHMEM device code).
fn deepep_device_check(env: &Gathered<'_>, stack: &[&TreeLibrary]) -> Option<Check> {
    let links_nvshmem = stack.iter().any(|l| {
        l.path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("deep_ep_cpp"))
            && l.dynamic
                .needed
                .iter()
                .any(|n| n.starts_with("libnvshmem_host"))
    });
    if !links_nvshmem {
        return None;
    }
    // `<root>/deep_ep-<version>.dist-info/commstack-build.json`
    let record = env.facts.iter().find(|(p, f)| {
        f.build_record.is_some()
            && p.parent().is_some_and(|d| {
                env.roots.iter().any(|r| d.parent() == Some(r.as_path()))
                    && d.file_name().is_some_and(|n| {
                        let n = n.to_string_lossy();
                        n.starts_with("deep_ep-") && n.ends_with(".dist-info")
                    })
            })
    });
    Some(match record {
        Some((path, f)) => deepep_device_record_check(
            path,
            f.build_record.as_deref().unwrap_or_default(),
            &env.facts,
            stack,
        ),
        None => Check::not_run_fix(
            DEEPEP_DEVICE,
            "a deep_ep_cpp extension links libnvshmem_host but no deep_ep-*.dist-info/commstack-build.json says how it was built (a DeepEP not built by commstack, or by an older one)",
            "install DeepEP from the wheel `cargo xtask build deepep` makes",
        ),
    })
}

fn deepep_device_record_check(
    path: &Path,
    text: &str,
    facts: &BTreeMap<PathBuf, FileFacts>,
    stack: &[&TreeLibrary],
) -> Check {
    let record: DeepEpRecord = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            return Check::not_run_fix(
                DEEPEP_DEVICE,
                format!(
                    "{}: {e} (a DeepEP not built by commstack, or by an older one)",
                    path.display()
                ),
                "build DeepEP with `cargo xtask build deepep` and install that wheel",
            );
        }
    };
    let Some(host) = stack.iter().find(|l| l.name.starts_with("libnvshmem_host")) else {
        return Check::fail(
            DEEPEP_DEVICE,
            "DeepEP is installed but no libnvshmem_host is in the environment",
            "install the stack's NVSHMEM drop-in wheel",
        );
    };
    let device = host.path.with_file_name("libnvshmem_device.a");
    let host_version = facts
        .get(&host.path)
        .and_then(|f| f.nvshmem_host.as_ref())
        .and_then(|h| h.info.as_ref().ok())
        .and_then(|i| i.version)
        .map(|v| v.to_string());
    let device_sha = facts
        .get(&device)
        .and_then(|f| f.device.as_ref())
        .map(|d| d.sha256.clone());
    let r = &record.nvshmem;
    if device_sha.as_deref() == Some(r.device_library_sha256.as_str())
        && r.version.is_some()
        && r.version == host_version
    {
        Check::pass(
            DEEPEP_DEVICE,
            format!(
                "DeepEP's device code was linked from {} (sha256 {}), beside the host library {} (NVSHMEM {})",
                device.display(),
                &r.device_library_sha256[..12],
                host.path.display(),
                host_version.as_deref().unwrap_or("?")
            ),
        )
    } else {
        Check::fail(
            DEEPEP_DEVICE,
            format!(
                "DeepEP was built against NVSHMEM {} (device library sha256 {}); the environment has {} NVSHMEM {} with device library {}",
                r.version.as_deref().unwrap_or("?"),
                &r.device_library_sha256[..12.min(r.device_library_sha256.len())],
                host.path.display(),
                host_version.as_deref().unwrap_or("?"),
                device_sha.as_deref().map_or_else(
                    || format!("absent ({})", device.display()),
                    |s| format!("sha256 {}", &s[..12])
                )
            ),
            "install the NVSHMEM drop-in wheel made from the NVSHMEM build DeepEP was built against (`cargo xtask build deepep` makes both)",
        )
    }
}

fn one_copy_checks(stack: &[&TreeLibrary], expect: &Expectations) -> Vec<Check> {
    expect
        .shipped_sonames
        .iter()
        .map(|soname| {
            let name = format!("static.one-copy.{soname}");
            let copies: Vec<String> = stack.iter().filter(|l| &l.name == soname).map(|l| l.path.display().to_string()).collect();
            match copies.len() {
                1 => Check::pass(&name, copies[0].clone()),
                0 => Check::fail(&name, format!("no {soname} in the environment"), "install the stack's wheelhouse"),
                n => Check::fail(
                    &name,
                    format!("{n} copies of {soname}: {}; the first one loaded wins for every library that needs it by SONAME", copies.join(", ")),
                    "uninstall the extra package (pip uninstall the wheel that brought the second copy)",
                ),
            }
        })
        .collect()
}

const NCCL_ONE: &str = "static.nccl.one";

/// Exactly one NCCL in the environment, of the locked release: every ELF library under the
/// roots named `libnccl.so*` (by file name or SONAME), whatever package brought it (not
/// only torch's and NVIDIA's: a second NCCL from anywhere is loaded beside torch's, or
/// replaces it, DeepEP issue 710). Its release is read from the library's own bytes (the
/// `NCCL version 2.28.9+cuda13.0` string NCCL prints at init), not from a wheel's RECORD:
/// the file is what gets loaded, and a RECORD still names the version of a file replaced
/// under it (or of no file, for a library not installed by pip).
fn nccl_check(env: &Gathered<'_>, expect: &Expectations) -> Check {
    let is_nccl = |l: &TreeLibrary| {
        l.name.starts_with("libnccl.so")
            || l.path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libnccl.so"))
    };
    let found: Vec<(&Path, &str, Option<&str>)> = env
        .trees
        .iter()
        .flat_map(|t| t.libraries.iter())
        .filter(|l| is_nccl(l))
        .map(|l| {
            let version = env.facts.get(&l.path).and_then(|f| f.nccl.as_ref());
            let version = version.and_then(|n| n.version.as_deref());
            (l.path.as_path(), l.name.as_str(), version)
        })
        .collect();
    let named: Vec<String> = found
        .iter()
        .map(|(p, _, v)| format!("{} (NCCL {})", p.display(), v.unwrap_or("?")))
        .collect();
    let want = expect.nccl_version;
    match (found.as_slice(), want) {
        // torch loads NCCL by this SONAME (rule nccl-soname decided it for the wheel).
        ([(path, soname, _)], _) if *soname != "libnccl.so.2" => Check::fail(
            NCCL_ONE,
            format!(
                "{}'s SONAME is {soname}, not libnccl.so.2: torch cannot load it as its NCCL",
                path.display()
            ),
            "install the nvidia-nccl wheel requirements.lock pins (rule nccl-soname refuses an override of another soname)",
        ),
        ([], None) => Check::not_run(NCCL_ONE, "no libnccl.so* in the environment"),
        ([], Some(want)) => Check::fail(
            NCCL_ONE,
            format!("no libnccl.so* in the environment; the lock pins NCCL {want}"),
            "install the stack's wheelhouse (requirements.lock holds the nvidia-nccl wheel)",
        ),
        ([_], None) => Check::not_run_fix(
            NCCL_ONE,
            format!("one NCCL: {}; no expected version given", named[0]),
            "pass the stack's NCCL version (or verify against a lock)",
        ),
        ([(path, _, version)], Some(want)) => match version.map(|v| v == want.to_string()) {
            Some(true) => Check::pass(
                NCCL_ONE,
                format!(
                    "one NCCL: {}, the locked release (its version string)",
                    named[0]
                ),
            ),
            Some(false) => Check::fail(
                NCCL_ONE,
                format!(
                    "{} is NCCL {}; the lock pins NCCL {want}",
                    path.display(),
                    version.unwrap_or("?")
                ),
                "install the nvidia-nccl wheel requirements.lock pins in place of it (`[nccl] version` in stack.toml decides which)",
            ),
            None => Check::fail(
                NCCL_ONE,
                format!(
                    "{} has no `NCCL version X.Y.Z` string: its release cannot be told; the lock pins NCCL {want}",
                    path.display()
                ),
                "install the nvidia-nccl wheel requirements.lock pins in place of it",
            ),
        },
        (more, _) => Check::fail(
            NCCL_ONE,
            format!(
                "{} NCCL libraries in the environment: {}; one process would load two NCCLs, or the first one loaded for both",
                more.len(),
                named.join(", ")
            ),
            "keep only the nvidia-nccl wheel requirements.lock pins: uninstall the package that brought each other one",
        ),
    }
}

fn resolution_check(
    env: &Gathered<'_>,
    libs: &[(PathBuf, TreeLibrary)],
    expect: &Expectations,
) -> Check {
    // Hard: nothing in the environment provides the library. Soft: a copy is in the
    // environment but the library's own RUNPATH does not lead to it: torch extensions
    // (deep_ep_cpp needs libc10.so, libtorch_python.so) and NVIDIA's CUDA wheels
    // (libcusolverMg needs libcublas) rely on `import torch` loading those first. The
    // runtime level proves what really gets loaded.
    let mut hard = Vec::new();
    let mut soft = Vec::new();
    for tree in &env.trees {
        for u in tree.unresolved_with(
            &expect.system_lib_dirs,
            &expect.host_provided_sonames,
            &env.is_file,
        ) {
            if !libs.iter().any(|(_, l)| l.path == u.library) {
                continue;
            }
            let path = u.library.display().to_string();
            match u.elsewhere_in_tree.first() {
                Some(copy) => soft.push(format!(
                    "{path} needs {} (in the environment: {})",
                    u.needed,
                    copy.display()
                )),
                None => hard.push(format!(
                    "{path} needs {}: no library in the environment provides it",
                    u.needed
                )),
            }
        }
    }
    let soft_note = if soft.is_empty() {
        String::new()
    } else {
        format!(
            "; {} rely on `import torch` loading their dependency first: {}",
            soft.len(),
            soft.join("; ")
        )
    };
    if hard.is_empty() {
        Check::pass(
            "static.needed-resolve",
            format!(
                "every DT_NEEDED of {} stack libraries resolves{soft_note}",
                libs.len()
            ),
        )
    } else {
        Check::fail(
            "static.needed-resolve",
            format!("{} unresolved: {}{soft_note}", hard.len(), hard.join("; ")),
            "install the package that ships each missing library, or fix the RUNPATH of the library that needs it",
        )
    }
}

fn symbol_version_checks(
    stack: &[&TreeLibrary],
    facts: &BTreeMap<PathBuf, FileFacts>,
    expect: &Expectations,
) -> (Vec<LibraryNeeds>, Vec<Check>) {
    let needs: Vec<LibraryNeeds> = stack
        .iter()
        .filter_map(|l| {
            let f = facts.get(&l.path)?.library.as_ref()?.as_ref().ok()?;
            f.versions_readable.then(|| LibraryNeeds {
                path: l.path.clone(),
                glibc: f.glibc.clone(),
                glibcxx: f.glibcxx.clone(),
            })
        })
        .collect();
    let mut checks = Vec::new();
    for (what, target, pick) in [
        (
            "glibc",
            &expect.target_glibc,
            (|n: &LibraryNeeds| n.glibc.clone()) as fn(&LibraryNeeds) -> Option<DottedVersion>,
        ),
        ("glibcxx", &expect.target_glibcxx, |n: &LibraryNeeds| {
            n.glibcxx.clone()
        }),
    ] {
        let name = format!("static.{what}");
        let newest = needs
            .iter()
            .filter_map(|n| Some((pick(n)?, &n.path)))
            .max_by(|a, b| a.0.cmp(&b.0));
        let Some((newest_v, newest_at)) = newest else {
            checks.push(Check::pass(
                &name,
                format!("no library needs a versioned {what} symbol"),
            ));
            continue;
        };
        checks.push(match target {
            None => Check::not_run_fix(
                &name,
                format!(
                    "newest {what} needed: {newest_v} ({}); no target version given",
                    newest_at.display()
                ),
                format!("pass the target's {what} version (or verify against a stack lock)"),
            ),
            Some(t) => {
                let over: Vec<String> = needs
                    .iter()
                    .filter_map(|n| Some((pick(n)?, &n.path)))
                    .filter(|(v, _)| v > t)
                    .map(|(v, p)| format!("{} needs {v}", p.display()))
                    .collect();
                if over.is_empty() {
                    Check::pass(
                        &name,
                        format!("newest {what} needed: {newest_v} <= target {t}"),
                    )
                } else {
                    Check::fail(
                        &name,
                        format!("the target has {what} {t}, but {}", over.join("; ")),
                        format!("build these libraries on (or for) a system with {what} <= {t}"),
                    )
                }
            }
        });
    }
    (needs, checks)
}

fn device_code_checks(env: &Gathered<'_>, expect: &Expectations) -> (Vec<DeviceCode>, Vec<Check>) {
    let mut found = Vec::new();
    let mut checks = Vec::new();
    // libnvshmem_device* at most 4 levels below a root (nvidia/nvshmem/lib/...).
    let near_a_root = |p: &Path| {
        env.roots.iter().any(|r| {
            p.strip_prefix(r)
                .is_ok_and(|rel| rel.components().count() <= 4)
        })
    };
    for (path, f) in &env.facts {
        let Some(device) = &f.device else { continue };
        if !near_a_root(path) {
            continue;
        }
        match &device.code {
            Ok(code) => found.push(code.clone()),
            Err(e) => checks.push(Check::fail(
                "static.nvshmem-device.archs",
                e.clone(),
                "reinstall NVSHMEM",
            )),
        }
    }
    for code in found.iter().filter(|c| !c.containers.is_empty()) {
        let sass: Vec<String> = code
            .sass_archs()
            .iter()
            .map(|a| format!("sm_{a}"))
            .collect();
        let ptx: Vec<String> = code
            .ptx_archs()
            .iter()
            .map(|a| format!("compute_{a}"))
            .collect();
        let seen = format!(
            "{}: SASS {} PTX {}",
            code.path.display(),
            sass.join(","),
            if ptx.is_empty() {
                "none".into()
            } else {
                ptx.join(",")
            }
        );
        checks.push(match &expect.cuda_archs {
            None => Check::not_run_fix(
                "static.nvshmem-device.archs",
                format!("{seen}; no expected archs given"),
                "pass the stack's CUDA archs (or verify against a lock)",
            ),
            Some(want) => {
                let missing: Vec<String> = want
                    .difference(&code.sass_archs())
                    .map(|a| format!("sm_{a}"))
                    .collect();
                if missing.is_empty() {
                    Check::pass("static.nvshmem-device.archs", seen)
                } else {
                    Check::fail(
                        "static.nvshmem-device.archs",
                        format!("{seen}; missing {}", missing.join(",")),
                        "rebuild NVSHMEM with those archs in CMAKE_CUDA_ARCHITECTURES",
                    )
                }
            }
        });
    }
    (found, checks)
}
