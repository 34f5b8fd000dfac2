//! Tar (and gzip'd tar) entries into the [`Unpacker`], through a [`Meter`]: the tar crate
//! reads GNU long names and pax headers whole, so the reader beneath it stops it after a
//! bounded number of bytes per entry, and after the archive's expansion bound overall.

use std::io::{self, Read};
use std::rc::Rc;

use anyhow::{Context, Result, bail};
use tar::EntryType as T;

use crate::limits::{Meter, MeterState, Stop, header_allowance};
use crate::unpacker::{Unpacker, shown};

impl Unpacker {
    pub fn tar(&mut self, reader: impl Read) -> Result<()> {
        let state = MeterState::new(self.budget.expansion);
        let allowance = header_allowance(&self.options.limits);
        let mut archive = tar::Archive::new(Meter {
            inner: reader,
            state: Rc::clone(&state),
        });
        state.headers(allowance);
        let mut entries = archive
            .entries()
            .map_err(|e| self.read_error(e, &state, allowance))?;
        loop {
            state.headers(allowance);
            let Some(entry) = entries.next() else {
                return Ok(());
            };
            let mut entry = entry.map_err(|e| self.read_error(e, &state, allowance))?;
            state.content();
            let result = self.tar_entry(&mut entry);
            // A bound reached while reading content reads as an I/O error there: say which.
            if state.stopped().is_some() {
                return Err(self.read_error(io::Error::other("stopped"), &state, allowance));
            }
            result?;
            // What the entry holds beyond what was used (a directory's or link's data) is
            // read here, under the stream bound, not skipped by the tar crate unbounded.
            io::copy(&mut entry, &mut io::sink())
                .map_err(|e| self.read_error(e, &state, allowance))?;
        }
    }

    fn read_error(&self, err: io::Error, state: &MeterState, allowance: u64) -> anyhow::Error {
        let archive = self.archive.display();
        match state.stopped() {
            Some(Stop::Headers) => anyhow::anyhow!(
                "{archive}: the headers of entry {} (a GNU long name or long link, a pax \
                 extended header, a sparse map) take more than {allowance} bytes: refused \
                 before reading them whole (bound: Limits::max_name = {} bytes per name)",
                self.entries + 1,
                self.options.limits.max_name
            ),
            Some(Stop::Stream) => anyhow::anyhow!(
                "{archive}: the archive expands to more than {} bytes (after {} entries): \
                 refused as a decompression bomb (bound: {})",
                self.budget.expansion,
                self.entries,
                self.budget.expansion_bound
            ),
            None => anyhow::Error::new(err).context(format!(
                "{archive}: cannot read the next tar entry (truncated or corrupt archive?): \
                 fetch it again"
            )),
        }
    }

    fn tar_entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let kind = entry.header().entry_type();
        // git archive's pax_global_header (the commit id) is no file of the tree.
        if kind == T::XGlobalHeader {
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        self.check_name("entry", &raw)?;
        let name = shown(&raw);
        self.count(&name)?;
        let mode = entry.header().mode().with_context(|| {
            format!(
                "{}: entry {name} has a bad mode field",
                self.archive.display()
            )
        })?;
        self.check_mode(&name, mode)?;
        let Some(rel) = self.entry_path(&raw, &name)? else {
            return Ok(());
        };
        let link = |entry: &tar::Entry<'_, R>, what: &str| -> Result<Vec<u8>> {
            entry
                .link_name_bytes()
                .map(|t| t.into_owned())
                .with_context(|| format!("{}: {what} {name} has no target", self.archive.display()))
        };
        match kind {
            T::Directory => self.dir(&rel, &name, mode),
            // Pre-POSIX tar marks directories by a trailing slash only.
            T::Regular if raw.ends_with(b"/") => self.dir(&rel, &name, mode),
            // A GNU sparse entry reads as its whole content, holes as zeros: written as
            // read, and hashed as written (one reading).
            T::Regular | T::Continuous | T::GNUSparse => {
                let size = entry.size();
                self.file(&rel, &name, mode, size, entry)
            }
            T::Symlink => {
                let target = link(entry, "symlink")?;
                self.symlink(&rel, &name, &target)
            }
            T::Link => {
                let target = link(entry, "hard link")?;
                self.hardlink(&rel, &name, &target)
            }
            T::Char | T::Block | T::Fifo => bail!(
                "{}: entry {name} is a {}: refused (source trees and wheels hold only files, \
                 directories and links); the archive is not what it claims to be",
                self.archive.display(),
                match kind {
                    T::Char => "character device",
                    T::Block => "block device",
                    _ => "FIFO",
                }
            ),
            other => bail!(
                "{}: entry {name} has the tar entry type {:?} ({}), which commstack does not unpack",
                self.archive.display(),
                other,
                std::ascii::escape_default(other.as_byte())
            ),
        }
    }
}
