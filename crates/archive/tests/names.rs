//! Names from an archive in messages: a newline in an entry name or a link target cannot
//! start a line of its own (a forged "all archives verified" line), and a zip entry whose
//! central directory and local header disagree on its name is refused, naming both.

use std::io::Write;

use commstack_archive::Options;

mod common;
use common::*;

const FORGED: &str = "x\nall archives verified\n";

/// Refused with `needle` in the message, which stays one line whatever the names hold.
fn one_line(s: &Sandbox, options: &Options, needle: &str) {
    let err = s.refused(options, &[needle, "\\nall archives verified\\n"]);
    assert!(!err.contains('\n'), "the message spans lines: {err}");
}

#[test]
fn a_newline_in_a_name_stays_in_its_line() {
    let forged_top = format!("b/{FORGED}");
    // Not inside the one top directory to strip.
    let s = Sandbox::new(
        "a.tar",
        &tar_bytes(&[file("a/ok", 0o644, b"x"), file(&forged_top, 0o644, b"y")]),
    );
    one_line(&s, &top(), "is not inside a top directory");

    // A symlink leaving the destination, named and pointing with newlines.
    let link = format!("top/{FORGED}");
    let target = format!("../../{FORGED}");
    let s = Sandbox::new(
        "b.tar",
        &tar_bytes(&[dir("top", 0o755), sym(&link, &target)]),
    );
    one_line(&s, &top(), "leaves the destination");

    // A hard link to something that is not a file.
    let s = Sandbox::new(
        "c.tar",
        &tar_bytes(&[
            file("top/f", 0o644, b"x"),
            sym("top/l", "f"),
            hard(&link, "top/l"),
        ]),
    );
    one_line(&s, &top(), "not a regular file earlier");

    // An entry under a symlink, the link named with a newline.
    let under = format!("{link}/inner");
    let s = Sandbox::new(
        "d.tar",
        &tar_bytes(&[
            dir("top", 0o755),
            sym(&link, "."),
            file(&under, 0o644, b"x"),
        ]),
    );
    one_line(&s, &top(), "lies under the symlink");

    // A directory replaced by a file.
    let s = Sandbox::new(
        "e.tar",
        &tar_bytes(&[dir(&link, 0o755), file(&link, 0o644, b"x")]),
    );
    one_line(&s, &top(), "a directory earlier in the archive");

    // A special file.
    let s = Sandbox::new("f.tar", &tar_bytes(&[special(&link, tar::EntryType::Fifo)]));
    one_line(&s, &top(), "FIFO");
}

/// The zip at `bytes` with the name of its central directory entry `from` replaced by
/// `to` (same length); the local header keeps `from`.
fn rename_in_central_directory(mut bytes: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let at = (0..bytes.len() - 4)
        .find(|&i| {
            &bytes[i..i + 4] == b"PK\x01\x02" && {
                let n = u16::from_le_bytes([bytes[i + 28], bytes[i + 29]]) as usize;
                &bytes[i + 46..i + 46 + n] == from.as_bytes()
            }
        })
        .expect("the central directory entry");
    bytes[at + 46..at + 46 + to.len()].copy_from_slice(to.as_bytes());
    bytes
}

fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    for (name, data) in entries {
        z.start_file(*name, zip::write::SimpleFileOptions::default())
            .unwrap();
        z.write_all(data).unwrap();
    }
    z.finish().unwrap().into_inner()
}

/// Readers that go by the local headers (streaming ones, `unzip -` and others) would
/// write `setup.py` where the central directory says `README.md`: such an archive is
/// two archives, and is refused before anything is written.
#[test]
fn a_central_name_that_disagrees_with_its_local_header_is_refused_naming_both() {
    let bytes = zip_of(&[("pkg/ok.txt", b"ok"), ("setup.py", b"evil")]);
    let s = Sandbox::new(
        "p.whl",
        &rename_in_central_directory(bytes, "setup.py", "READ.txt"),
    );
    let err = s.refused(
        &Options::default(),
        &[
            "entry READ.txt of the central directory has the local header of setup.py",
            "refused",
        ],
    );
    assert!(!err.contains('\n'), "{err}");

    // The disagreement shown escaped, on one line.
    let bytes = zip_of(&[("a\nb", b"x")]);
    let s = Sandbox::new("q.zip", &rename_in_central_directory(bytes, "a\nb", "a\rc"));
    one_line_zip(&s);
}

fn one_line_zip(s: &Sandbox) {
    let err = s.refused(
        &Options::default(),
        &["entry a\\rc", "local header of a\\nb"],
    );
    assert!(!err.contains('\n') && !err.contains('\r'), "{err:?}");
}
