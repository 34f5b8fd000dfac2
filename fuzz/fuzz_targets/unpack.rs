//! Any bytes, as a .tar, .tar.gz or .zip (the first byte picks), through the one
//! unpacker: it may refuse, it must not crash, and nothing may be written outside the
//! destination, nor may a link in it lead outside.

#![no_main]

use std::path::Path;

use commstack_archive::{Limits, Options, Strip, unpack};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let sandbox = tempfile::tempdir().unwrap();
    let root = sandbox.path();
    for dir in ["in", "out", "beside"] {
        std::fs::create_dir(root.join(dir)).unwrap();
    }
    let name = ["a.tar", "a.tar.gz", "a.zip"][usize::from(pick % 3)];
    let archive = root.join("in").join(name);
    std::fs::write(&archive, bytes).unwrap();
    let dest = root.join("out/dest");
    let options = Options {
        strip: if pick & 4 == 0 {
            Strip::None
        } else {
            Strip::TopDirIfSingle
        },
        limits: Limits {
            max_bytes: 1 << 20,
            max_entries: 1000,
        },
    };
    let result = unpack(&archive, &dest, &options);
    for entry in walkdir::WalkDir::new(root).min_depth(1) {
        let path = entry.unwrap().into_path();
        let allowed = path.starts_with(root.join("in"))
            || path == root.join("out")
            || path == root.join("beside")
            || path.starts_with(&dest);
        assert!(
            allowed,
            "written outside the destination: {}",
            path.display()
        );
        if result.is_err() {
            assert!(
                !path.starts_with(&dest),
                "a refused archive left {}",
                path.display()
            );
        }
        if path.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            assert!(!target.is_absolute(), "absolute link {}", path.display());
            assert!(
                stays_inside(&dest, path.parent().unwrap(), &target),
                "link {} -> {} leads outside",
                path.display(),
                target.display()
            );
        }
    }
});

/// Whether `dir/target`, resolved lexically, stays under `root`.
fn stays_inside(root: &Path, dir: &Path, target: &Path) -> bool {
    let mut parts: Vec<_> = dir.components().collect();
    for c in target.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other),
        }
    }
    parts
        .iter()
        .collect::<std::path::PathBuf>()
        .starts_with(root)
}
