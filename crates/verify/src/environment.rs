//! The environment being verified, and the key its report is filed under: the Python
//! interpreter, its site-packages, and a hash of the files that make up the stack.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use walkdir::WalkDir;

use crate::process::{Exit, run_captured};
use commstack_digest::sha256_file;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PythonEnv {
    /// As given on the command line.
    pub python: PathBuf,
    pub executable: PathBuf,
    pub version: String,
    pub prefix: PathBuf,
    /// purelib and platlib, without duplicates.
    pub site_packages: Vec<PathBuf>,
}

const DESCRIBE: &str = "import json, sys, sysconfig\n\
p = sysconfig.get_paths()\n\
print(json.dumps({'executable': sys.executable, 'version': sys.version.split()[0], 'prefix': sys.prefix, \
'site_packages': list(dict.fromkeys([p['purelib'], p['platlib']]))}))";

impl PythonEnv {
    /// Asks `python` where it lives and where its packages are.
    pub fn describe(python: &Path) -> Result<PythonEnv> {
        let mut cmd = Command::new(python);
        cmd.args(["-c", DESCRIBE]);
        let out = run_captured(cmd, Duration::from_secs(60))
            .with_context(|| format!("running {}", python.display()))?;
        let text: Vec<&str> = out.lines.iter().map(|l| l.text.as_str()).collect();
        if out.exit != (Exit::Code { code: 0 }) {
            bail!(out.failed(&format!("{} (asked where it lives)", python.display())));
        }
        #[derive(Deserialize)]
        struct Described {
            executable: PathBuf,
            version: String,
            prefix: PathBuf,
            site_packages: Vec<PathBuf>,
        }
        let json = text
            .iter()
            .rev()
            .find(|l| l.starts_with('{'))
            .context("no answer from the interpreter")?;
        let d: Described = serde_json::from_str(json)
            .with_context(|| format!("{} answered `{json}`", python.display()))?;
        Ok(PythonEnv {
            python: python.to_path_buf(),
            executable: d.executable,
            version: d.version,
            prefix: d.prefix,
            site_packages: d.site_packages.into_iter().filter(|p| p.is_dir()).collect(),
        })
    }
}

/// A file that went into the environment key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeyFile {
    pub path: PathBuf,
    pub sha256: String,
}

/// What the report is filed under.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EnvironmentKey {
    /// 16 hex digits of the sha256 over the interpreter and `files`.
    pub id: String,
    pub files: Vec<KeyFile>,
}

/// The distributions whose RECORD files (each lists the sha256 of every installed file)
/// stand for the stack, and the libraries hashed byte for byte because a drop-in install
/// may replace them without touching any RECORD.
fn is_key_file(rel: &Path) -> bool {
    let s = rel.to_string_lossy();
    let name = rel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stack_dist = ["torch-", "nvidia_", "deep_ep", "triton-"]
        .iter()
        .any(|p| s.starts_with(p));
    (stack_dist && s.contains(".dist-info/") && name == "RECORD")
        || name.starts_with("libnvshmem_host.so")
        || name.starts_with("libnccl.so")
        || (name.starts_with("deep_ep_cpp") && name.ends_with(".so"))
}

/// Hashes the key files of every site-packages directory.
pub fn environment_key(env: &PythonEnv) -> Result<EnvironmentKey> {
    let mut files = Vec::new();
    for site in &env.site_packages {
        for entry in WalkDir::new(site)
            .follow_links(false)
            .sort_by_file_name()
            .max_depth(4)
        {
            let entry = entry.with_context(|| format!("walking {}", site.display()))?;
            let rel = entry.path().strip_prefix(site).unwrap_or(entry.path());
            if entry.file_type().is_file() && is_key_file(rel) {
                files.push(KeyFile {
                    path: entry.path().to_path_buf(),
                    sha256: sha256_file(entry.path())?,
                });
            }
        }
    }
    let mut all = Sha256::new();
    all.update(env.executable.to_string_lossy().as_bytes());
    all.update(b"\0");
    all.update(env.version.as_bytes());
    for f in &files {
        all.update(b"\0");
        all.update(f.path.to_string_lossy().as_bytes());
        all.update(b"\0");
        all.update(f.sha256.as_bytes());
    }
    let id = hex::encode(all.finalize())[..16].to_string();
    Ok(EnvironmentKey { id, files })
}
