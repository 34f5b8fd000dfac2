//! Bounds that bound (docs/bounds.md): what an archive may write and read follows what it
//! can legitimately be (its size, a ratio to it, the free space), and each bound is
//! checked before the work it bounds, the refusal naming the bound and what exceeded it.

use std::fs::{self, File};
use std::io::{self, Read, Write};

use commstack_archive::{Limits, Options, Strip, unpack};
use tar::{EntryType, Header};

mod common;
use common::*;

/// A tar.gz written as a stream: one regular file `name` of `size` bytes of `byte`.
fn streamed_tar_gz(path: &std::path::Path, name: &str, size: u64, byte: u8) {
    let gz =
        flate2::write::GzEncoder::new(File::create(path).unwrap(), flate2::Compression::best());
    let mut b = tar::Builder::new(gz);
    let mut h = Header::new_gnu();
    h.set_path(name).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, io::repeat(byte).take(size)).unwrap();
    b.into_inner().unwrap().finish().unwrap();
}

/// A raw header of `kind` for `name` holding `size` bytes (its data follows).
fn raw_header(name: &[u8], kind: EntryType, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(size);
    h.set_cksum();
    h
}

/// A tar.gz of a plain file, then a file named by a GNU long name of `name` (or, with
/// `pax`, by a pax extended header's `path` record), streamed so that a huge name costs
/// no memory here. (The first entry matters: with no path known yet, a lookup of the long
/// one's parents cost nothing even when it was quadratic.)
fn long_name_tar_gz(path: &std::path::Path, name: impl Fn() -> Box<dyn Read>, len: u64, pax: bool) {
    let gz =
        flate2::write::GzEncoder::new(File::create(path).unwrap(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    b.append(&raw_header(b"first", EntryType::Regular, 1), &b"x"[..])
        .unwrap();
    if pax {
        // "<len> path=<name>\n", the length counting itself.
        let body = len + " path=\n".len() as u64;
        let mut digits = body.to_string().len() as u64;
        while (body + digits).to_string().len() as u64 != digits {
            digits += 1;
        }
        let record_len = body + digits;
        let h = raw_header(b"PaxHeaders/x", EntryType::XHeader, record_len);
        let head = format!("{record_len} path=");
        let record = io::Cursor::new(head.into_bytes())
            .chain(name())
            .chain(io::Cursor::new(b"\n".to_vec()));
        b.append(&h, record).unwrap();
    } else {
        let h = raw_header(b"././@LongLink", EntryType::GNULongName, len + 1);
        b.append(&h, name().chain(io::Cursor::new(vec![0u8])))
            .unwrap();
    }
    b.append(&raw_header(b"x", EntryType::Regular, 1), &b"x"[..])
        .unwrap();
    b.into_inner().unwrap().finish().unwrap();
}

fn repeat(unit: &'static [u8], times: usize) -> impl Fn() -> Box<dyn Read> {
    move || Box::new(io::Cursor::new(unit.repeat(times)))
}

/// 100 MiB of zeros gzip to about 100 KiB: with the default limits it may expand to
/// 64 MiB (min_expansion; 100 times its size is less), so the entry is refused from its
/// header, before a byte of it is written.
#[test]
fn a_gzip_bomb_is_refused_by_its_expansion_bound_before_it_is_written() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("in")).unwrap();
    let archive = d.path().join("in/bomb.tar.gz");
    streamed_tar_gz(&archive, "top/zeros", 100 << 20, 0);
    let size = fs::metadata(&archive).unwrap().len();
    assert!(size < 1 << 20, "{size}");
    let s = Sandbox { dir: d, archive };
    let err = s.refused(
        &Options::strip(Strip::TopDir),
        &[
            "more than 67108864 bytes of content",
            "top/zeros, 104857600 bytes",
            "before writing it",
            &format!("100 times the archive's {size} bytes (Limits::max_ratio)"),
            "Limits::min_expansion",
        ],
    );
    assert!(!err.contains('\n'), "{err}");
}

/// The decompressed stream is bounded too, headers included: thousands of empty files
/// write nothing but read 512 bytes each.
#[test]
fn the_decompressed_stream_is_bounded_headers_included() {
    let names: Vec<String> = (0..5000).map(|i| format!("top/f{i}")).collect();
    let entries: Vec<E> = names.iter().map(|n| file(n, 0o644, b"")).collect();
    let s = Sandbox::new("many.tar.gz", &gz(&tar_bytes(&entries)));
    let limits = Limits {
        max_ratio: 2,
        min_expansion: 1 << 20,
        ..Limits::default()
    };
    let options = Options {
        limits,
        ..Options::default()
    };
    s.refused(
        &options,
        &[
            "expands to more than 1048576 bytes",
            "refused as a decompression bomb",
            "Limits::max_ratio",
        ],
    );
}

/// What may be written is also bounded by the destination's free space (less what must
/// stay free), checked before each file: here nothing may be written, so an archive of
/// empty files unpacks and one with content is refused, naming the free space.
#[test]
fn the_free_space_bounds_what_an_archive_may_write() {
    let options = Options {
        limits: Limits {
            min_free: u64::MAX,
            ..Limits::default()
        },
        ..Options::default()
    };
    let s = Sandbox::new("empty.tar", &tar_bytes(&[file("top/empty", 0o644, b"")]));
    unpack(&s.archive, &s.dest(), &options).unwrap();
    let s = Sandbox::new(
        "one.tar",
        &tar_bytes(&[file("top/f", 0o644, b"0123456789")]),
    );
    s.refused(
        &options,
        &[
            "at entry top/f, 10 bytes",
            "before writing it",
            "the free space of",
            "Limits::min_free",
            "cargo xtask store gc",
        ],
    );
}

/// A GNU long name or a pax path of 64 MiB (64 KiB gzip'd) is not read whole: the reader
/// under the tar crate stops after the bytes one entry's headers may take, and the
/// refusal is one short line, not the name.
#[test]
fn a_huge_long_name_is_refused_before_it_is_read_whole() {
    for pax in [false, true] {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("in")).unwrap();
        let archive = d.path().join("in/long.tar.gz");
        long_name_tar_gz(&archive, repeat(b"a", 64 << 20), 64 << 20, pax);
        let s = Sandbox { dir: d, archive };
        let err = s.refused(
            &Options::default(),
            &[
                "the headers of entry 2",
                "refused before reading them whole",
                "Limits::max_name = 4096",
            ],
        );
        assert!(
            err.len() < 1000,
            "pax {pax}: {} bytes of message",
            err.len()
        );
    }
}

/// A name over PATH_MAX, but small enough to read, is refused by its length, its start
/// shown.
#[test]
fn a_name_longer_than_path_max_is_refused_by_its_length() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("in")).unwrap();
    let archive = d.path().join("in/long.tar.gz");
    long_name_tar_gz(&archive, repeat(b"b", 5000), 5000, false);
    let s = Sandbox { dir: d, archive };
    let err = s.refused(
        &Options::default(),
        &[
            "is 5000 bytes long, more than 4096",
            "Limits::max_name",
            "(5000 bytes in all)",
        ],
    );
    assert!(err.len() < 1500, "{err}");
}

/// One path of many components (a few KB of archive) is refused at once by its depth,
/// and a GNU long name of a million components (a 2 MB name in a few KB of gzip: the
/// archive that ran for hours) by the header bound, before any directory is made.
#[test]
fn a_path_of_many_components_is_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("in")).unwrap();
    let archive = d.path().join("in/deep.tar.gz");
    long_name_tar_gz(&archive, repeat(b"a/", 2000), 4000, false);
    let s = Sandbox { dir: d, archive };
    s.refused(
        &Options::default(),
        &[
            "has 2000 path components, more than 128",
            "Limits::max_depth",
        ],
    );

    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("in")).unwrap();
    let archive = d.path().join("in/deeper.tar.gz");
    long_name_tar_gz(&archive, repeat(b"a/", 1_000_000), 2_000_000, false);
    assert!(fs::metadata(&archive).unwrap().len() < 20_000);
    let s = Sandbox { dir: d, archive };
    s.refused(&Options::default(), &["Limits::max_name"]);

    // A link whose target has many components, under PATH_MAX.
    let target = "../".repeat(1300);
    let s = Sandbox::new("link.tar", &tar_bytes_long_link("top/l", &target));
    s.refused(
        &Options::default(),
        &[
            "symlink top/l",
            "1301 components, more than 128",
            "Limits::max_depth",
        ],
    );
}

/// `sym`, with a GNU long link for a target longer than the header's 100 bytes.
fn tar_bytes_long_link(name: &str, target: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut long = raw_header(
        b"././@LongLink",
        EntryType::GNULongLink,
        target.len() as u64 + 1,
    );
    long.set_cksum();
    out.extend_from_slice(long.as_bytes());
    let mut data = target.as_bytes().to_vec();
    data.push(0);
    data.resize(data.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&data);
    let link = raw_header(name.as_bytes(), EntryType::Symlink, 0);
    out.extend_from_slice(link.as_bytes());
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// The zip at `bytes`: (local records, central directory entries, the end record).
fn zip_parts(bytes: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let eocd = (0..bytes.len() - 3)
        .rev()
        .find(|&i| &bytes[i..i + 4] == b"PK\x05\x06")
        .unwrap();
    let cd = u32::from_le_bytes(bytes[eocd + 16..eocd + 20].try_into().unwrap()) as usize;
    (bytes[..cd].to_vec(), bytes[cd..eocd].to_vec())
}

/// An end-of-central-directory record for `entries` entries of `size` bytes at `offset`.
fn eocd(entries: u16, size: u32, offset: u32) -> Vec<u8> {
    let mut e = b"PK\x05\x06".to_vec();
    e.extend_from_slice(&[0, 0, 0, 0]);
    e.extend_from_slice(&entries.to_le_bytes());
    e.extend_from_slice(&entries.to_le_bytes());
    e.extend_from_slice(&size.to_le_bytes());
    e.extend_from_slice(&offset.to_le_bytes());
    e.extend_from_slice(&[0, 0]);
    e
}

/// Entry `a` is stored and its data is the whole local record of entry `b` (1 MiB of
/// zeros, deflated): two central entries, one local byte range inside the other. The
/// quoted-overlap construction of zip bombs; every entry named as its local header says.
#[test]
fn zip_entries_that_share_bytes_are_refused() {
    let one = |name: &str, data: &[u8], method| {
        let mut z = zip::ZipWriter::new(io::Cursor::new(Vec::new()));
        z.start_file(
            name,
            zip::write::SimpleFileOptions::default().compression_method(method),
        )
        .unwrap();
        z.write_all(data).unwrap();
        z.finish().unwrap().into_inner()
    };
    let b = one("b", &vec![0u8; 1 << 20], zip::CompressionMethod::Deflated);
    let (b_local, b_central) = zip_parts(&b);
    let a = one("a", &b_local, zip::CompressionMethod::Stored);
    let (a_local, a_central) = zip_parts(&a);
    // Where a's data starts: after its 30-byte header, name and extra field.
    let extra = u16::from_le_bytes([a_local[28], a_local[29]]) as usize;
    let a_data = 30 + 1 + extra;
    assert_eq!(&a_local[a_data..a_data + 4], b"PK\x03\x04");
    let mut b_central = b_central;
    b_central[42..46].copy_from_slice(&(a_data as u32).to_le_bytes());
    let mut bytes = a_local.clone();
    let cd_start = bytes.len() as u32;
    bytes.extend_from_slice(&a_central);
    bytes.extend_from_slice(&b_central);
    let cd_size = bytes.len() as u32 - cd_start;
    bytes.extend_from_slice(&eocd(2, cd_size, cd_start));
    let s = Sandbox::new("overlap.zip", &bytes);
    s.refused(
        &Options::default(),
        &[
            "entries a and b share bytes of the archive",
            "overlapping entries multiply",
        ],
    );
}
