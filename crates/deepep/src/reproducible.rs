//! What makes the DeepEP build give the same bytes for the same step key on any machine
//! (issue 17): a build directory whose path depends only on the key, the inputs seen
//! through links inside it, compilers told to write paths relative to it, the extension's
//! RUNPATH relative to the wheel, and the wheel rewritten canonically.
//!
//! Why each part:
//! - nvcc hashes the physical path of every source file into the module ids of
//!   relocatable device code (`__fatbinwrap_<id>`, `__nv_static_NN__<id>`), and no option
//!   changes that: the source is built at [`commstack_store::FixedDir`]'s path.
//! - gcc's `#pragma once` counts two headers as one when their size, mtime and bytes
//!   agree; the mtimes are those of whoever unpacked the input (pip, cmake), so the inputs
//!   are seen through views in the fixed directory whose headers are copies with
//!   SOURCE_DATE_EPOCH times ([`header_view`]), and the source copy gets the same times.
//! - torch's headers (TORCH_CHECK), NVSHMEM's and CUDA's expand `__FILE__`, and the host
//!   objects carry DWARF (Python's sysconfig CFLAGS have `-g`): `-ffile-prefix-map` for
//!   gcc (CPPFLAGS, which setuptools appends to its flags, where CFLAGS would replace
//!   Python's) and for nvcc (`-Xcompiler=` in NVCC_APPEND_FLAGS, which reaches every nvcc
//!   call torch's cpp_extension makes, including the device link).
//! - nvcc names its host temp file `tmpxft_<pid>_...cudafe1.cpp`, and that name is the
//!   object's STT_FILE symbol: `-objtemp` names it after the object instead.
//! - DeepEP's setup.py links `-Wl,-rpath,$NVSHMEM_DIR/lib`, the build machine's path,
//!   and a linker cannot drop an rpath once given: the link runs through a small `ld`
//!   (gcc's `-B` in LDFLAGS) that rewrites exactly that argument to the drop-in wheel's
//!   place, `$ORIGIN/nvidia/nvshmem/lib`, logs it, and runs the real ld.
//! - bdist_wheel stores file modes (umask) and times: the wheel is rewritten with sorted
//!   entries, SOURCE_DATE_EPOCH times, 0644/0755 modes and a RECORD in that order.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use commstack_wheel::{RecordEntry, Wheel, render_record};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

/// 1980-01-01T00:00:00Z, the earliest time a zip entry can hold: SOURCE_DATE_EPOCH when
/// the lock gives none (a stack without `[base]`).
pub const DEFAULT_SOURCE_DATE_EPOCH: u64 = 315_532_800;

/// One input as setup.py sees it: a view of it in the fixed directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relocated {
    /// Short name: the view's name and what `-ffile-prefix-map` writes for its paths.
    pub name: String,
    /// `<fixed>/deps/<name>`.
    pub link: PathBuf,
    /// Where it really is (canonical).
    pub target: PathBuf,
    /// Header files copied into the view (with SOURCE_DATE_EPOCH times).
    pub headers_copied: usize,
}

/// Makes `<deps>/<name>`, a view of `target` (see [`header_view`]), and records it.
pub fn relocate(deps: &Path, name: &str, target: &Path, epoch: u64) -> Result<Relocated> {
    let target = target
        .canonicalize()
        .with_context(|| format!("no {name} at {}", target.display()))?;
    fs::create_dir_all(deps).with_context(|| format!("cannot create {}", deps.display()))?;
    let link = deps.join(name);
    let headers_copied = header_view(&target, &link, epoch)?;
    Ok(Relocated {
        name: name.to_string(),
        link,
        target,
        headers_copied,
    })
}

/// Builds at `at` a view of the directory `target` for a compiler: every directory named
/// `include` is copied with each file's time set to `epoch`; the directories on the way
/// to one, and every `bin`, are real directories; everything else is a symlink to the
/// target's entry (symlinks of the target are copied as they are, so relative ones stay
/// in the view). Returns the number of files copied.
///
/// Why copies: gcc's `#pragma once` takes two headers of the same size and mtime (in
/// seconds) and the same bytes for one file. pip, a wheel unpacker or `cmake --install`
/// write thousands of files across a few seconds, so which duplicate headers (torch and
/// the CUDA wheels ship many) count as one depended on the clock, and the object's debug
/// info with it (measured: two venvs from the same wheels gave two deep_ep.o). Why real
/// `bin`: nvcc finds its headers at `bin/..`, which the kernel resolves through a
/// symlinked directory to the target, out of the view.
pub fn header_view(target: &Path, at: &Path, epoch: u64) -> Result<usize> {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    let target_is_include = target.file_name().is_some_and(|n| n == "include");
    if target_is_include {
        return copy_with_time(target, at, time);
    }
    // The directories that lead to an `include`, and to a link named `include` (a
    // toolkit's `targets/x86_64-linux/include -> ../../include` must resolve in the view,
    // so the directory holding it must be a real one of the view).
    let mut keep: std::collections::BTreeSet<PathBuf> = std::collections::BTreeSet::new();
    let mut walk = walkdir::WalkDir::new(target)
        .follow_links(false)
        .into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.with_context(|| format!("cannot read {}", target.display()))?;
        let kind = entry.file_type();
        if entry.depth() == 0 || entry.file_name() != "include" {
            continue;
        }
        if kind.is_dir() {
            walk.skip_current_dir();
        } else if !kind.is_symlink() {
            continue;
        }
        let rel = entry.path().strip_prefix(target).unwrap_or(entry.path());
        for a in rel.ancestors().skip(1) {
            keep.insert(a.to_path_buf());
        }
    }
    let mut copied = 0;
    mirror(target, at, Path::new(""), &keep, time, &mut copied)?;
    Ok(copied)
}

fn mirror(
    target: &Path,
    at: &Path,
    rel: &Path,
    keep: &std::collections::BTreeSet<PathBuf>,
    time: std::time::SystemTime,
    copied: &mut usize,
) -> Result<()> {
    let dir = at.join(rel);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let src = target.join(rel);
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(&src)
        .with_context(|| format!("cannot read {}", src.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let (from, to, sub) = (e.path(), dir.join(&name), rel.join(&name));
        let kind = e.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&from)?, &to)?;
        } else if kind.is_dir() && name == "include" {
            *copied += copy_with_time(&from, &to, time)?;
        } else if kind.is_dir() && (keep.contains(&sub) || name == "bin") {
            mirror(target, at, &sub, keep, time, copied)?;
        } else {
            std::os::unix::fs::symlink(&from, &to)
                .with_context(|| format!("cannot link {} -> {}", to.display(), from.display()))?;
        }
    }
    Ok(())
}

/// Copies the tree `from` to `to` (links as links, modes kept), every file's time set to
/// `time`. Returns the number of files.
fn copy_with_time(from: &Path, to: &Path, time: std::time::SystemTime) -> Result<usize> {
    let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
    for entry in walkdir::WalkDir::new(from)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.with_context(|| format!("cannot read {}", from.display()))?;
        let rel = entry.path().strip_prefix(from).unwrap_or(entry.path());
        let dest = to.join(rel);
        let kind = entry.file_type();
        if kind.is_dir() {
            fs::create_dir_all(&dest)
                .with_context(|| format!("cannot create {}", dest.display()))?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path())?, &dest)?;
        } else {
            files.push((entry.into_path(), dest));
        }
    }
    copy_files_with_time(&files, time)?;
    Ok(files.len())
}

/// Each `(from, to)` copied (mode kept) with its time set to `time`, on several threads:
/// a view copies torch's ~10,000 headers, and one thread waiting on each open, copy and
/// close in turn took 1.5 s of a 75 s DeepEP build on the H200.
fn copy_files_with_time(files: &[(PathBuf, PathBuf)], time: std::time::SystemTime) -> Result<()> {
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .clamp(1, 16);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let copy = || -> Result<()> {
        while let Some((from, to)) =
            files.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        {
            fs::copy(from, to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
            fs::File::options()
                .write(true)
                .open(to)?
                .set_modified(time)
                .with_context(|| format!("cannot set the time of {}", to.display()))?;
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads).map(|_| scope.spawn(copy)).collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a header-copying thread panicked"))
    })
}

/// Sets the time of every file under `dir` to `epoch` (the source copy: its headers go
/// through the same `#pragma once` comparison).
pub fn set_times(dir: &Path, epoch: u64) -> Result<()> {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    for entry in walkdir::WalkDir::new(dir).follow_links(false) {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        if entry.file_type().is_file() {
            fs::File::options()
                .write(true)
                .open(entry.path())?
                .set_modified(time)
                .with_context(|| format!("cannot set the time of {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// `path` as seen in the view `r` when it is under `r.target` (as given or canonical).
pub fn through(r: &Relocated, original_root: &Path, path: &Path) -> PathBuf {
    for root in [original_root, r.target.as_path()] {
        if let Ok(rest) = path.strip_prefix(root) {
            return r.link.join(rest);
        }
    }
    path.to_path_buf()
}

/// The `-ffile-prefix-map=OLD=NEW` flags: the source tree becomes `.`, each relocated
/// input its name (by its view and by its real path, in case a tool resolves a link).
/// The prefixes do not nest, so gcc's order of precedence (the last that matches) does
/// not matter.
pub fn prefix_maps(src: &Path, relocated: &[Relocated]) -> Vec<String> {
    let mut maps = vec![format!("-ffile-prefix-map={}=.", src.display())];
    for r in relocated {
        maps.push(format!("-ffile-prefix-map={}={}", r.link.display(), r.name));
        maps.push(format!(
            "-ffile-prefix-map={}={}",
            r.target.display(),
            r.name
        ));
    }
    maps
}

/// Whether this nvcc has `-objtemp` (`--objdir-as-tempdir`): asked, not assumed from
/// the version. False when nvcc cannot be run (a toolchain without one compiles no .cu).
pub fn nvcc_has_objtemp(nvcc: &Path) -> bool {
    std::process::Command::new(nvcc)
        .arg("--help")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(std::process::Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("--objdir-as-tempdir"))
        .unwrap_or(false)
}

/// An rpath value the link must not keep and what replaces it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpathRewrite {
    pub from: String,
    pub to: String,
}

/// The linker gcc would run (`cc -print-prog-name=ld`), resolved on `path_dirs` when it
/// is a bare name.
pub fn real_ld(cc: &Path, path_dirs: &[PathBuf]) -> Result<PathBuf> {
    let out = commstack_exec::output(
        "the host compiler's linker query",
        std::process::Command::new(cc)
            .arg("-print-prog-name=ld")
            .env_clear()
            .env("PATH", "/usr/bin:/bin"),
    )?;
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if name.is_empty() {
        bail!("{} -print-prog-name=ld printed nothing", cc.display());
    }
    if name.contains('/') {
        return Ok(PathBuf::from(name));
    }
    path_dirs
        .iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "{} links with `{name}`, which is not in {}",
                cc.display(),
                path_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(":")
            )
        })
}

/// Writes `<dir>/ld`: gcc given `-B<dir>/` runs it as its linker. It replaces every
/// `-rpath` value (and each `:`-separated part of one) equal to a rewrite's `from`, says
/// so on stderr (the build log), and runs `real`.
pub fn write_ld_wrapper(dir: &Path, real: &Path, rewrites: &[RpathRewrite]) -> Result<PathBuf> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cases = String::new();
    for r in rewrites {
        for from in [r.from.clone(), format!("{}/", r.from)] {
            cases.push_str(&format!(
                "      {}) e={} ;;\n",
                sh_quote(&from),
                sh_quote(&r.to)
            ));
        }
    }
    let script = format!(
        r#"#!/bin/sh
# commstack (DeepEP build): the link runs through this script (gcc -B) so that the
# extension's RUNPATH names the drop-in wheels' place relative to itself instead of the
# build machine's directories. Each rewrite is printed; everything else goes to ld as is.
set -f
rewrite() {{
  old_ifs=$IFS; IFS=:; out=; sep=
  for e in $1; do
    orig=$e
    case $e in
{cases}    esac
    [ "$e" = "$orig" ] || echo "commstack-ld: -rpath $orig -> $e" >&2
    out=$out$sep$e; sep=:
  done
  IFS=$old_ifs
  printf '%s' "$out"
}}
next=
for a do
  shift
  if [ -n "$next" ]; then
    a=$(rewrite "$a"); next=
  else
    case $a in
      -rpath|-R|--rpath) next=1 ;;
      -rpath=*) a="-rpath=$(rewrite "${{a#-rpath=}}")" ;;
      --rpath=*) a="--rpath=$(rewrite "${{a#--rpath=}}")" ;;
    esac
  fi
  set -- "$@" "$a"
done
exec {real} "$@"
"#,
        real = sh_quote(&real.display().to_string()),
    );
    let path = dir.join("ld");
    fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

pub(crate) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The zip time of `epoch` (UTC), clamped to zip's range (1980..2107).
pub fn zip_time(epoch: u64) -> Result<DateTime> {
    let epoch = epoch.clamp(DEFAULT_SOURCE_DATE_EPOCH, 4_354_819_198);
    let ts = jiff::Timestamp::from_second(epoch as i64)
        .with_context(|| format!("SOURCE_DATE_EPOCH {epoch} is not a time"))?;
    let t = ts.to_zoned(jiff::tz::TimeZone::UTC);
    DateTime::from_date_and_time(
        t.year() as u16,
        t.month() as u8,
        t.day() as u8,
        t.hour() as u8,
        t.minute() as u8,
        t.second() as u8,
    )
    .map_err(|e| anyhow::anyhow!("SOURCE_DATE_EPOCH {epoch} has no zip time: {e}"))
}

/// What a canonical rewrite wrote: every file in the order written (RECORD last) and
/// each one's sha256 (hex), from the very bytes written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonicalWheel {
    pub files: Vec<String>,
    pub file_sha256: BTreeMap<String, String>,
}

/// Writes `wheel` again as `out`, canonically: every file (no directory entries) with
/// the same bytes, the payload sorted, then `.dist-info` sorted with `extra` added and
/// RECORD last, regenerated in that order; every time `epoch`, every mode 0644 or 0755
/// (executable if any execute bit was set), deflate level 6. The input's RECORD must
/// verify first: nothing it does not vouch for is carried over.
pub fn canonical_wheel(
    wheel: &Path,
    out: &Path,
    epoch: u64,
    extra: &[(&str, &[u8])],
) -> Result<CanonicalWheel> {
    let w = Wheel::open(wheel)?;
    let files = w
        .read_verified()
        .with_context(|| format!("{} does not verify before it is rewritten", wheel.display()))?;
    write_canonical(&w, &files, out, epoch, extra)
}

/// [`canonical_wheel`] of `w`, whose files `files` ([`Wheel::read_verified`]) are
/// already in memory: the build checks the same bytes while this compresses them.
pub fn write_canonical(
    w: &Wheel,
    files: &[(String, Vec<u8>)],
    out: &Path,
    epoch: u64,
    extra: &[(&str, &[u8])],
) -> Result<CanonicalWheel> {
    let entries = canonical_order(w, files, extra)?;
    let time = zip_time(epoch)?;
    let options = |executable: bool, size: u64| {
        SimpleFileOptions::default()
            .compression_method(CompressionMethod::Deflated)
            .compression_level(Some(6))
            .last_modified_time(time)
            .unix_permissions(if executable { 0o755 } else { 0o644 })
            .large_file(size >= u32::MAX as u64)
    };
    let file = fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut zip = ZipWriter::new(std::io::BufWriter::new(file));
    let mut record: Vec<RecordEntry> = Vec::new();
    let mut written = CanonicalWheel {
        files: Vec::new(),
        file_sha256: BTreeMap::new(),
    };
    let mut put = |zip: &mut ZipWriter<_>, path: &str, bytes: &[u8], executable: bool| {
        zip.start_file(path, options(executable, bytes.len() as u64))?;
        zip.write_all(bytes)?;
        let digest = Sha256::digest(bytes);
        written.files.push(path.to_string());
        written
            .file_sha256
            .insert(path.to_string(), hex::encode(digest));
        anyhow::Ok(digest)
    };
    for (path, bytes, executable) in &entries {
        let digest = put(&mut zip, path, bytes, *executable)?;
        record.push(RecordEntry {
            path: path.clone(),
            hash: Some(commstack_wheel::format_sha256(&digest)),
            size: Some(bytes.len() as u64),
        });
    }
    // RECORD last, listing every file before it and itself without a hash.
    let record_path = w.record_path();
    record.push(RecordEntry {
        path: record_path.clone(),
        hash: None,
        size: None,
    });
    put(&mut zip, &record_path, &render_record(&record), false)?;
    let mut writer = zip.finish().context("cannot finish the zip archive")?;
    writer.flush()?;
    drop(writer);
    fs::set_permissions(out, fs::Permissions::from_mode(0o644))?;
    // What the report records is what is on disk: read back and verified.
    Wheel::open(out)?
        .verify()
        .with_context(|| format!("{} after the canonical rewrite", out.display()))?;
    Ok(written)
}

/// The canonical wheel's files in the order written, each with its bytes and whether it
/// is executable: the payload sorted, then `.dist-info` sorted with `extra` added (RECORD
/// not among them: it is written last, anew). No symlinks; `extra` may not replace a file.
fn canonical_order<'a>(
    w: &Wheel,
    files: &'a [(String, Vec<u8>)],
    extra: &[(&str, &'a [u8])],
) -> Result<Vec<(String, &'a [u8], bool)>> {
    let wheel = &w.path;
    let bytes_of: BTreeMap<&str, &[u8]> = refs(files).into_iter().collect();
    let record_path = w.record_path();
    let dist_prefix = format!("{}/", w.dist_info);
    let mut payload: BTreeMap<String, (&[u8], bool)> = BTreeMap::new();
    let mut dist: BTreeMap<String, (&[u8], bool)> = BTreeMap::new();
    for e in w.entries.iter().filter(|e| !e.is_dir) {
        if e.is_symlink {
            bail!(
                "{} holds a symlink {}: wheels hold files",
                wheel.display(),
                e.path
            );
        }
        if e.path == record_path {
            continue;
        }
        let bytes = bytes_of
            .get(e.path.as_str())
            .copied()
            .with_context(|| format!("{}: cannot read {}", wheel.display(), e.path))?;
        let place = if e.path.starts_with(&dist_prefix) {
            &mut dist
        } else {
            &mut payload
        };
        place.insert(e.path.clone(), (bytes, e.is_executable()));
    }
    for (name, bytes) in extra {
        let path = format!("{dist_prefix}{name}");
        if dist.insert(path.clone(), (bytes, false)).is_some() {
            bail!("{} already holds {path}", wheel.display());
        }
    }
    Ok(payload
        .into_iter()
        .chain(dist)
        .map(|(path, (bytes, x))| (path, bytes, x))
        .collect())
}

/// A build path found in a shipped file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathFound {
    pub file: String,
    pub path: String,
    pub offset: usize,
    /// The bytes around it, printable ones kept.
    pub context: String,
}

/// `files` as (path, bytes) references, the form the scans take.
pub fn refs(files: &[(String, Vec<u8>)]) -> Vec<(&str, &[u8])> {
    files
        .iter()
        .map(|(n, b)| (n.as_str(), b.as_slice()))
        .collect()
}

/// Every occurrence (the first per file and needle) of one of `needles` in `files` (each
/// path inside the wheel with its bytes).
pub fn scan_files(files: &[(&str, &[u8])], needles: &[String]) -> Vec<PathFound> {
    let mut found = Vec::new();
    for &(name, bytes) in files {
        for needle in needles {
            if let Some(offset) = find(bytes, needle.as_bytes()) {
                let start = offset.saturating_sub(40);
                let end = (offset + needle.len() + 80).min(bytes.len());
                let context: String = bytes[start..end]
                    .iter()
                    .map(|&b| {
                        if b.is_ascii_graphic() || b == b' ' {
                            b as char
                        } else {
                            '.'
                        }
                    })
                    .collect();
                found.push(PathFound {
                    file: name.to_string(),
                    path: needle.clone(),
                    offset,
                    context,
                });
            }
        }
    }
    found
}

/// A path under [`commstack_store::FIXED_BUILD_ROOT`] left in a shipped file, kept
/// because it is the same for the same key (so the bytes stay reproducible), with why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptPath {
    pub file: String,
    pub path: String,
    pub count: usize,
    pub why: String,
}

/// Where a fixed-directory path found in the wheel may stay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixedPathUse {
    /// nvlink writes its command line, `-L` directories included, into the device image
    /// it links (`.note.nv.tkinfo`); no option turns it off. Our own fixed directory there
    /// is the same for the same key.
    NvlinkRecord,
    /// Another step's fixed directory (an input built at its own fixed path, e.g.
    /// NVSHMEM's libnvshmem_device.a linked statically): keyed through that input.
    Inherited,
    /// Our own fixed directory anywhere else: a compiler was not given the prefix map.
    Own,
}

impl FixedPathUse {
    pub fn why(self) -> &'static str {
        match self {
            FixedPathUse::NvlinkRecord => {
                "nvlink records its -L directories in the device image's .note.nv.tkinfo (no option turns it off); they are this build's fixed directory, the same for the same key"
            }
            FixedPathUse::Inherited => {
                "in an input built at its own fixed directory (the same for that input's key, which is in this key): reproducible, but a build path to remove in that step"
            }
            FixedPathUse::Own => "this build's fixed directory outside nvlink's record",
        }
    }
}

/// Every path under `fixed_root` in `files` (each path inside the wheel with its bytes),
/// classified against `own` (this build's fixed directory). Counted per file and path.
pub fn scan_fixed_paths(
    files: &[(&str, &[u8])],
    fixed_root: &str,
    own: &Path,
) -> Vec<(KeptPath, FixedPathUse)> {
    let own = format!("{}/", own.display());
    let mut out: BTreeMap<(String, String), (usize, FixedPathUse)> = BTreeMap::new();
    for &(name, bytes) in files {
        let needle = fixed_root.as_bytes();
        let mut at = 0;
        while let Some(i) = find(&bytes[at..], needle) {
            let start = at + i;
            let end = bytes[start..]
                .iter()
                .position(|&b| !(b.is_ascii_graphic() && b != b',' && b != b'"' && b != b'\''))
                .map_or(bytes.len(), |n| start + n);
            let path = String::from_utf8_lossy(&bytes[start..end]).into_owned();
            let use_ = if !path.starts_with(&own) {
                FixedPathUse::Inherited
            } else if in_nvlink_record(bytes, start) {
                FixedPathUse::NvlinkRecord
            } else {
                FixedPathUse::Own
            };
            let e = out.entry((name.to_string(), path)).or_insert((0, use_));
            e.0 += 1;
            if use_ == FixedPathUse::Own {
                e.1 = use_;
            }
            at = end.max(start + 1);
        }
    }
    out.into_iter()
        .map(|((file, path), (count, use_))| {
            (
                KeptPath {
                    file,
                    path,
                    count,
                    why: use_.why().to_string(),
                },
                use_,
            )
        })
        .collect()
}

/// Whether `offset` is in a `-L` list of nvlink's recorded command line: the
/// NUL-terminated string around it starts with `-arch ` and has ` -L ` before it.
fn in_nvlink_record(bytes: &[u8], offset: usize) -> bool {
    let start = bytes[..offset]
        .iter()
        .rposition(|&b| b == 0)
        .map_or(0, |i| i + 1);
    let before = &bytes[start..offset];
    before.starts_with(b"-arch ")
        && find(before, b" -L ").is_some_and(|l| !before[l + 4..].contains(&b' '))
}

/// memchr's substring search: a naive window scan of a 36 MB extension for each build
/// path was most of the build's checks.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    memchr::memmem::find(haystack, needle)
}

/// The paths no shipped file may name: each given path as it is and canonical, without
/// a trailing `/`, skipping the root and one-component paths (`/tmp`, `/root`: too
/// general to mean a build) and duplicates.
pub fn needles(paths: &[&Path]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in paths {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        for candidate in [Some(abs.clone()), abs.canonicalize().ok()]
            .into_iter()
            .flatten()
        {
            let normal = candidate
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .count();
            if normal < 2 {
                continue;
            }
            let s = candidate.display().to_string();
            let s = s.trim_end_matches('/').to_string();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use commstack_wheel::{WheelBuilder, record_hash};
    use std::io::Read;

    /// The sha256 (hex) of every file in `wheel`, by path inside it.
    fn file_sha256s(wheel: &Path) -> Result<BTreeMap<String, String>> {
        Ok(Wheel::open(wheel)?
            .read_verified()?
            .iter()
            .map(|(name, bytes)| (name.clone(), hex::encode(Sha256::digest(bytes))))
            .collect())
    }

    #[test]
    fn zip_times_follow_the_epoch_and_clamp_to_1980() {
        let t = zip_time(1_796_083_200).unwrap();
        assert_eq!(
            (t.year(), t.month(), t.day(), t.hour(), t.minute()),
            (2026, 12, 1, 0, 0)
        );
        let t = zip_time(0).unwrap();
        assert_eq!((t.year(), t.month(), t.day()), (1980, 1, 1));
    }

    #[test]
    fn needles_skip_the_too_general_and_keep_both_spellings() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let n = needles(&[&link, Path::new("/tmp"), Path::new("/")]);
        assert!(n.contains(&link.display().to_string()), "{n:?}");
        assert!(
            n.contains(&real.canonicalize().unwrap().display().to_string()),
            "{n:?}"
        );
        assert!(!n.iter().any(|s| s == "/tmp" || s == "/"), "{n:?}");
    }

    /// A wheel as bdist_wheel writes one: directory entries, this process's umask in the
    /// modes, the time of writing, files in the order they were made.
    fn sloppy_wheel(dir: &Path, mode: u32, time: DateTime) -> PathBuf {
        let path = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = ZipWriter::new(fs::File::create(&path).unwrap());
        let o = SimpleFileOptions::default()
            .last_modified_time(time)
            .unix_permissions(mode);
        let files: [(&str, &[u8]); 3] = [
            ("demo/z.py", b"z = 1\n"),
            ("demo/a.so", b"\x7fELF..."),
            (
                "demo-1.0.dist-info/WHEEL",
                b"Wheel-Version: 1.0\nGenerator: x\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            ),
        ];
        zip.add_directory("demo/", o).unwrap();
        let mut record = String::new();
        for (name, bytes) in files.iter().chain([&(
            "demo-1.0.dist-info/METADATA",
            &b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n"[..],
        )]) {
            let m = if name.ends_with(".so") {
                mode
            } else {
                mode & 0o666
            };
            zip.start_file(*name, o.unix_permissions(m)).unwrap();
            zip.write_all(bytes).unwrap();
            record.push_str(&format!("{name},{},{}\n", record_hash(bytes), bytes.len()));
        }
        record.push_str("demo-1.0.dist-info/RECORD,,\n");
        zip.start_file("demo-1.0.dist-info/RECORD", o).unwrap();
        zip.write_all(record.as_bytes()).unwrap();
        zip.finish().unwrap();
        path
    }

    #[test]
    fn the_canonical_rewrite_ignores_modes_times_and_order_and_adds_files() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let t1 = DateTime::from_date_and_time(2024, 5, 6, 7, 8, 10).unwrap();
        let t2 = DateTime::from_date_and_time(2025, 1, 2, 3, 4, 6).unwrap();
        let wa = sloppy_wheel(&a, 0o775, t1);
        let wb = sloppy_wheel(&b, 0o700, t2);
        assert_ne!(fs::read(&wa).unwrap(), fs::read(&wb).unwrap());
        let extra: [(&str, &[u8]); 1] = [("commstack-build.json", b"{}\n")];
        let name = "demo-1.0-py3-none-any.whl";
        for d in [&a, &b] {
            fs::create_dir_all(d.join("out")).unwrap();
            fs::create_dir_all(d.join("other")).unwrap();
        }
        let (oa, ob) = (a.join("out").join(name), b.join("out").join(name));
        let written = canonical_wheel(&wa, &oa, 1_796_083_200, &extra).unwrap();
        canonical_wheel(&wb, &ob, 1_796_083_200, &extra).unwrap();
        assert_eq!(fs::read(&oa).unwrap(), fs::read(&ob).unwrap());
        // What the rewrite returns (the report's files and hashes) is what the file holds.
        assert_eq!(written.file_sha256, file_sha256s(&oa).unwrap());
        Wheel::open(&oa).unwrap().verify().unwrap();
        // Sorted payload, then sorted dist-info with the added file, RECORD last.
        let mut z = zip::ZipArchive::new(fs::File::open(&oa).unwrap()).unwrap();
        let names: Vec<String> = (0..z.len())
            .map(|i| z.by_index(i).unwrap().name().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "demo/a.so",
                "demo/z.py",
                "demo-1.0.dist-info/METADATA",
                "demo-1.0.dist-info/WHEEL",
                "demo-1.0.dist-info/commstack-build.json",
                "demo-1.0.dist-info/RECORD"
            ]
        );
        assert_eq!(written.files, names);
        let so = z.by_name("demo/a.so").unwrap();
        assert_eq!(so.unix_mode().map(|m| m & 0o777), Some(0o755));
        assert_eq!(so.last_modified().map(|t| t.year()), Some(2026));
        drop(so);
        let py = z.by_name("demo/z.py").unwrap();
        assert_eq!(py.unix_mode().map(|m| m & 0o777), Some(0o644));
        drop(py);
        // Another epoch is another wheel.
        let oc = a.join("other").join(name);
        canonical_wheel(&wa, &oc, 315_532_800, &extra).unwrap();
        assert_ne!(fs::read(&oa).unwrap(), fs::read(&oc).unwrap());
        // A wheel whose RECORD lies is not rewritten into one that verifies.
        let mut bad = WheelBuilder::new("demo", "1.0")
            .unwrap()
            .tag("py3", "none", "any");
        bad.add_bytes("demo/x.py", b"x\n".to_vec(), false).unwrap();
        let written = bad.write(&d.path().join("bad")).unwrap();
        let tampered = d.path().join("bad/tampered");
        fs::create_dir_all(&tampered).unwrap();
        let t = tampered.join(written.filename.to_string());
        {
            let mut src = zip::ZipArchive::new(fs::File::open(&written.path).unwrap()).unwrap();
            let mut out = ZipWriter::new(fs::File::create(&t).unwrap());
            for i in 0..src.len() {
                let mut e = src.by_index(i).unwrap();
                let name = e.name().unwrap().to_string();
                let mut bytes = Vec::new();
                e.read_to_end(&mut bytes).unwrap();
                if name == "demo/x.py" {
                    bytes = b"changed\n".to_vec();
                }
                out.start_file(name, SimpleFileOptions::default()).unwrap();
                out.write_all(&bytes).unwrap();
            }
            out.finish().unwrap();
        }
        let err = canonical_wheel(&t, &d.path().join(name), 0, &[]).unwrap_err();
        assert!(format!("{err:#}").contains("does not verify"), "{err:#}");
    }

    #[test]
    fn the_scan_names_file_path_and_context() {
        let d = tempfile::tempdir().unwrap();
        let mut b = WheelBuilder::new("demo", "1.0")
            .unwrap()
            .tag("py3", "none", "any");
        b.add_bytes(
            "demo/lib.so",
            b"\0\0/var/tmp/commstack-build/deepep-0123/src/csrc/x.cpp\0".to_vec(),
            true,
        )
        .unwrap();
        b.add_bytes("demo/clean.py", b"print(1)\n".to_vec(), false)
            .unwrap();
        let w = b.write(d.path()).unwrap();
        let files = Wheel::open(&w.path).unwrap().read_verified().unwrap();
        let found = scan_files(&refs(&files), &["/var/tmp/commstack-build".to_string()]);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].file, "demo/lib.so");
        assert_eq!(found[0].offset, 2);
        assert!(found[0].context.contains("csrc/x.cpp"), "{found:?}");
        let hashes = file_sha256s(&w.path).unwrap();
        assert_eq!(
            hashes["demo/clean.py"],
            hex::encode(Sha256::digest(b"print(1)\n"))
        );
    }

    #[test]
    fn the_header_view_copies_includes_with_fixed_times_and_links_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let t = d.path().join("toolkit");
        fs::create_dir_all(t.join("include/cuda/std")).unwrap();
        fs::write(t.join("include/cuda/std/tuple"), "#pragma once\n").unwrap();
        fs::create_dir_all(t.join("bin")).unwrap();
        fs::write(t.join("bin/nvcc"), "").unwrap();
        fs::create_dir_all(t.join("targets/x86_64-linux")).unwrap();
        std::os::unix::fs::symlink("../../include", t.join("targets/x86_64-linux/include"))
            .unwrap();
        fs::create_dir_all(t.join("lib")).unwrap();
        fs::write(t.join("lib/libcudart.so"), "").unwrap();
        let view = d.path().join("deps/toolchain");
        let r = relocate(&d.path().join("deps"), "toolchain", &t, 1_796_083_200).unwrap();
        assert_eq!((r.link.as_path(), r.headers_copied), (view.as_path(), 1));
        // Headers: real copies with the epoch's time, also through the target's link.
        let h = view.join("targets/x86_64-linux/include/cuda/std/tuple");
        let real = h.canonicalize().unwrap();
        assert!(real.starts_with(view.canonicalize().unwrap()), "{real:?}");
        let mtime = fs::metadata(&h).unwrap().modified().unwrap();
        assert_eq!(
            mtime,
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_083_200)
        );
        // bin is a real directory (nvcc's `bin/..` stays in the view); lib a link.
        assert!(!fs::symlink_metadata(view.join("bin")).unwrap().is_symlink());
        assert!(
            fs::symlink_metadata(view.join("bin/nvcc"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(
            view.join("bin/..").canonicalize().unwrap(),
            view.canonicalize().unwrap()
        );
        assert!(fs::symlink_metadata(view.join("lib")).unwrap().is_symlink());
        assert_eq!(through(&r, &t, &t.join("bin/nvcc")), view.join("bin/nvcc"));
    }

    #[test]
    fn fixed_paths_are_told_apart_by_where_they_are() {
        let d = tempfile::tempdir().unwrap();
        let own = Path::new("/var/tmp/commstack-build/deepep-0123");
        let mut b = WheelBuilder::new("demo", "1.0")
            .unwrap()
            .tag("py3", "none", "any");
        // nvlink's record, as in DeepEP's dlink image; NVSHMEM's __FILE__; ours elsewhere.
        let mut so = b"\0-arch sm_90 -m 64 -l nvshmem_device,cudadevrt -L /var/tmp/commstack-build/deepep-0123/deps/nvshmem/lib,/var/tmp/commstack-build/deepep-0123/deps/toolchain/lib -cpu-arch X86_64 \0".to_vec();
        so.extend_from_slice(b"/var/tmp/commstack-build/nvshmem-4567/src/init.cu\0");
        b.add_bytes("demo/a.so", so, true).unwrap();
        b.add_bytes(
            "demo/b.so",
            b"\0/var/tmp/commstack-build/deepep-0123/src/csrc/x.cpp\0".to_vec(),
            true,
        )
        .unwrap();
        let w = b.write(d.path()).unwrap();
        let files = Wheel::open(&w.path).unwrap().read_verified().unwrap();
        let found = scan_fixed_paths(&refs(&files), "/var/tmp/commstack-build", own);
        let uses: Vec<(&str, &str, FixedPathUse)> = found
            .iter()
            .map(|(k, u)| (k.file.as_str(), k.path.as_str(), *u))
            .collect();
        assert_eq!(
            uses,
            [
                (
                    "demo/a.so",
                    "/var/tmp/commstack-build/deepep-0123/deps/nvshmem/lib",
                    FixedPathUse::NvlinkRecord
                ),
                (
                    "demo/a.so",
                    "/var/tmp/commstack-build/deepep-0123/deps/toolchain/lib",
                    FixedPathUse::NvlinkRecord
                ),
                (
                    "demo/a.so",
                    "/var/tmp/commstack-build/nvshmem-4567/src/init.cu",
                    FixedPathUse::Inherited
                ),
                (
                    "demo/b.so",
                    "/var/tmp/commstack-build/deepep-0123/src/csrc/x.cpp",
                    FixedPathUse::Own
                ),
            ]
        );
    }

    /// The wrapper against the real gcc and ld: the rpath DeepEP's setup.py gives becomes
    /// the drop-in's place; other arguments and other rpaths pass unchanged.
    #[test]
    fn the_ld_wrapper_rewrites_exactly_the_named_rpath() {
        let d = tempfile::tempdir().unwrap();
        let cc = Path::new("/usr/bin/gcc");
        if !cc.is_file() {
            panic!("this test needs gcc");
        }
        let ld = real_ld(cc, &[PathBuf::from("/usr/bin"), PathBuf::from("/bin")]).unwrap();
        let nv = d.path().join("store/nvshmem/lib");
        let wrapper_dir = d.path().join("ld");
        write_ld_wrapper(
            &wrapper_dir,
            &ld,
            &[RpathRewrite {
                from: nv.display().to_string(),
                to: "$ORIGIN/nvidia/nvshmem/lib".into(),
            }],
        )
        .unwrap();
        fs::write(d.path().join("f.c"), "int f(void) { return 1; }\n").unwrap();
        let out = d.path().join("f.so");
        let status = std::process::Command::new(cc)
            .current_dir(d.path())
            .args(["-shared", "-fPIC", "f.c", "-o"])
            .arg(&out)
            .arg(format!("-B{}/", wrapper_dir.display()))
            .arg(format!("-Wl,-rpath,{}", nv.display()))
            .arg("-Wl,-rpath,/opt/keep/lib")
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
        assert!(
            String::from_utf8_lossy(&status.stderr).contains("commstack-ld: -rpath"),
            "{status:?}"
        );
        let info = commstack_elf::ElfFile::open(&out)
            .unwrap()
            .dynamic_info()
            .unwrap();
        let path: Vec<String> = info.runpath.iter().chain(&info.rpath).cloned().collect();
        assert_eq!(
            path,
            ["$ORIGIN/nvidia/nvshmem/lib", "/opt/keep/lib"],
            "{info:?}"
        );
    }
}
