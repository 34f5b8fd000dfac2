//! Open a wheel, read its `.dist-info` files, and verify RECORD against the archive.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use pep440_rs::Version;
use sha2::{Digest, Sha256};
use zip::ZipArchive;

use crate::headers::Headers;
use crate::name::{WheelFilename, normalize_name, parse_version};
use crate::record::{RecordEntry, format_sha256, parse_record};

/// The most bytes of a `.dist-info` file (METADATA, WHEEL, RECORD) [`Wheel::open`] reads
/// into memory: torch 2.14.1's RECORD, for 13,043 files, is 1.3 MB (its central directory,
/// read from PyPI), its METADATA 38 KB.
pub const DIST_INFO_MAX: u64 = 64 << 20;

/// One entry of the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WheelEntry {
    pub path: String,
    pub size: u64,
    /// Unix mode bits if the archive recorded them.
    pub mode: Option<u32>,
    pub is_dir: bool,
    pub is_symlink: bool,
}

impl WheelEntry {
    pub fn is_executable(&self) -> bool {
        self.mode.is_some_and(|m| m & 0o111 != 0)
    }
}

/// A wheel on disk with its metadata read (not yet verified: call [`Wheel::verify`]).
#[derive(Clone, Debug)]
pub struct Wheel {
    pub path: PathBuf,
    pub filename: WheelFilename,
    /// The `.dist-info` directory inside the archive, e.g. `pkg-1.0.dist-info`.
    pub dist_info: String,
    pub metadata: Headers,
    pub wheel: Headers,
    pub record: Vec<RecordEntry>,
    pub entries: Vec<WheelEntry>,
}

/// One disagreement between RECORD and the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordProblem {
    NotInRecord {
        path: String,
    },
    MissingFromArchive {
        path: String,
    },
    HashMismatch {
        path: String,
        record: String,
        actual: String,
    },
    SizeMismatch {
        path: String,
        record: u64,
        actual: u64,
    },
    NoHash {
        path: String,
    },
}

impl fmt::Display for RecordProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Paths and hashes are the archive's text: one escaped line each.
        match self {
            RecordProblem::NotInRecord { path } => {
                write!(f, "{}: in the archive but not in RECORD", shown(path))
            }
            RecordProblem::MissingFromArchive { path } => {
                write!(f, "{}: in RECORD but not in the archive", shown(path))
            }
            RecordProblem::HashMismatch {
                path,
                record,
                actual,
            } => {
                write!(
                    f,
                    "{}: RECORD says {}, the content hashes to {actual}",
                    shown(path),
                    shown(record)
                )
            }
            RecordProblem::SizeMismatch {
                path,
                record,
                actual,
            } => {
                write!(
                    f,
                    "{}: RECORD says {record} bytes, the archive holds {actual}",
                    shown(path)
                )
            }
            RecordProblem::NoHash { path } => write!(f, "{}: RECORD gives no hash", shown(path)),
        }
    }
}

/// A name from a wheel (an entry's path, a RECORD field) for a message: control
/// characters escaped, cut short.
pub(crate) fn shown(text: &str) -> String {
    commstack_digest::terminal_safe_capped(text, commstack_digest::SHOWN_NAME_MAX)
}

/// RECORD does not describe the archive; every problem is listed.
#[derive(Debug, thiserror::Error)]
#[error("{wheel}: RECORD does not match the archive ({} problem(s)):\n  {}", problems.len(),
        problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n  "))]
pub struct RecordMismatch {
    pub wheel: String,
    pub problems: Vec<RecordProblem>,
}

impl Wheel {
    pub fn open(path: &Path) -> Result<Wheel> {
        let file_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .with_context(|| format!("{} has no UTF-8 file name", path.display()))?;
        let filename = WheelFilename::parse(file_name)?;
        let mut archive = open_archive(path)?;

        let mut entries = Vec::with_capacity(archive.len());
        for i in 0..archive.len() {
            let f = archive
                .by_index_raw(i)
                .with_context(|| format!("{}: cannot read zip entry {i}", path.display()))?;
            entries.push(WheelEntry {
                path: f
                    .name()
                    .with_context(|| format!("{}: zip entry {i} has a bad name", path.display()))?
                    .to_string(),
                size: f.size(),
                mode: f.unix_mode(),
                is_dir: f.is_dir(),
                is_symlink: f.is_symlink(),
            });
        }

        let dist_info = find_dist_info(&entries, &filename).with_context(|| {
            format!(
                "{}: no .dist-info directory for {}",
                path.display(),
                filename.name
            )
        })?;
        let read_text = |archive: &mut ZipArchive<BufReader<File>>, name: &str| -> Result<String> {
            let inner = format!("{dist_info}/{name}");
            let f = archive
                .by_name(&inner)
                .with_context(|| format!("{}: {} is missing", path.display(), shown(&inner)))?;
            let bytes = read_capped(path, &inner, f)?;
            String::from_utf8(bytes)
                .with_context(|| format!("{}: {} is not UTF-8", path.display(), shown(&inner)))
        };
        let metadata = Headers::parse(&read_text(&mut archive, "METADATA")?)
            .with_context(|| format!("{}: {dist_info}/METADATA", path.display()))?;
        let wheel = Headers::parse(&read_text(&mut archive, "WHEEL")?)
            .with_context(|| format!("{}: {dist_info}/WHEEL", path.display()))?;
        let record = parse_record(read_text(&mut archive, "RECORD")?.as_bytes())
            .with_context(|| format!("{}: {dist_info}/RECORD", path.display()))?;

        let w = Wheel {
            path: path.to_path_buf(),
            filename,
            dist_info,
            metadata,
            wheel,
            record,
            entries,
        };
        w.check_consistency()?;
        Ok(w)
    }

    fn check_consistency(&self) -> Result<()> {
        let p = self.path.display();
        let wv = self
            .wheel
            .get("Wheel-Version")
            .with_context(|| format!("{p}: WHEEL has no Wheel-Version"))?;
        if !wv.starts_with("1.") {
            bail!("{p}: Wheel-Version {wv} is not supported (only 1.x)");
        }
        let name = self
            .metadata
            .get("Name")
            .with_context(|| format!("{p}: METADATA has no Name"))?;
        if normalize_name(name) != normalize_name(&self.filename.name) {
            bail!(
                "{p}: METADATA names {name:?}, the file name says {:?}",
                self.filename.name
            );
        }
        let version = self.version()?;
        if version != self.filename.version {
            bail!(
                "{p}: METADATA says version {version}, the file name says {}",
                self.filename.version
            );
        }
        Ok(())
    }

    /// `Name` from METADATA, as written there.
    pub fn name(&self) -> &str {
        self.metadata.get("Name").unwrap_or(&self.filename.name)
    }

    pub fn version(&self) -> Result<Version> {
        let v = self
            .metadata
            .get("Version")
            .with_context(|| format!("{}: METADATA has no Version", self.path.display()))?;
        parse_version(v).with_context(|| format!("{}: METADATA Version", self.path.display()))
    }

    pub fn root_is_purelib(&self) -> bool {
        self.wheel
            .get("Root-Is-Purelib")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    pub fn record_path(&self) -> String {
        format!("{}/RECORD", self.dist_info)
    }

    /// Read one `.dist-info` file (`entry_points.txt`, say) into memory, bounded as
    /// [`Wheel::open`] bounds METADATA, WHEEL and RECORD.
    pub fn read_dist_info(&self, name: &str) -> Result<Vec<u8>> {
        let inner = format!("{}/{name}", self.dist_info);
        let mut archive = open_archive(&self.path)?;
        let f = archive
            .by_name(&inner)
            .with_context(|| format!("{}: no {} inside", self.path.display(), shown(&inner)))?;
        read_capped(&self.path, &inner, f)
    }

    /// Read one file of the archive into memory, whole: for the caller to bound (it reads
    /// NVIDIA's NVSHMEM libraries, whose sizes the lock holds).
    pub fn read(&self, inner: &str) -> Result<Vec<u8>> {
        let mut archive = open_archive(&self.path)?;
        let mut f = archive
            .by_name(inner)
            .with_context(|| format!("{}: no {} inside", self.path.display(), shown(inner)))?;
        // The declared size is the archive's word: not an allocation to make up front.
        let mut buf = Vec::with_capacity(f.size().min(1 << 20) as usize);
        f.read_to_end(&mut buf)
            .with_context(|| format!("{}: cannot read {}", self.path.display(), shown(inner)))?;
        Ok(buf)
    }

    /// Every file of the archive in memory (archive order, no directories), verified
    /// against RECORD as [`Wheel::verify`] does: for a caller that reads the files
    /// anyway, one inflate of each instead of two.
    pub fn read_verified(&self) -> Result<Vec<(String, Vec<u8>)>> {
        let mut files = Vec::new();
        self.hash_files(|name, f| {
            // The declared size is the archive's word: not an allocation to make up front.
            let mut bytes = Vec::with_capacity(f.size().min(1 << 26) as usize);
            f.read_to_end(&mut bytes)?;
            let hash = (format_sha256(&Sha256::digest(&bytes)), bytes.len() as u64);
            files.push((name.to_string(), bytes));
            Ok(hash)
        })?;
        Ok(files)
    }

    /// Hash every file and compare with RECORD: every file listed, every listed file
    /// present, hashes and sizes equal. Errors with [`RecordMismatch`] listing all problems.
    pub fn verify(&self) -> Result<()> {
        self.hash_files(|_, f| {
            let mut hasher = HashingWriter::default();
            io::copy(f, &mut hasher)?;
            Ok((format_sha256(&hasher.hasher.finalize()), hasher.len))
        })
    }

    /// `hash` of each file (its `sha256=...` and size) compared with RECORD.
    fn hash_files(
        &self,
        mut hash: impl FnMut(
            &str,
            &mut zip::read::ZipFile<'_, BufReader<File>>,
        ) -> io::Result<(String, u64)>,
    ) -> Result<()> {
        let mut archive = open_archive(&self.path)?;
        let mut actual = BTreeMap::new();
        for i in 0..archive.len() {
            let mut f = archive.by_index(i)?;
            if f.is_dir() {
                continue;
            }
            let name = f.name()?.to_string();
            let seen = hash(&name, &mut f).with_context(|| {
                format!("{}: cannot read {}", self.path.display(), shown(&name))
            })?;
            actual.insert(name, seen);
        }
        let problems = compare_record(&self.record, &actual, &self.record_path());
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RecordMismatch {
                wheel: self.path.display().to_string(),
                problems,
            }
            .into())
        }
    }
}

/// RECORD rows vs the files seen: `actual` maps path -> (`sha256=...`, size).
pub(crate) fn compare_record(
    record: &[RecordEntry],
    actual: &BTreeMap<String, (String, u64)>,
    record_path: &str,
) -> Vec<RecordProblem> {
    let mut problems = Vec::new();
    let listed: BTreeMap<&str, &RecordEntry> =
        record.iter().map(|e| (e.path.as_str(), e)).collect();
    for (path, (hash, size)) in actual {
        let Some(entry) = listed.get(path.as_str()) else {
            // Signatures may be absent from RECORD (binary distribution format spec).
            let is_signature = [".jws", ".p7s"]
                .iter()
                .any(|ext| *path == format!("{record_path}{ext}"));
            if !is_signature {
                problems.push(RecordProblem::NotInRecord { path: path.clone() });
            }
            continue;
        };
        if path == record_path {
            continue;
        }
        match &entry.hash {
            None => problems.push(RecordProblem::NoHash { path: path.clone() }),
            Some(h) if h.trim_end_matches('=') != hash => {
                problems.push(RecordProblem::HashMismatch {
                    path: path.clone(),
                    record: h.clone(),
                    actual: hash.clone(),
                })
            }
            Some(_) => {}
        }
        if let Some(s) = entry.size
            && s != *size
        {
            problems.push(RecordProblem::SizeMismatch {
                path: path.clone(),
                record: s,
                actual: *size,
            });
        }
    }
    for entry in record {
        if !actual.contains_key(&entry.path) {
            problems.push(RecordProblem::MissingFromArchive {
                path: entry.path.clone(),
            });
        }
    }
    problems
}

/// `f` (the entry `inner` of the wheel at `path`) into memory, refused over
/// [`DIST_INFO_MAX`] bytes whatever its declared size says: a deflated file of zeros is
/// 1000 times its size (docs/bounds.md).
fn read_capped(path: &Path, inner: &str, f: impl Read) -> Result<Vec<u8>> {
    let bound = DIST_INFO_MAX;
    let mut bytes = Vec::new();
    f.take(bound + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("{}: cannot read {}", path.display(), shown(inner)))?;
    if bytes.len() as u64 > bound {
        bail!(
            "{}: {} is over {bound} bytes: refused as a decompression bomb (bound: \
             commstack_wheel::DIST_INFO_MAX; torch's RECORD is 1.3 MB); the wheel is damaged \
             or not what its index claims: check the index it was locked from",
            path.display(),
            shown(inner)
        );
    }
    Ok(bytes)
}

pub(crate) fn open_archive(path: &Path) -> Result<ZipArchive<BufReader<File>>> {
    let file =
        File::open(path).with_context(|| format!("cannot open the wheel {}", path.display()))?;
    ZipArchive::new(BufReader::new(file))
        .with_context(|| format!("{} is not a valid zip archive", path.display()))
}

fn find_dist_info(entries: &[WheelEntry], filename: &WheelFilename) -> Option<String> {
    let mut dirs: Vec<String> = entries
        .iter()
        .filter_map(|e| {
            e.path
                .split('/')
                .next()
                .filter(|top| top.ends_with(".dist-info"))
                .map(str::to_string)
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    let wanted = filename.dist_info_dir();
    if let Some(d) = dirs.iter().find(|d| **d == wanted) {
        return Some(d.clone());
    }
    // Older tools did not escape the name the same way: match on the normalised name.
    let matching: Vec<&String> = dirs
        .iter()
        .filter(|d| {
            let stem = d.trim_end_matches(".dist-info");
            stem.rsplit_once('-')
                .is_some_and(|(n, _)| normalize_name(n) == normalize_name(&filename.name))
        })
        .collect();
    (matching.len() == 1).then(|| matching[0].clone())
}

/// A `Write` that only hashes and counts.
#[derive(Default)]
pub(crate) struct HashingWriter {
    pub hasher: Sha256,
    pub len: u64,
}

impl io::Write for HashingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.hasher.update(buf);
        self.len += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
