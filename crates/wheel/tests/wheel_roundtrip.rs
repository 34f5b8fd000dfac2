//! Wheels written by commstack-wheel, read back, unpacked, and installed by the real pip.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use commstack_wheel::{
    InstallLayout, RecordMismatch, RecordProblem, Wheel, WheelBuilder, install, parse_record,
    unpack,
};

fn demo_builder(dir: &Path) -> WheelBuilder {
    let tool = dir.join("tool.sh");
    fs::write(&tool, "#!/bin/sh\necho tool-ran\n").unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o755)).unwrap();
    let license = dir.join("LICENSE");
    fs::write(&license, "demo license\n").unwrap();

    let mut b = WheelBuilder::new("Commstack_Demo.pkg", "1.0+Local-ABC")
        .unwrap()
        .tag("py3", "none", "any")
        .root_is_purelib(true)
        .metadata("Summary", "a demo")
        .metadata("License-File", "LICENSE")
        .description("Demo body.\n");
    b.add_bytes(
        "commstack_demo/__init__.py",
        b"VALUE = 'hello'\n".to_vec(),
        false,
    )
    .unwrap();
    b.add_file("commstack_demo/tool.sh", &tool).unwrap();
    b.add_bytes("commstack_demo/data,with,commas.txt", b"x".to_vec(), false)
        .unwrap();
    b.add_dist_info_file("licenses/LICENSE", &license).unwrap();
    b
}

#[test]
fn written_wheel_is_deterministic_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let a = demo_builder(tmp.path())
        .write(&tmp.path().join("a"))
        .unwrap();
    let b = demo_builder(tmp.path())
        .write(&tmp.path().join("b"))
        .unwrap();
    assert_eq!(
        a.filename.to_string(),
        "commstack_demo_pkg-1.0+local.abc-py3-none-any.whl"
    );
    assert_eq!(
        fs::read(&a.path).unwrap(),
        fs::read(&b.path).unwrap(),
        "same inputs, same bytes"
    );

    let wheel = Wheel::open(&a.path).unwrap();
    wheel.verify().unwrap();
    // Read into memory in one pass, verified the same way: every file, in archive order.
    let files = wheel.read_verified().unwrap();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let entries: Vec<&str> = wheel
        .entries
        .iter()
        .filter(|e| !e.is_dir)
        .map(|e| e.path.as_str())
        .collect();
    assert_eq!(names, entries);
    for (name, bytes) in &files {
        assert_eq!(*bytes, wheel.read(name).unwrap(), "{name}");
    }
    assert_eq!(
        wheel.dist_info,
        "commstack_demo_pkg-1.0+local.abc.dist-info"
    );
    assert_eq!(wheel.version().unwrap().to_string(), "1.0+local.abc");
    assert!(wheel.root_is_purelib());
    // RECORD is the last entry, dist-info after the payload.
    let last = wheel.entries.last().unwrap();
    assert_eq!(
        last.path,
        "commstack_demo_pkg-1.0+local.abc.dist-info/RECORD"
    );
    assert!(
        wheel
            .entries
            .iter()
            .find(|e| e.path.ends_with("tool.sh"))
            .unwrap()
            .is_executable()
    );

    let out = tmp.path().join("unpacked");
    let installed = unpack(&a.path, &out).unwrap();
    assert_eq!(installed.files.len(), wheel.record.len());
    let mode = fs::metadata(out.join("commstack_demo/tool.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let mode = fs::metadata(out.join("commstack_demo/__init__.py"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}

#[test]
fn tampered_record_is_reported_with_every_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let good = demo_builder(tmp.path()).write(tmp.path()).unwrap();
    // Rewrite the archive with one changed file but the old RECORD.
    let bad_path = tmp.path().join("bad").join(good.filename.to_string());
    fs::create_dir_all(bad_path.parent().unwrap()).unwrap();
    {
        let mut src = zip::ZipArchive::new(fs::File::open(&good.path).unwrap()).unwrap();
        let mut dst = zip::ZipWriter::new(fs::File::create(&bad_path).unwrap());
        for i in 0..src.len() {
            let f = src.by_index(i).unwrap();
            let name = f.name().unwrap().to_string();
            if name.ends_with("__init__.py") {
                drop(f);
                dst.start_file(name, zip::write::SimpleFileOptions::default())
                    .unwrap();
                std::io::Write::write_all(&mut dst, b"VALUE = 'evil'\n").unwrap();
            } else {
                dst.raw_copy_file(f).unwrap();
            }
        }
        dst.start_file("extra.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        dst.finish().unwrap();
    }
    let err = Wheel::open(&bad_path).unwrap().verify().unwrap_err();
    // The in-memory read refuses it with the same problems.
    let read_err = Wheel::open(&bad_path).unwrap().read_verified().unwrap_err();
    assert_eq!(
        read_err
            .downcast_ref::<RecordMismatch>()
            .map(|m| &m.problems),
        err.downcast_ref::<RecordMismatch>().map(|m| &m.problems)
    );
    let mismatch = err
        .downcast_ref::<RecordMismatch>()
        .expect("a RecordMismatch");
    assert!(mismatch.problems.iter().any(
        |p| matches!(p, RecordProblem::HashMismatch { path, .. } if path.ends_with("__init__.py"))
    ));
    assert!(
        mismatch
            .problems
            .iter()
            .any(|p| matches!(p, RecordProblem::NotInRecord { path } if path == "extra.txt"))
    );
    // Unpacking checks before it places anything, and refuses the same wheel leaving
    // nothing behind (not its staging directory, nor the directory it made for it).
    let out = tmp.path().join("out");
    assert!(unpack(&bad_path, &out).is_err());
    assert!(!out.exists());
}

#[test]
fn install_maps_data_scripts_to_bin() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b =
        WheelBuilder::new("toolpkg", "2.0")
            .unwrap()
            .tag("py3", "none", "manylinux_2_17_x86_64");
    b.add_bytes(
        "toolpkg-2.0.data/scripts/toolbin",
        b"\x7fELF-pretend".to_vec(),
        true,
    )
    .unwrap();
    b.add_bytes("toolpkg/__init__.py", Vec::new(), false)
        .unwrap();
    let w = b.write(tmp.path()).unwrap();
    let root = tmp.path().join("prefix");
    install(&w.path, &InstallLayout::prefix(&root)).unwrap();
    let bin = root.join("bin/toolbin");
    assert_eq!(
        fs::metadata(&bin).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert!(root.join("toolpkg/__init__.py").is_file());
    assert!(!root.join("toolpkg-2.0.data").exists());
    // A second install finds the files there and replaces none; no staging is left.
    let err = format!(
        "{:#}",
        install(&w.path, &InstallLayout::prefix(&root)).unwrap_err()
    );
    assert!(err.contains("does another wheel own it?"), "{err}");
    let mut top: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, ["bin", "toolpkg", "toolpkg-2.0.dist-info"]);
}

/// The real pip installs what we write, and the RECORD it keeps verifies.
#[test]
fn pip_installs_our_wheel_and_its_record_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let wheel = demo_builder(tmp.path()).write(tmp.path()).unwrap();
    let venv = tmp.path().join("venv");
    run(Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv));
    // --without-pip + the host pip targeting the venv keeps this test fast (no ensurepip).
    let py = venv.join("bin/python");
    run(Command::new("python3")
        .args(["-m", "pip", "--python"])
        .arg(&py)
        .args([
            "install",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
        ])
        .arg(&wheel.path));
    let show = run(Command::new("python3")
        .args(["-m", "pip", "--python"])
        .arg(&py)
        .args(["show", "-f", "commstack-demo-pkg"]));
    assert!(show.contains("Version: 1.0+local.abc"), "{show}");
    let out = run(Command::new(&py).args(["-c", "import commstack_demo, os; print(commstack_demo.VALUE); print(os.access(os.path.join(os.path.dirname(commstack_demo.__file__), 'tool.sh'), os.X_OK))"]));
    assert_eq!(out.trim(), "hello\nTrue");

    // The installed RECORD: every hashed file on disk matches.
    let site = run(Command::new(&py).args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['purelib'])",
    ]));
    let site = Path::new(site.trim());
    let record_path = site.join("commstack_demo_pkg-1.0+local.abc.dist-info/RECORD");
    let record = parse_record(&fs::read(&record_path).unwrap()).unwrap();
    let mut checked = 0;
    for e in &record {
        let Some(hash) = &e.hash else { continue };
        let bytes = fs::read(site.join(&e.path)).unwrap();
        assert_eq!(&commstack_wheel::record_hash(&bytes), hash, "{}", e.path);
        assert_eq!(e.size, Some(bytes.len() as u64));
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} hashed rows in {}",
        record_path.display()
    );
}

/// Reads and unpacks a real PyPI wheel and runs the binary inside.
/// Needs PyPI: `cargo test -p commstack-wheel -- --ignored`.
#[test]
#[ignore = "downloads ninja 1.13.0 from PyPI"]
fn real_pypi_wheel_unpacks_and_runs() {
    let tmp = tempfile::tempdir().unwrap();
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
        ])
        .arg(tmp.path())
        .args(["--platform", "manylinux2014_x86_64", "ninja==1.13.0"]));
    let whl = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .unwrap();
    let w = Wheel::open(&whl).unwrap();
    w.verify().unwrap();
    assert_eq!(w.name(), "ninja");
    let root = tmp.path().join("prefix");
    install(&whl, &InstallLayout::prefix(&root)).unwrap();
    let v = run(Command::new(root.join("bin/ninja")).arg("--version"));
    // Kitware's build says `1.13.0.git.kitware.jobserver-pipe-1`.
    assert!(v.trim().starts_with("1.13.0"), "{v}");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A file added to a built wheel's dist-info: every other entry keeps its bytes, RECORD
/// lists the new file with its hash, the wheel verifies, and the same name twice is refused.
#[test]
fn a_dist_info_file_is_added_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let written = demo_builder(dir.path()).write(dir.path()).unwrap();
    let before = Wheel::open(&written.path).unwrap();
    let payload: Vec<(String, Vec<u8>)> = before
        .entries
        .iter()
        .filter(|e| !e.is_dir && !e.path.ends_with("/RECORD"))
        .map(|e| (e.path.clone(), before.read(&e.path).unwrap()))
        .collect();

    commstack_wheel::add_dist_info_file(&written.path, "commstack-build.json", b"{\"a\":1}\n")
        .unwrap();
    let after = Wheel::open(&written.path).unwrap();
    after.verify().unwrap();
    for (path, bytes) in &payload {
        assert_eq!(&after.read(path).unwrap(), bytes, "{path} changed");
    }
    let added = format!("{}/commstack-build.json", after.dist_info);
    assert_eq!(after.read(&added).unwrap(), b"{\"a\":1}\n");
    assert!(
        after
            .record
            .iter()
            .any(|r| r.path == added && r.hash.is_some())
    );
    assert_eq!(after.entries.last().unwrap().path, after.record_path());

    let err = commstack_wheel::add_dist_info_file(&written.path, "commstack-build.json", b"x")
        .unwrap_err();
    assert!(format!("{err:#}").contains("already holds"), "{err:#}");
}

/// A file of the archive named with a newline (not in RECORD): each problem stays on its
/// own line, escaped, so the name cannot forge a line of the report.
#[test]
fn a_newline_in_an_entry_name_stays_in_its_line_of_the_report() {
    let tmp = tempfile::tempdir().unwrap();
    let good = demo_builder(tmp.path()).write(tmp.path()).unwrap();
    let bad_path = tmp.path().join("bad").join(good.filename.to_string());
    fs::create_dir_all(bad_path.parent().unwrap()).unwrap();
    {
        let mut src = zip::ZipArchive::new(fs::File::open(&good.path).unwrap()).unwrap();
        let mut dst = zip::ZipWriter::new(fs::File::create(&bad_path).unwrap());
        for i in 0..src.len() {
            dst.raw_copy_file(src.by_index(i).unwrap()).unwrap();
        }
        dst.start_file(
            "x\nall wheels verified\n",
            zip::write::SimpleFileOptions::default(),
        )
        .unwrap();
        dst.finish().unwrap();
    }
    for err in [
        Wheel::open(&bad_path).unwrap().verify().unwrap_err(),
        unpack(&bad_path, &tmp.path().join("out")).unwrap_err(),
    ] {
        let text = format!("{err:#}");
        assert!(
            text.lines().all(|l| !l.starts_with("all wheels verified")),
            "{text}"
        );
        assert!(text.contains("x\\nall wheels verified\\n"), "{text}");
    }
}

/// A RECORD of zeros, 64 MiB and one byte inflated from a few dozen KiB: refused by its
/// bound, not read whole into memory (docs/bounds.md).
#[test]
fn a_dist_info_bomb_is_refused_at_its_bound() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bomb-1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    let deflated = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let text = [
        (
            "METADATA",
            "Metadata-Version: 2.1\nName: bomb\nVersion: 1.0\n",
        ),
        ("WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"),
    ];
    for (name, body) in text {
        zip.start_file(format!("bomb-1.0.dist-info/{name}"), deflated)
            .unwrap();
        zip.write_all(body.as_bytes()).unwrap();
    }
    zip.start_file("bomb-1.0.dist-info/RECORD", deflated)
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..commstack_wheel::DIST_INFO_MAX >> 20 {
        zip.write_all(&zeros).unwrap();
    }
    zip.write_all(b"\n").unwrap();
    zip.finish().unwrap();
    assert!(fs::metadata(&path).unwrap().len() < 1 << 20);

    let err = format!("{:#}", Wheel::open(&path).unwrap_err());
    assert!(
        err.contains(
            "bomb-1.0.dist-info/RECORD is over 67108864 bytes: refused as a decompression bomb"
        ),
        "{err}"
    );
    let root = tmp.path().join("prefix");
    let err = format!(
        "{:#}",
        install(&path, &InstallLayout::prefix(&root)).unwrap_err()
    );
    assert!(err.contains("refused as a decompression bomb"), "{err}");
    assert!(!root.exists());
}

/// `x` and `<name>.data/purelib/x` install to one path: refused before any file is
/// placed, and the layout's directories it would have made are not made.
#[test]
fn two_entries_for_one_path_install_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = WheelBuilder::new("twice", "1.0")
        .unwrap()
        .tag("py3", "none", "any")
        .root_is_purelib(true);
    b.add_bytes("twice/a.py", b"A = 1\n".to_vec(), false)
        .unwrap();
    b.add_bytes("twice-1.0.data/scripts/tool", b"#!/bin/sh\n".to_vec(), true)
        .unwrap();
    b.add_bytes(
        "twice-1.0.data/purelib/twice/a.py",
        b"A = 2\n".to_vec(),
        false,
    )
    .unwrap();
    let w = b.write(tmp.path()).unwrap();
    let root = tmp.path().join("prefix");
    let err = format!(
        "{:#}",
        install(&w.path, &InstallLayout::prefix(&root)).unwrap_err()
    );
    assert!(
        // Archive order: the builder writes its entries sorted.
        err.contains("entries twice-1.0.data/purelib/twice/a.py and twice/a.py both install to"),
        "{err}"
    );
    assert!(err.contains("refused, nothing written"), "{err}");
    assert!(
        !root.exists(),
        "the refused install left {}",
        root.display()
    );
}

/// A later file that cannot be placed (another wheel's file is there) takes back every
/// file and directory the install had made; what was there stays as it was.
#[test]
fn a_failed_install_takes_back_what_it_placed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = WheelBuilder::new("late", "1.0")
        .unwrap()
        .tag("py3", "none", "any")
        .root_is_purelib(true);
    // Archive order (sorted): the script, then late/..., late/zz.py last.
    b.add_bytes("late-1.0.data/scripts/tool", b"#!/bin/sh\n".to_vec(), true)
        .unwrap();
    b.add_bytes("late/__init__.py", Vec::new(), false).unwrap();
    b.add_bytes("late/deep/er/mod.py", b"X = 1\n".to_vec(), false)
        .unwrap();
    b.add_bytes("late/zz.py", b"Z = 1\n".to_vec(), false)
        .unwrap();
    let w = b.write(tmp.path()).unwrap();
    let root = tmp.path().join("prefix");
    fs::create_dir_all(root.join("late")).unwrap();
    fs::write(root.join("late/zz.py"), "another wheel's\n").unwrap();

    let err = format!(
        "{:#}",
        install(&w.path, &InstallLayout::prefix(&root)).unwrap_err()
    );
    assert!(err.contains("late/zz.py"), "{err}");
    assert!(err.contains("does another wheel own it?"), "{err}");
    assert_eq!(walkdir(&root), ["late", "late/zz.py"]);
    assert_eq!(
        fs::read_to_string(root.join("late/zz.py")).unwrap(),
        "another wheel's\n"
    );
}

/// Every path under `root`, relative, sorted.
fn walkdir(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// An entry's name and content.
type Named<'a> = (&'a str, &'a [u8]);

/// A wheel written entry by entry: METADATA and WHEEL of `odd 1.0`, then `files` as
/// named, then a RECORD listing `record` (path, content) with their real hashes.
fn odd_wheel(dir: &Path, files: &[Named], record: &[Named]) -> std::path::PathBuf {
    use std::io::Write;
    let path = dir.join("odd-1.0-py3-none-any.whl");
    let mut zip = zip::ZipWriter::new(fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default();
    let meta: [Named; 2] = [
        (
            "odd-1.0.dist-info/METADATA",
            b"Metadata-Version: 2.1\nName: odd\nVersion: 1.0\n",
        ),
        (
            "odd-1.0.dist-info/WHEEL",
            b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
        ),
    ];
    let mut lines = String::new();
    for (name, body) in meta.iter().chain(record) {
        let hash = commstack_wheel::record_hash(body);
        lines.push_str(&format!("{name},{hash},{}\n", body.len()));
    }
    lines.push_str("odd-1.0.dist-info/RECORD,,\n");
    for (name, body) in meta.iter().chain(files) {
        zip.start_file(*name, opts).unwrap();
        zip.write_all(body).unwrap();
    }
    zip.start_file("odd-1.0.dist-info/RECORD", opts).unwrap();
    zip.write_all(lines.as_bytes()).unwrap();
    zip.finish().unwrap();
    path
}

/// Entry names the unpacker reads otherwise than the zip names them (`odd//x.py` and
/// `./odd/x.py` are written as `odd/x.py`, which RECORD lists): RECORD would be checked
/// against other files than `Wheel::verify` reads, so the install is refused and writes
/// nothing. (Two entries of one name are refused too; the zip crate cannot write them.)
#[test]
fn entry_names_that_are_not_the_files_written_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let x: &[u8] = b"X = 1\n";
    let cases: [(&[Named], &str); 2] = [
        (
            &[("odd//x.py", x)],
            "the zip entry odd//x.py does not name a file as written",
        ),
        (
            &[("./odd/x.py", x)],
            "the zip entry ./odd/x.py does not name a file as written",
        ),
    ];
    for (files, want) in cases {
        let case = tempfile::tempdir_in(tmp.path()).unwrap();
        let path = odd_wheel(case.path(), files, &[("odd/x.py", x)]);
        let root = case.path().join("prefix");
        let Err(err) = install(&path, &InstallLayout::prefix(&root)) else {
            panic!("{want}: installed");
        };
        let err = format!("{err:#}");
        assert!(err.contains(want), "{err}");
        assert!(
            !root.exists(),
            "{want}: the refused install left {}",
            root.display()
        );
    }
}
