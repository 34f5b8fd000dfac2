//! Archives with directories of mode 0000 and 0555, unpacked by a user who is not root
//! (the test runs again as nobody when the tests run as root): what is refused leaves
//! nothing behind, and what is inspected or checked is read before the archive's modes
//! are applied.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use commstack_archive::{Options, Strip, unpack, unpack_checked, with_unpacked};

mod common;
use common::*;

fn locked_dirs(extra: Option<E>) -> Vec<u8> {
    let mut entries = vec![
        dir("top", 0o755),
        dir("top/none", 0o000),
        file("top/none/a.c", 0o644, b"a"),
        dir("top/ro", 0o555),
        file("top/ro/b.c", 0o644, b"b"),
    ];
    entries.extend(extra);
    tar_bytes(&entries)
}

/// Nothing in `dir` but `keep`.
fn only(dir: &Path, keep: &[&str]) {
    let mut left: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, keep);
}

#[test]
fn read_only_directories_do_not_stop_a_user_cleaning_up() {
    commstack_testkit::as_non_root(
        "read_only_directories_do_not_stop_a_user_cleaning_up",
        |d| {
            let archive = d.join("a.tar");
            fs::write(&archive, locked_dirs(None)).unwrap();
            let out = d.join("out");

            // Inspected (as the tree hash is) before the modes: every file read, then removed.
            let files = with_unpacked(&archive, &out, &Options::default(), |root| {
                Ok(fs::read(root.join("top/none/a.c"))? == b"a"
                    && fs::read(root.join("top/ro/b.c"))? == b"b")
            })
            .unwrap();
            assert!(files);
            only(&out, &[]);

            // A check that refuses (as a tree hash that differs): nothing left.
            let err = unpack_checked(
                &archive,
                &out.join("src"),
                &Options::strip(Strip::TopDir),
                |_| anyhow::bail!("the tree differs"),
            )
            .unwrap_err();
            assert!(err.to_string().contains("the tree differs"));
            only(&out, &[]);

            // Refused after those directories were made: nothing left.
            fs::write(&archive, locked_dirs(Some(sym("top/up", "../..")))).unwrap();
            let err =
                unpack(&archive, &out.join("src"), &Options::strip(Strip::TopDir)).unwrap_err();
            assert!(format!("{err:#}").contains("leaves the destination"));
            only(&out, &[]);

            // Unpacked: the archive's modes, applied last.
            fs::write(&archive, locked_dirs(None)).unwrap();
            unpack(&archive, &out.join("src"), &Options::strip(Strip::TopDir)).unwrap();
            let mode = |p: &str| {
                fs::metadata(out.join("src").join(p))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!((mode("none"), mode("ro")), (0o000, 0o555));
            assert!(
                fs::read_dir(out.join("src/none")).is_err(),
                "not root: 0000 bites"
            );
            for p in ["none", "ro"] {
                fs::set_permissions(out.join("src").join(p), fs::Permissions::from_mode(0o755))
                    .unwrap();
            }
        },
    );
}
