//! The unpacker against real archives written here (tar crate, zip crate, raw headers
//! where the builders refuse unsafe names): what it refuses, leaving nothing behind, and
//! what it unpacks, with modes and links right.

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use commstack_archive::{Format, Limits, Options, Strip, copy_tree, copy_tree_except, unpack};
use tar::EntryType;

mod common;
use common::*;

#[test]
fn absolute_paths_are_refused() {
    let d = tempfile::tempdir().unwrap();
    // The absolute name points into the sandbox, where it would land if followed.
    let abs = d.path().join("abs.txt").display().to_string();
    let s = Sandbox::new("a.tar", &tar_bytes(&[file(&abs, 0o644, b"x")]));
    s.refused(&Options::default(), &[&abs, "absolute path"]);
    assert!(!Path::new(&abs).exists());
}

#[test]
fn dotdot_paths_are_refused_in_tar_and_zip() {
    let s = Sandbox::new(
        "a.tar.gz",
        &gz(&tar_bytes(&[
            file("top/ok.txt", 0o644, b"ok"),
            file("top/../../escape.txt", 0o644, b"x"),
        ])),
    );
    s.refused(&top(), &["top/../../escape.txt", "`..`", "leaves"]);

    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    z.start_file("../escape.txt", zip::write::SimpleFileOptions::default())
        .unwrap();
    z.write_all(b"x").unwrap();
    let s = Sandbox::new("a.zip", &z.finish().unwrap().into_inner());
    s.refused(&Options::default(), &["../escape.txt", "`..`"]);
}

/// The archive that got through the tar crate's unpacker: `a -> .`, `b -> a/..`, then a
/// file through `b`.
#[test]
fn chained_symlink_escape_is_refused() {
    let s = Sandbox::new(
        "chain.tar",
        &tar_bytes(&[
            dir("top", 0o755),
            sym("top/a", "."),
            sym("top/b", "a/.."),
            file("top/b/chain-escape.txt", 0o644, b"escaped"),
        ]),
    );
    s.refused(&top(), &["top/b/chain-escape.txt", "symlink top/b"]);
    s.refused(&Options::default(), &["top/b/chain-escape.txt"]);

    // The links alone: b resolves through a to the destination's parent.
    let s = Sandbox::new(
        "chain.tar",
        &tar_bytes(&[dir("top", 0o755), sym("top/a", "."), sym("top/b", "a/..")]),
    );
    s.refused(&top(), &["symlink top/b -> a/..", "leaves the destination"]);
    // Unstripped the root is one level up, so b -> top/.. is still inside...
    let ok = s.dir.path().join("ok");
    unpack(&s.archive, &ok, &Options::default()).unwrap();
    assert_eq!(fs::read_link(ok.join("top/b")).unwrap(), Path::new("a/.."));

    // ...and the file first, the link after: the link still has to resolve inside.
    let s = Sandbox::new(
        "chain.tar",
        &tar_bytes(&[
            file("top/b/chain-escape.txt", 0o644, b"escaped"),
            sym("top/a", "."),
            sym("top/b", "a/.."),
        ]),
    );
    s.refused(&top(), &["entry top/b", "earlier entries lie under it"]);
    assert!(!s.dir.path().join("out/chain-escape.txt").exists());
}

/// What GNU tar stores as a successful step: an archive of links that all point outside.
#[test]
fn links_only_pointing_outside_are_refused() {
    let s = Sandbox::new(
        "links.tar.gz",
        &gz(&tar_bytes(&[
            dir("nvshmem_src", 0o755),
            sym("nvshmem_src/x", "/some/dir"),
            sym("nvshmem_src/y", "/etc/passwd"),
        ])),
    );
    s.refused(&top(), &["symlink nvshmem_src/x -> /some/dir", "absolute"]);

    let s = Sandbox::new(
        "links.tar.gz",
        &gz(&tar_bytes(&[
            dir("nvshmem_src", 0o755),
            sym("nvshmem_src/up", "../.."),
            sym("nvshmem_src/deep", "sub/../../../etc"),
        ])),
    );
    s.refused(&top(), &["nvshmem_src/up", "leaves the destination"]);
}

#[test]
fn link_loops_and_files_under_links_are_refused() {
    let s = Sandbox::new(
        "loop.tar",
        &tar_bytes(&[sym("top/p", "q"), sym("top/q", "p")]),
    );
    s.refused(&top(), &["symlink top/p -> q", "too many links"]);
    let s = Sandbox::new(
        "under.tar",
        &tar_bytes(&[sym("top/l", "sub"), file("top/l/f", 0o644, b"x")]),
    );
    s.refused(&top(), &["top/l/f", "under the symlink top/l"]);
}

#[test]
fn hard_links_outside_or_to_missing_entries_are_refused() {
    for (target, needle) in [
        ("/etc/passwd", "absolute path"),
        ("top/../../x", "`..`"),
        ("top/missing", "not a regular file earlier"),
        ("top/link", "not a regular file earlier"),
    ] {
        let s = Sandbox::new(
            "h.tar",
            &tar_bytes(&[
                file("top/f", 0o644, b"x"),
                sym("top/link", "f"),
                hard("top/h", target),
            ]),
        );
        s.refused(&top(), &[&format!("hard link top/h -> {target}"), needle]);
    }
}

#[test]
fn devices_and_fifos_are_refused() {
    for (kind, what) in [
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
    ] {
        let s = Sandbox::new(
            "dev.tar",
            &tar_bytes(&[file("top/ok", 0o644, b"x"), special("top/dev", kind)]),
        );
        s.refused(&top(), &["entry top/dev", what]);
    }
    // A zip entry whose Unix mode says FIFO.
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let fifo = zip::write::SimpleFileOptions::default();
    z.start_file("fifo", fifo).unwrap();
    let bytes = z.finish().unwrap().into_inner();
    let bytes = set_zip_mode(bytes, "fifo", 0o010644);
    let s = Sandbox::new("dev.zip", &bytes);
    s.refused(&Options::default(), &["entry fifo", "special file"]);
}

#[test]
fn setuid_setgid_and_sticky_bits_are_refused() {
    for (e, name) in [
        (file("top/suid", 0o4755, b"x"), "top/suid"),
        (file("top/sgid", 0o2755, b"x"), "top/sgid"),
        (dir("top/tmp", 0o1777), "top/tmp"),
    ] {
        let s = Sandbox::new("m.tar", &tar_bytes(&[file("top/ok", 0o644, b"x"), e]));
        s.refused(
            &top(),
            &[&format!("entry {name}"), "setuid, setgid or sticky"],
        );
    }
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    z.start_file("suid", zip::write::SimpleFileOptions::default())
        .unwrap();
    let bytes = set_zip_mode(z.finish().unwrap().into_inner(), "suid", 0o104755);
    let s = Sandbox::new("m.whl", &bytes);
    s.refused(&Options::default(), &["entry suid", "setuid"]);
}

#[test]
fn bombs_stop_at_the_limits() {
    let limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 10,
        ..Limits::default()
    };
    let options = Options {
        strip: Strip::TopDir,
        limits,
        ..Options::default()
    };
    // 16 MiB of zeros gzip to a few KiB.
    let zeros = vec![0u8; 16 << 20];
    let s = Sandbox::new(
        "bomb.tar.gz",
        &gz(&tar_bytes(&[file("top/zeros", 0o644, &zeros)])),
    );
    assert!(fs::metadata(&s.archive).unwrap().len() < limits.max_bytes);
    s.refused(
        &options,
        &["more than 1048576 bytes", "top/zeros", "max_bytes"],
    );

    let names: Vec<String> = (0..50).map(|i| format!("top/f{i}")).collect();
    let entries: Vec<E> = names.iter().map(|n| file(n, 0o644, b"")).collect();
    let s = Sandbox::new("many.tar", &tar_bytes(&entries));
    // Ten files and the directory they imply: eleven paths.
    s.refused(&options, &["more than 10 paths", "top/f9", "max_entries"]);

    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    z.start_file(
        "zeros",
        zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated),
    )
    .unwrap();
    z.write_all(&zeros).unwrap();
    let s = Sandbox::new("bomb.zip", &z.finish().unwrap().into_inner());
    s.refused(
        &Options {
            strip: Strip::None,
            limits,
            ..Options::default()
        },
        &["declare 16777216 bytes", "more than 1048576", "max_bytes"],
    );
    // Exactly at the limit is fine.
    let s = Sandbox::new(
        "full.tar",
        &tar_bytes(&[file("top/full", 0o644, &zeros[..1 << 20])]),
    );
    let got = unpack(&s.archive, &s.dest(), &options).unwrap();
    assert_eq!(got.bytes, 1 << 20);
}

/// What the NVSHMEM and DeepEP source steps unpack: a gzip tarball with a pax global
/// header (git archive) and one top directory, stripped.
#[test]
fn a_good_tarball_unpacks_stripped_with_modes_and_links() {
    let mut b = tar::Builder::new(Vec::new());
    let mut pax = tar::Header::new_ustar();
    pax.set_path("pax_global_header").unwrap();
    pax.set_entry_type(EntryType::XGlobalHeader);
    let comment = b"52 comment=567632dd59810d77b3cc05553df953cc0f779799\n";
    pax.set_size(comment.len() as u64);
    pax.set_cksum();
    b.append(&pax, &comment[..]).unwrap();
    let raw = b.into_inner().unwrap();
    let mut bytes = raw;
    let rest = tar_bytes(&[
        dir("nvshmem_src/", 0o755),
        dir("nvshmem_src/private", 0o750),
        file("nvshmem_src/bin/tool", 0o755, b"#!/bin/sh\n"),
        file("nvshmem_src/private/data.txt", 0o640, b"data"),
        file("nvshmem_src/lib/libx.so.1", 0o644, b"ELF"),
        sym("nvshmem_src/lib/libx.so", "libx.so.1"),
        sym("nvshmem_src/libdir", "lib"),
        sym("nvshmem_src/lib/up", "../private/data.txt"),
        hard("nvshmem_src/copy.txt", "nvshmem_src/private/data.txt"),
        file("./nvshmem_src/twice.txt", 0o644, b"first"),
        file("nvshmem_src/twice.txt", 0o600, b"second"),
    ]);
    // Drop the first archive's end-of-archive blocks before appending.
    bytes.truncate(bytes.len() - 1024);
    bytes.extend_from_slice(&rest);
    // Named without an extension: the gzip magic tells the format.
    let s = Sandbox::new("blob", &gz(&bytes));
    assert_eq!(Format::detect(&s.archive).unwrap(), Format::TarGz);
    let dest = s.dest();
    let got = unpack(&s.archive, &dest, &top()).unwrap();
    let mode = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode(""), 0o755);
    assert_eq!(mode("private"), 0o750);
    assert_eq!(mode("bin/tool"), 0o755);
    assert_eq!(mode("private/data.txt"), 0o640);
    assert_eq!(mode("twice.txt"), 0o600);
    assert_eq!(fs::read(dest.join("twice.txt")).unwrap(), b"second");
    assert_eq!(
        fs::read_link(dest.join("lib/libx.so")).unwrap(),
        Path::new("libx.so.1")
    );
    assert_eq!(fs::read(dest.join("libdir/libx.so")).unwrap(), b"ELF");
    assert_eq!(fs::read(dest.join("lib/up")).unwrap(), b"data");
    let ino = |p: &str| fs::metadata(dest.join(p)).unwrap().ino();
    assert_eq!(ino("copy.txt"), ino("private/data.txt"));
    assert_eq!(
        got.files,
        [
            "bin/tool",
            "private/data.txt",
            "lib/libx.so.1",
            "copy.txt",
            "twice.txt"
        ]
        .map(PathBuf::from)
    );
    assert_eq!(got.bytes, 10 + 4 + 3 + 5 + 6);
    // Nothing but the destination is left next to it.
    assert_eq!(fs::read_dir(dest.parent().unwrap()).unwrap().count(), 1);
}

#[test]
fn strip_needs_one_top_directory() {
    let two = tar_bytes(&[file("a/x", 0o644, b"x"), file("b/y", 0o644, b"y")]);
    let s = Sandbox::new("two.tar", &two);
    s.refused(&top(), &["entry b/y is not inside a top directory (a)"]);
    let s = Sandbox::new("file.tar", &tar_bytes(&[file("a", 0o644, b"x")]));
    s.refused(&top(), &["entry a is not inside a top directory"]);
    let s = Sandbox::new("empty.tar", &tar_bytes(&[]));
    s.refused(&top(), &["empty"]);
    // If-single keeps the paths of an archive without one top directory...
    let s = Sandbox::new("two.tar", &two);
    unpack(
        &s.archive,
        &s.dest(),
        &Options::strip(Strip::TopDirIfSingle),
    )
    .unwrap();
    assert!(s.dest().join("a/x").is_file() && s.dest().join("b/y").is_file());
    // ...and strips the one of an archive with it.
    let s = Sandbox::new("one.tar", &tar_bytes(&[file("a/x", 0o644, b"x")]));
    unpack(
        &s.archive,
        &s.dest(),
        &Options::strip(Strip::TopDirIfSingle),
    )
    .unwrap();
    assert!(s.dest().join("x").is_file());
}

#[test]
fn a_good_zip_unpacks_with_modes_and_links() {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let o = zip::write::SimpleFileOptions::default();
    z.add_directory("pkg/", o.unix_permissions(0o755)).unwrap();
    z.start_file("pkg/tool", o.unix_permissions(0o755)).unwrap();
    z.write_all(b"#!/bin/sh\n").unwrap();
    z.start_file("pkg/data.txt", o.unix_permissions(0o640))
        .unwrap();
    z.write_all(b"data").unwrap();
    z.add_symlink("pkg/link", "data.txt", o).unwrap();
    z.add_symlink("pkg/out", "../../x", o).unwrap();
    let bytes = z.finish().unwrap().into_inner();
    let s = Sandbox::new("p.whl", &bytes);
    s.refused(&Options::default(), &["symlink pkg/out -> ../../x"]);

    let s = Sandbox::new("p.zip", &keep_zip_entries(s.archive.as_path(), "pkg/out"));
    let got = unpack(&s.archive, &s.dest(), &Options::default()).unwrap();
    let dest = s.dest();
    let mode = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap().mode() & 0o777;
    assert_eq!(mode("pkg/tool"), 0o755);
    assert_eq!(mode("pkg/data.txt"), 0o640);
    assert_eq!(
        fs::read_link(dest.join("pkg/link")).unwrap(),
        Path::new("data.txt")
    );
    assert_eq!(got.files, ["pkg/tool", "pkg/data.txt"].map(PathBuf::from));
}

#[test]
fn an_existing_destination_is_left_alone() {
    let s = Sandbox::new("a.tar", &tar_bytes(&[file("top/x", 0o644, b"x")]));
    fs::create_dir_all(s.dest()).unwrap();
    fs::write(s.dest().join("mine"), b"mine").unwrap();
    let err = unpack(&s.archive, &s.dest(), &top()).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert_eq!(fs::read(s.dest().join("mine")).unwrap(), b"mine");
}

#[test]
fn copy_tree_keeps_links_and_modes() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path().join("rdma");
    fs::create_dir_all(src.join("usr/lib")).unwrap();
    fs::create_dir_all(src.join(".git")).unwrap();
    fs::write(src.join(".git/HEAD"), "ref").unwrap();
    fs::write(src.join("usr/lib/libibverbs.so.1.14"), "ELF").unwrap();
    fs::set_permissions(
        src.join("usr/lib/libibverbs.so.1.14"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("libibverbs.so.1.14", src.join("usr/lib/libibverbs.so.1")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/abs", src.join("dangling")).unwrap();
    fs::set_permissions(src.join("usr"), fs::Permissions::from_mode(0o750)).unwrap();
    let dest = d.path().join("bundle/rdma-core");
    copy_tree(&src, &dest).unwrap();
    let meta = |p: &str| fs::symlink_metadata(dest.join(p)).unwrap();
    assert_eq!(meta("usr").mode() & 0o777, 0o750);
    assert_eq!(meta("usr/lib/libibverbs.so.1.14").mode() & 0o777, 0o755);
    assert!(meta("usr/lib/libibverbs.so.1").file_type().is_symlink());
    assert_eq!(
        fs::read_link(dest.join("usr/lib/libibverbs.so.1")).unwrap(),
        Path::new("libibverbs.so.1.14")
    );
    assert_eq!(
        fs::read_link(dest.join("dangling")).unwrap(),
        Path::new("/nonexistent/abs")
    );
    assert!(dest.join(".git/HEAD").is_file());
    let err = copy_tree(&src, &dest).unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");

    let no_git = d.path().join("no-git");
    copy_tree_except(&src, &no_git, |rel| {
        rel.file_name() == Some(".git".as_ref())
    })
    .unwrap();
    assert!(!no_git.join(".git").exists() && no_git.join("usr/lib").is_dir());

    // A FIFO is refused, and nothing is left.
    let status = std::process::Command::new("mkfifo")
        .arg(src.join("pipe"))
        .status()
        .unwrap();
    assert!(status.success());
    let dest = d.path().join("again");
    let err = format!("{:#}", copy_tree(&src, &dest).unwrap_err());
    assert!(err.contains("pipe") && err.contains("FIFO"), "{err}");
    assert!(!dest.exists());
    let left: Vec<_> = fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 3, "{left:?}");
}

/// Rewrite the Unix mode in the central directory entry of `name` (the zip writer masks
/// modes to 0o777, so special types and setuid bits are written by hand).
fn set_zip_mode(mut bytes: Vec<u8>, name: &str, mode: u32) -> Vec<u8> {
    let sig = b"PK\x01\x02";
    let at = (0..bytes.len() - 4)
        .find(|&i| {
            &bytes[i..i + 4] == sig && {
                let n = u16::from_le_bytes([bytes[i + 28], bytes[i + 29]]) as usize;
                &bytes[i + 46..i + 46 + n] == name.as_bytes()
            }
        })
        .expect("the central directory entry");
    // Made by Unix (the high byte of "version made by"), external attributes = mode << 16.
    bytes[at + 5] = 3;
    bytes[at + 38..at + 42].copy_from_slice(&(mode << 16).to_le_bytes());
    bytes
}

/// The zip at `path` without the entry `drop`.
fn keep_zip_entries(path: &Path, drop: &str) -> Vec<u8> {
    let mut src = zip::ZipArchive::new(File::open(path).unwrap()).unwrap();
    let mut dst = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for i in 0..src.len() {
        let f = src.by_index_raw(i).unwrap();
        if f.name().unwrap() != drop {
            dst.raw_copy_file(f).unwrap();
        }
    }
    dst.finish().unwrap().into_inner()
}

/// Entry names and link targets are the archive's text: shown escaped in errors, so a
/// crafted name cannot drive the terminal.
#[test]
fn hostile_names_are_escaped_in_errors() {
    let s = Sandbox::new(
        "a.tar.gz",
        &gz(&tar_bytes(&[
            file("top/ok.txt", 0o644, b"ok"),
            file("top/../\u{1b}]0;pwned\u{7}.txt", 0o644, b"x"),
        ])),
    );
    let err = s.refused(&top(), &["top/../\\x1b]0;pwned\\x07.txt"]);
    assert!(!err.contains('\u{1b}'), "{err:?}");
    let s = Sandbox::new(
        "b.tar.gz",
        &gz(&tar_bytes(&[
            dir("top", 0o755),
            sym("top/x", "/etc/\u{1b}[2J"),
        ])),
    );
    let err = s.refused(&top(), &["\\x1b[2J"]);
    assert!(!err.contains('\u{1b}'), "{err:?}");
}

/// Read-only directories keep their modes, applied after the tree is moved into place
/// (moving a read-only directory to another parent is refused to a non-root user).
#[test]
fn read_only_directories_get_their_modes_after_the_move() {
    let s = Sandbox::new(
        "ro.tar.gz",
        &gz(&tar_bytes(&[
            dir("top", 0o555),
            dir("top/sub", 0o555),
            file("top/sub/f.txt", 0o444, b"x"),
        ])),
    );
    unpack(&s.archive, &s.dest(), &top()).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&s.dest()), 0o555);
    assert_eq!(mode(&s.dest().join("sub")), 0o555);
    assert_eq!(fs::read(s.dest().join("sub/f.txt")).unwrap(), b"x");
    assert_eq!(s.written().len(), 4, "{:?}", s.written());
    for d in [s.dest().join("sub"), s.dest()] {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// With `plain_dir_modes` (wheels) the same directories get 0755, files keep theirs.
#[test]
fn plain_dir_modes_give_every_directory_0755() {
    let s = Sandbox::new(
        "ro.tar.gz",
        &gz(&tar_bytes(&[
            dir("top", 0o555),
            dir("top/sub", 0o000),
            file("top/sub/f.txt", 0o444, b"x"),
        ])),
    );
    let plain = Options {
        plain_dir_modes: true,
        ..top()
    };
    unpack(&s.archive, &s.dest(), &plain).unwrap();
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&s.dest()), 0o755);
    assert_eq!(mode(&s.dest().join("sub")), 0o755);
    assert_eq!(mode(&s.dest().join("sub/f.txt")), 0o444);
}

/// A root filesystem layer of our own: absolute links are kept as written (never followed
/// while unpacking), relative ones are still checked; without the option they are refused.
#[test]
fn absolute_symlinks_are_kept_only_when_asked() {
    let bytes = tar_bytes(&[
        dir("bin", 0o755),
        sym("bin/python3", "/usr/bin/python3.11"),
        sym("bin/up", "../../.."),
    ]);
    let s = Sandbox::new("layer.tar", &bytes);
    let keep = Options {
        keep_absolute_symlinks: true,
        ..Options::default()
    };
    s.refused(&keep, &["bin/up", "leaves the destination"]);

    let bytes = tar_bytes(&[dir("bin", 0o755), sym("bin/python3", "/usr/bin/python3.11")]);
    let s = Sandbox::new("layer.tar", &bytes);
    s.refused(&Options::default(), &["bin/python3", "absolute"]);
    unpack(&s.archive, &s.dest(), &keep).unwrap();
    assert_eq!(
        fs::read_link(s.dest().join("bin/python3")).unwrap(),
        Path::new("/usr/bin/python3.11")
    );
}
