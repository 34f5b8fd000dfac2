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
    let strip = [Strip::None, Strip::TopDirIfSingle, Strip::TopDir][usize::from(pick / 3 % 3)];
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
        // Untrusted input: absolute links refused, as for every download.
        keep_absolute_symlinks: false,
    };
    let result = unpack(&archive, &dest, &options);
    let real_dest = dest.canonicalize().ok();
    // Errors inside the walk come from directories the archive made unreadable (mode
    // 000), which can only be under dest: nothing to check there.
    for entry in walkdir::WalkDir::new(root)
        .min_depth(1)
        .into_iter()
        .flatten()
    {
        let path = entry.into_path();
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
            // Followed through every link on the way (chains like a -> ., b -> a/..).
            let resolved = match path.canonicalize() {
                Ok(real) => Some(real),
                Err(_) => path
                    .parent()
                    .and_then(|p| p.canonicalize().ok())
                    .map(|p| lexical(&p.join(&target))),
            };
            if let (Some(resolved), Some(real_dest)) = (resolved, &real_dest) {
                assert!(
                    resolved.starts_with(real_dest),
                    "link {} -> {} leads to {}",
                    path.display(),
                    target.display(),
                    resolved.display()
                );
            }
        }
    }
    // Directories the archive made read-only or unreadable: give them back for cleanup
    // (each is yielded before the walk reads it).
    for entry in walkdir::WalkDir::new(&dest).into_iter().flatten() {
        if entry.file_type().is_dir() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o755));
        }
    }
});

/// `path` with `.` and `..` resolved by text.
fn lexical(path: &Path) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}
