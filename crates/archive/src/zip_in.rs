//! Zip (and wheel) entries into the [`Unpacker`], after the whole central directory is
//! checked against the local headers: names that agree, entries that do not share bytes
//! (overlapping entries multiply what a small archive writes), and the declared sizes
//! within the budget, all before the first byte is written.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use anyhow::{Context, Result, bail};

use crate::unpacker::{S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, Unpacker, shown};

type Archive = zip::ZipArchive<BufReader<File>>;

/// Where one entry lies in the archive: from its local header to the end of its data.
struct Span {
    start: u64,
    end: u64,
    index: usize,
}

impl Unpacker {
    pub fn zip(&mut self, file: File) -> Result<()> {
        let mut archive = zip::ZipArchive::new(BufReader::new(file))
            .with_context(|| format!("{} is not a valid zip archive", self.archive.display()))?;
        self.zip_precheck(&mut archive)?;
        for i in 0..archive.len() {
            let mut f = archive.by_index(i).with_context(|| {
                format!("{}: cannot read zip entry {i}", self.archive.display())
            })?;
            let raw_name = f.name_raw().to_vec();
            let name = shown(&raw_name);
            self.count(&name)?;
            let unix = f.unix_mode();
            // The zip crate clears setuid, setgid and sticky bits from the mode it reports;
            // the raw attributes still hold them (for entries made on Unix) to refuse them.
            let raw = f.external_attributes() >> 16;
            let mode = match unix {
                Some(m) if raw & !0o7000 == m => raw,
                Some(m) => m,
                None => 0,
            };
            self.check_mode(&name, mode)?;
            let Some(rel) = self.entry_path(&raw_name, &name)? else {
                continue;
            };
            let ftype = mode & S_IFMT;
            let perms = |default| unix.map_or(default, |m| m & 0o777);
            if f.is_dir() || ftype == S_IFDIR {
                self.dir(&rel, &name, perms(0o755))?;
            } else if f.is_symlink() || ftype == S_IFLNK {
                // A zip symlink is a file whose content is the target.
                let max = self.options.limits.max_name as u64;
                let mut target = Vec::new();
                (&mut f).take(max + 1).read_to_end(&mut target)?;
                self.symlink(&rel, &name, &target)?;
            } else if ftype == 0 || ftype == S_IFREG {
                let declared = f.size();
                self.file(&rel, &name, perms(0o644), declared, &mut f)?;
            } else {
                bail!(
                    "{}: entry {name} is a special file (mode {mode:o}: a device, FIFO or socket): \
                     refused; the archive is not what it claims to be",
                    self.archive.display()
                );
            }
        }
        Ok(())
    }

    /// Every entry's central name against its local header's, the entries' byte ranges
    /// against each other, and the content they declare against the budget.
    fn zip_precheck(&self, archive: &mut Archive) -> Result<()> {
        let path = self.archive.display();
        let count = archive.len() as u64;
        if count > self.options.limits.max_entries {
            bail!(
                "{path}: {count} entries, more than {} (bound: Limits::max_entries): refused",
                self.options.limits.max_entries
            );
        }
        let mut local = BufReader::new(
            File::open(&self.archive).with_context(|| format!("cannot open {path}"))?,
        );
        let mut names: Vec<Vec<u8>> = Vec::with_capacity(archive.len());
        let mut spans = Vec::with_capacity(archive.len());
        let mut declared: u64 = 0;
        for index in 0..archive.len() {
            let f = archive
                .by_index_raw(index)
                .with_context(|| format!("{path}: cannot read zip entry {index}"))?;
            let central = f.name_raw().to_vec();
            self.check_name("entry", &central)?;
            let start = f.header_start();
            let end = f
                .data_start()
                .and_then(|d| d.checked_add(f.compressed_size()))
                .with_context(|| format!("{path}: entry {} has no data range", shown(&central)))?;
            declared = declared.saturating_add(f.size());
            drop(f);
            let local_name = local_name(&mut local, start).with_context(|| {
                format!(
                    "{path}: cannot read the local header of entry {} (at byte {start})",
                    shown(&central)
                )
            })?;
            if local_name != central {
                bail!(
                    "{path}: entry {} of the central directory has the local header of {}: \
                     refused (zip readers disagree on such an archive; other tools refuse it too)",
                    shown(&central),
                    shown(&local_name)
                );
            }
            names.push(central);
            spans.push(Span { start, end, index });
        }
        spans.sort_by_key(|s| (s.start, s.end));
        for pair in spans.windows(2) {
            if pair[0].end > pair[1].start {
                bail!(
                    "{path}: entries {} and {} share bytes of the archive (bytes {}..{} and \
                     {}..{}): refused (overlapping entries multiply what a small archive writes)",
                    shown(&names[pair[0].index]),
                    shown(&names[pair[1].index]),
                    pair[0].start,
                    pair[0].end,
                    pair[1].start,
                    pair[1].end
                );
            }
        }
        if let Some(last) = spans.last()
            && last.end > archive.central_directory_start()
        {
            bail!(
                "{path}: entry {} runs into the central directory: refused",
                shown(&names[last.index])
            );
        }
        if declared > self.budget.content {
            bail!(
                "{path}: the entries declare {declared} bytes of content, more than {}: refused \
                 as a decompression bomb before writing any (bound: {})",
                self.budget.content,
                self.budget.content_bound
            );
        }
        Ok(())
    }
}

/// The name in the local header at `start`, read by the zip crate's stream reader.
fn local_name(reader: &mut BufReader<File>, start: u64) -> Result<Vec<u8>> {
    reader.seek(SeekFrom::Start(start))?;
    // A compressed size of 0: the header alone is read, none of the data.
    match zip::read::read_zipfile_from_stream_with_compressed_size(reader, 0)? {
        Some(f) => Ok(f.name_raw().to_vec()),
        None => bail!("no local header there"),
    }
}
