//! The NVSHMEM source the stack builds, read for its tables: from the locked archive as
//! it lies in the download cache (read in place, entry by entry, nothing written) or from
//! an unpacked tree.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_digest::terminal_safe;

use crate::nvshmem::{self, BuildOption, EnvDef};

/// The largest header or CMake file read (NVSHMEM 3.4.5's largest env_defs.h is 20 KiB).
const MAX_FILE: u64 = 1 << 20;
/// Entries of an archive looked through before it is taken for something else.
const MAX_ENTRIES: u64 = 500_000;

/// NVSHMEM's variables and build options, and where they were read.
#[derive(Clone, Debug)]
pub struct NvshmemTables {
    /// The archive or directory read.
    pub origin: PathBuf,
    /// The env_defs headers read, relative to the source root, in path order.
    pub headers: Vec<String>,
    pub env: Vec<EnvDef>,
    /// Empty when the source has no cmake_config/NVSHMEMEnv.cmake.
    pub build_options: Vec<BuildOption>,
}

fn wanted(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    (name.starts_with("env_defs") && name.ends_with(".h")) || rel == "cmake_config/NVSHMEMEnv.cmake"
}

/// Reads the tables from `path`: a `.tar.gz`/`.tar` archive of the source (one top
/// directory, as NVIDIA's tarball and `git archive --prefix` make it) or a directory.
pub fn read(path: &Path) -> Result<NvshmemTables> {
    let files = if path.is_dir() {
        from_dir(path)?
    } else {
        from_archive(path)?
    };
    tables(path, files)
}

/// The tables from `(path relative to the source root, text)` pairs.
pub fn tables(origin: &Path, mut files: Vec<(String, String)>) -> Result<NvshmemTables> {
    files.sort();
    let mut env = Vec::new();
    let mut headers = Vec::new();
    let mut build_options = Vec::new();
    for (rel, text) in &files {
        if rel.ends_with(".cmake") {
            build_options = nvshmem::build_options(rel, text);
        } else {
            env.extend(nvshmem::env_defs(rel, text)?);
            headers.push(rel.clone());
        }
    }
    if env.is_empty() {
        bail!(
            "{}: no NVSHMEMI_ENV_DEF entries in any env_defs*.h header: not an NVSHMEM source (3.x keeps them in src/include/host/env/env_defs.h and src/modules/*/common/env_defs.h)",
            terminal_safe(&origin.display().to_string())
        );
    }
    Ok(NvshmemTables {
        origin: origin.to_path_buf(),
        headers,
        env,
        build_options,
    })
}

fn from_dir(root: &Path) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for entry in walkdir::WalkDir::new(root).follow_links(false) {
        let entry =
            entry.with_context(|| format!("reading the NVSHMEM source {}", root.display()))?;
        if !entry.file_type().is_file() {
            continue;
        }
        let rel = entry
            .path()
            .strip_prefix(root)
            .expect("walkdir yields paths under its root")
            .to_string_lossy()
            .replace('\\', "/");
        if wanted(&rel) {
            let text = read_bounded(File::open(entry.path())?, &rel)?;
            out.push((rel, text));
        }
    }
    Ok(out)
}

fn from_archive(path: &Path) -> Result<Vec<(String, String)>> {
    let file = File::open(path).with_context(|| {
        format!(
            "cannot open the NVSHMEM source {}: give the locked archive or an unpacked source directory",
            path.display()
        )
    })?;
    let mut head = [0u8; 2];
    let gz = File::open(path)?.read_exact(&mut head).is_ok() && head == [0x1f, 0x8b];
    let reader: Box<dyn Read> = if gz {
        Box::new(flate2::read::GzDecoder::new(BufReader::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut archive = tar::Archive::new(reader);
    let mut out = Vec::new();
    let mut top: Option<String> = None;
    let entries = archive
        .entries()
        .with_context(|| format!("{} is not a tar archive", path.display()))?;
    for (n, entry) in entries.enumerate() {
        if n as u64 > MAX_ENTRIES {
            bail!(
                "{}: more than {MAX_ENTRIES} entries: not an NVSHMEM source archive",
                path.display()
            );
        }
        let entry = entry.with_context(|| format!("reading the archive {}", path.display()))?;
        let name = entry.path()?.to_string_lossy().into_owned();
        if name == "pax_global_header" || !entry.header().entry_type().is_file() {
            continue;
        }
        // The one top directory is the source root (nvshmem_src/ in NVIDIA's tarball).
        let Some((first, rel)) = name.trim_start_matches("./").split_once('/') else {
            continue;
        };
        match &top {
            None => top = Some(first.to_string()),
            Some(t) if t != first => bail!(
                "{}: entries under both {t:?} and {:?}: an NVSHMEM source archive has one top directory",
                path.display(),
                terminal_safe(first)
            ),
            Some(_) => {}
        }
        if wanted(rel) {
            let rel = rel.to_string();
            out.push((rel.clone(), read_bounded(entry, &rel)?));
        }
    }
    Ok(out)
}

fn read_bounded(reader: impl Read, rel: &str) -> Result<String> {
    let mut bytes = Vec::new();
    reader.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE {
        bail!(
            "{}: larger than {MAX_FILE} bytes: not an NVSHMEM header",
            terminal_safe(rel)
        );
    }
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8 text", terminal_safe(rel)))
}
