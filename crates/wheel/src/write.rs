//! Write a wheel deterministically: entries sorted (dist-info last, RECORD at the very
//! end), every timestamp 1980-01-01, modes 0644/0755 only, RECORD with urlsafe-base64
//! sha256 without padding and sizes. The same inputs give the same bytes.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use pep440_rs::Version;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

use crate::headers::Headers;
use crate::name::{Tag, WheelFilename, escape_name, parse_version, validate_name};
use crate::read::HashingWriter;
use crate::record::{RecordEntry, format_sha256, render_record};

#[derive(Clone, Debug)]
enum Source {
    Bytes(Vec<u8>),
    /// Read at write time (large libraries are streamed, not held in memory).
    File(PathBuf),
}

#[derive(Clone, Debug)]
struct Item {
    source: Source,
    executable: bool,
}

/// Builds one wheel. Paths are `/`-separated, relative to the wheel root.
#[derive(Clone, Debug)]
pub struct WheelBuilder {
    name: String,
    version: Version,
    tags: Vec<Tag>,
    root_is_purelib: bool,
    metadata: Vec<(String, String)>,
    description: Option<String>,
    generator: String,
    files: BTreeMap<String, Item>,
    dist_info_files: BTreeMap<String, Item>,
}

/// The result of [`WheelBuilder::write`].
#[derive(Clone, Debug)]
pub struct WrittenWheel {
    pub path: PathBuf,
    pub filename: WheelFilename,
    pub record: Vec<RecordEntry>,
}

impl WheelBuilder {
    /// `name` as the project spells it (kept in METADATA), `version` any PEP 440 form
    /// (normalised here).
    pub fn new(name: &str, version: &str) -> Result<WheelBuilder> {
        validate_name(name)?;
        Ok(WheelBuilder {
            name: name.to_string(),
            version: parse_version(version)?,
            tags: Vec::new(),
            root_is_purelib: false,
            metadata: Vec::new(),
            description: None,
            generator: format!("commstack-wheel {}", env!("CARGO_PKG_VERSION")),
            files: BTreeMap::new(),
            dist_info_files: BTreeMap::new(),
        })
    }

    pub fn version(&self) -> &Version {
        &self.version
    }

    pub fn tag(mut self, python: &str, abi: &str, platform: &str) -> Self {
        self.tags.push(Tag::new(python, abi, platform));
        self
    }

    /// Libraries with compiled code go to platlib (false, the default).
    pub fn root_is_purelib(mut self, purelib: bool) -> Self {
        self.root_is_purelib = purelib;
        self
    }

    /// An extra METADATA header (`Summary`, `Requires-Python`, `License-File`, ...).
    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_string(), value.to_string()));
        self
    }

    pub fn description(mut self, text: &str) -> Self {
        self.description = Some(text.to_string());
        self
    }

    pub fn add_bytes(&mut self, path: &str, bytes: Vec<u8>, executable: bool) -> Result<&mut Self> {
        self.insert(
            path,
            Item {
                source: Source::Bytes(bytes),
                executable,
            },
        )
    }

    /// Add a file from disk (a symlink is followed: wheels hold no links). Executable if
    /// any execute bit is set on it.
    pub fn add_file(&mut self, path: &str, src: &Path) -> Result<&mut Self> {
        let meta = fs::metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
        if !meta.is_file() {
            bail!("{} is not a regular file", src.display());
        }
        let executable = meta.permissions().mode() & 0o111 != 0;
        self.insert(
            path,
            Item {
                source: Source::File(src.to_path_buf()),
                executable,
            },
        )
    }

    /// Add a file to the `.dist-info` directory (e.g. `licenses/License.txt`).
    pub fn add_dist_info_file(&mut self, name: &str, src: &Path) -> Result<&mut Self> {
        check_inner_path(name)?;
        if matches!(name, "METADATA" | "WHEEL" | "RECORD") {
            bail!("{name} in .dist-info is written by the builder");
        }
        fs::metadata(src).with_context(|| format!("cannot read {}", src.display()))?;
        self.dist_info_files.insert(
            name.to_string(),
            Item {
                source: Source::File(src.to_path_buf()),
                executable: false,
            },
        );
        Ok(self)
    }

    /// Add a small generated file to the `.dist-info` directory (e.g. `top_level.txt`).
    pub fn add_dist_info_bytes(&mut self, name: &str, bytes: Vec<u8>) -> Result<&mut Self> {
        check_inner_path(name)?;
        if matches!(name, "METADATA" | "WHEEL" | "RECORD") {
            bail!("{name} in .dist-info is written by the builder");
        }
        self.dist_info_files.insert(
            name.to_string(),
            Item {
                source: Source::Bytes(bytes),
                executable: false,
            },
        );
        Ok(self)
    }

    fn insert(&mut self, path: &str, item: Item) -> Result<&mut Self> {
        check_inner_path(path)?;
        if path
            .split('/')
            .next()
            .is_some_and(|top| top.ends_with(".dist-info"))
        {
            bail!("{path}: use add_dist_info_file for .dist-info contents");
        }
        if self.files.insert(path.to_string(), item).is_some() {
            bail!("{path} was added twice to the wheel");
        }
        Ok(self)
    }

    pub fn filename(&self) -> Result<WheelFilename> {
        if self.tags.is_empty() {
            bail!(
                "the wheel {} has no tag: call .tag(python, abi, platform)",
                self.name
            );
        }
        let uniq = |f: fn(&Tag) -> &String| {
            let mut v: Vec<String> = self.tags.iter().map(|t| f(t).clone()).collect();
            v.dedup();
            v
        };
        let filename = WheelFilename {
            name: escape_name(&self.name),
            version: self.version.clone(),
            build: None,
            python: uniq(|t| &t.python),
            abi: uniq(|t| &t.abi),
            platform: uniq(|t| &t.platform),
        };
        if filename.tags().len() != self.tags.len() {
            bail!(
                "the tags of {} cannot be written as one compressed tag set",
                self.name
            );
        }
        Ok(filename)
    }

    fn metadata_text(&self) -> String {
        let mut h = Headers::default();
        h.push("Metadata-Version", "2.1");
        h.push("Name", &self.name);
        h.push("Version", &self.version.to_string());
        for (k, v) in &self.metadata {
            h.push(k, v);
        }
        h.body = self.description.clone();
        h.render()
    }

    fn wheel_text(&self) -> String {
        let mut h = Headers::default();
        h.push("Wheel-Version", "1.0");
        h.push("Generator", &self.generator);
        h.push(
            "Root-Is-Purelib",
            if self.root_is_purelib {
                "true"
            } else {
                "false"
            },
        );
        for t in &self.tags {
            h.push("Tag", &t.to_string());
        }
        h.render()
    }

    /// Write `<out_dir>/<wheel file name>` (through a temporary file, renamed when
    /// complete) and return its path and RECORD.
    pub fn write(&self, out_dir: &Path) -> Result<WrittenWheel> {
        let filename = self.filename()?;
        let dist_info = filename.dist_info_dir();
        fs::create_dir_all(out_dir)
            .with_context(|| format!("cannot create {}", out_dir.display()))?;
        let final_path = out_dir.join(filename.to_string());
        let tmp = tempfile::NamedTempFile::new_in(out_dir)
            .with_context(|| format!("cannot create a temporary file in {}", out_dir.display()))?;
        let mut zip = ZipWriter::new(io::BufWriter::new(tmp.reopen()?));
        let mut record = Vec::new();

        let mut entries: Vec<(String, &Item)> =
            self.files.iter().map(|(p, i)| (p.clone(), i)).collect();
        for (name, item) in &self.dist_info_files {
            entries.push((format!("{dist_info}/{name}"), item));
        }
        let generated = [
            (
                format!("{dist_info}/METADATA"),
                Item {
                    source: Source::Bytes(self.metadata_text().into_bytes()),
                    executable: false,
                },
            ),
            (
                format!("{dist_info}/WHEEL"),
                Item {
                    source: Source::Bytes(self.wheel_text().into_bytes()),
                    executable: false,
                },
            ),
        ];
        // Payload sorted first, then .dist-info sorted: installers read dist-info last.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut dist: Vec<(String, &Item)> =
            generated.iter().map(|(p, i)| (p.clone(), i)).collect();
        dist.extend(
            entries
                .iter()
                .filter(|(p, _)| p.starts_with(&dist_info))
                .cloned(),
        );
        dist.sort_by(|a, b| a.0.cmp(&b.0));
        entries.retain(|(p, _)| !p.starts_with(&dist_info));
        entries.extend(dist);

        for (path, item) in &entries {
            let (hash, size) = write_entry(&mut zip, path, item)?;
            record.push(RecordEntry {
                path: path.clone(),
                hash: Some(hash),
                size: Some(size),
            });
        }
        let record_path = format!("{dist_info}/RECORD");
        record.push(RecordEntry {
            path: record_path.clone(),
            hash: None,
            size: None,
        });
        let record_bytes = render_record(&record);
        zip.start_file(record_path, options(false, record_bytes.len() as u64))?;
        zip.write_all(&record_bytes)?;
        let mut writer = zip.finish().context("cannot finish the zip archive")?;
        writer.flush()?;
        drop(writer);
        tmp.as_file().sync_all().ok();
        tmp.persist(&final_path)
            .with_context(|| format!("cannot move the wheel into {}", final_path.display()))?;
        fs::set_permissions(&final_path, fs::Permissions::from_mode(0o644))?;
        Ok(WrittenWheel {
            path: final_path,
            filename,
            record,
        })
    }
}

fn options(executable: bool, size: u64) -> SimpleFileOptions {
    SimpleFileOptions::default()
        .compression_method(CompressionMethod::Deflated)
        .compression_level(Some(6))
        .last_modified_time(DateTime::default())
        .unix_permissions(if executable { 0o755 } else { 0o644 })
        .large_file(size >= u32::MAX as u64)
}

fn write_entry<W: Write + io::Seek>(
    zip: &mut ZipWriter<W>,
    path: &str,
    item: &Item,
) -> Result<(String, u64)> {
    let mut hasher = HashingWriter::default();
    match &item.source {
        Source::Bytes(bytes) => {
            zip.start_file(path, options(item.executable, bytes.len() as u64))?;
            zip.write_all(bytes)?;
            hasher.write_all(bytes)?;
        }
        Source::File(src) => {
            let file = File::open(src)
                .with_context(|| format!("cannot open {} for the wheel", src.display()))?;
            let size = file.metadata()?.len();
            zip.start_file(path, options(item.executable, size))?;
            let mut reader = BufReader::with_capacity(1 << 20, file);
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = reader
                    .read(&mut buf)
                    .with_context(|| format!("cannot read {}", src.display()))?;
                if n == 0 {
                    break;
                }
                zip.write_all(&buf[..n])?;
                hasher.write_all(&buf[..n])?;
            }
        }
    }
    Ok((
        format_sha256(&sha2::Digest::finalize(hasher.hasher)),
        hasher.len,
    ))
}

fn check_inner_path(path: &str) -> Result<()> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.ends_with('/')
        || path.contains('\\')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        bail!("{path:?} is not a relative /-separated path inside a wheel");
    }
    Ok(())
}

/// Adds `<dist-info>/<name>` to an existing wheel, in place: every entry is copied as it
/// is (raw, not recompressed), the new file goes before RECORD, and RECORD gains its line.
/// For facts a build records about the wheel it made (e.g. which NVSHMEM device library
/// DeepEP's extension linked), where rebuilding the wheel would change its payload.
pub fn add_dist_info_file(wheel_path: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let wheel = crate::read::Wheel::open(wheel_path)?;
    let dist_info = wheel.dist_info.clone();
    let record_path = wheel.record_path();
    let new_path = format!("{dist_info}/{name}");
    check_inner_path(&new_path)?;
    if wheel.entries.iter().any(|e| e.path == new_path) {
        bail!("{} already holds {new_path}", wheel_path.display());
    }
    let dir = wheel_path
        .parent()
        .with_context(|| format!("{} has no directory", wheel_path.display()))?;
    let tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let mut zip = ZipWriter::new(io::BufWriter::new(tmp.reopen()?));
    let mut archive = zip::ZipArchive::new(BufReader::new(
        File::open(wheel_path).with_context(|| format!("cannot read {}", wheel_path.display()))?,
    ))?;
    for i in 0..archive.len() {
        let entry = archive.by_index_raw(i)?;
        if entry.name()? == record_path.as_str() {
            continue;
        }
        zip.raw_copy_file(entry)?;
    }
    zip.start_file(new_path.as_str(), options(false, bytes.len() as u64))?;
    zip.write_all(bytes)?;
    let mut record: Vec<RecordEntry> = wheel
        .record
        .iter()
        .filter(|r| r.path != record_path)
        .cloned()
        .collect();
    record.push(RecordEntry {
        path: new_path,
        hash: Some(crate::record::record_hash(bytes)),
        size: Some(bytes.len() as u64),
    });
    record.push(RecordEntry {
        path: record_path.clone(),
        hash: None,
        size: None,
    });
    let record_bytes = render_record(&record);
    zip.start_file(record_path, options(false, record_bytes.len() as u64))?;
    zip.write_all(&record_bytes)?;
    let mut writer = zip.finish().context("cannot finish the zip archive")?;
    writer.flush()?;
    drop(writer);
    tmp.persist(wheel_path)
        .with_context(|| format!("cannot replace {}", wheel_path.display()))?;
    fs::set_permissions(wheel_path, fs::Permissions::from_mode(0o644))?;
    // What was written must verify like any wheel.
    crate::read::Wheel::open(wheel_path)?
        .verify()
        .with_context(|| format!("{} after adding {name}", wheel_path.display()))
}
