//! The workspace our tools are built from: where it is, what of it a build reads (copied
//! into the build directory), its sources' hash, and its identity (origin and commit).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Files of the workspace root a build reads besides the members (Cargo.toml and
/// Cargo.lock are in the sources hash).
pub(crate) const WORKSPACE_CONFIG: &[&str] = &[
    "rust-toolchain.toml",
    "rust-toolchain",
    ".cargo/config.toml",
    ".cargo/config",
];

/// The repository root (this crate lives at crates/tools).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/tools has a grandparent")
        .to_path_buf()
}

/// Where cargo puts what it builds for this workspace: CARGO_TARGET_DIR when set (relative
/// to the workspace root, as cargo reads it), else `<workspace>/target`.
pub fn cargo_target_dir() -> std::path::PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}

/// The workspace at `root` as cargo reads it, into `dest`: the root's Cargo.toml and
/// Cargo.lock, [`WORKSPACE_CONFIG`], and every member (cargo loads each member's manifest
/// even to build one), without their `target` directories.
pub fn copy_workspace(root: &Path, dest: &Path) -> Result<()> {
    let manifest = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let toml: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", manifest.display()))?;
    let patterns = toml
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .with_context(|| format!("{} has no [workspace] members", manifest.display()))?;
    let mut members = Vec::new();
    for pattern in patterns.iter().filter_map(|p| p.as_str()) {
        match pattern.strip_suffix("/*") {
            Some(parent) => {
                let dir = root.join(parent);
                let mut found: Vec<String> = std::fs::read_dir(&dir)
                    .with_context(|| format!("cannot read {}", dir.display()))?
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("Cargo.toml").is_file())
                    .map(|e| format!("{parent}/{}", e.file_name().to_string_lossy()))
                    .collect();
                found.sort();
                members.extend(found);
            }
            None if pattern.contains('*') => bail!(
                "{}: the member pattern {pattern:?} is not `dir` or `dir/*`, which is all the \
                 tool build copies",
                manifest.display()
            ),
            None => members.push(pattern.to_string()),
        }
    }
    std::fs::create_dir_all(dest).with_context(|| format!("cannot create {}", dest.display()))?;
    for file in ["Cargo.toml", "Cargo.lock"].iter().chain(WORKSPACE_CONFIG) {
        let from = root.join(file);
        if from.is_file() {
            let to = dest.join(file);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
        }
    }
    for member in &members {
        let to = dest.join(member);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        commstack_archive::copy_tree_except(&root.join(member), &to, |rel| {
            rel.file_name()
                .is_some_and(|n| n == "target" || n == ".git")
        })?;
    }
    Ok(())
}

/// sha256 over the sources of the crate in `dir` and of the workspace crates it depends
/// on (normal and build dependencies), with the workspace's Cargo.toml and Cargo.lock:
/// what a cargo build of it reads. Tests and benches are left out.
pub fn sources_hash(root: &Path, dir: &str) -> Result<String> {
    let mut dirs = std::collections::BTreeSet::new();
    let mut todo = vec![dir.to_string()];
    while let Some(d) = todo.pop() {
        if !dirs.insert(d.clone()) {
            continue;
        }
        let manifest = root.join(&d).join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .with_context(|| format!("cannot read {}", manifest.display()))?;
        let toml: toml::Table =
            toml::from_str(&text).with_context(|| format!("{} is not TOML", manifest.display()))?;
        for table in ["dependencies", "build-dependencies"] {
            let Some(deps) = toml.get(table).and_then(|t| t.as_table()) else {
                continue;
            };
            for name in deps.keys().filter_map(|n| n.strip_prefix("commstack-")) {
                todo.push(format!("crates/{name}"));
            }
        }
    }
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    // Each file as its path, its length and its bytes: no two trees hash alike.
    let mut add = |rel: &Path, bytes: &[u8]| {
        hasher.update(rel.to_string_lossy().as_bytes());
        hasher.update([0]);
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    for file in ["Cargo.toml", "Cargo.lock"] {
        add(Path::new(file), &std::fs::read(root.join(file))?);
    }
    for d in &dirs {
        let mut files: Vec<PathBuf> = Vec::new();
        for entry in walkdir::WalkDir::new(root.join(d))
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| {
                !matches!(e.file_name().to_str(), Some("tests" | "benches" | "target"))
            })
        {
            let entry = entry?;
            if entry.file_type().is_file() {
                files.push(entry.into_path());
            }
        }
        for f in files {
            let bytes =
                std::fs::read(&f).with_context(|| format!("cannot read {}", f.display()))?;
            add(f.strip_prefix(root).unwrap_or(&f), &bytes);
        }
    }
    Ok(hex::encode(hasher.finalize()))
}

/// The repository's origin URL (credentials removed; a local path or another non-URL
/// origin is left out: it names a host's directory) and commit, for the image's labels.
pub fn git_identity() -> (String, String) {
    let git = |args: &[&str]| -> String {
        Command::new("git")
            .args(args)
            .current_dir(workspace_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let origin = url::Url::parse(&git(&["remote", "get-url", "origin"]))
        .ok()
        .filter(|u| matches!(u.scheme(), "https" | "http" | "ssh" | "git"))
        .map(|mut u| {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        })
        .unwrap_or_default();
    (origin, git(&["rev-parse", "HEAD"]))
}
