//! Any bytes as a wheel, installed into a layout of five directories as the image's venv
//! and adopt install: it may refuse, it must not crash; nothing may be written outside the
//! layout, an install is whole or nothing (a refused wheel leaves no file and no directory
//! it made), and what it installs is what RECORD lists, each file where its scheme says.

#![no_main]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use commstack_wheel::{InstallLayout, Wheel, install};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let sandbox = tempfile::tempdir().unwrap();
    let root = sandbox.path();
    std::fs::create_dir(root.join("in")).unwrap();
    // The seeds in fuzz/corpus/wheel_install are wheels of this name and version.
    let wheel = root.join("in/fz-1.0-py3-none-any.whl");
    std::fs::write(&wheel, data).unwrap();
    let out = root.join("out");
    let layout = InstallLayout {
        purelib: out.join("lib"),
        platlib: out.join("plat"),
        scripts: out.join("bin"),
        data: out.join("data"),
        headers: out.join("include"),
    };
    let result = install(&wheel, &layout);
    for entry in walkdir::WalkDir::new(root).min_depth(1) {
        let path = entry.unwrap().into_path();
        assert!(
            path.starts_with(root.join("in")) || path.starts_with(&out),
            "written outside the layout: {}",
            path.display()
        );
    }
    let Ok(installed) = result else {
        assert!(!out.exists(), "a refused wheel left {}", out.display());
        return;
    };
    // RECORD was checked before placing: the wheel verifies, and every file it lists
    // (RECORD itself too) was installed, nothing else.
    let opened = Wheel::open(&wheel).expect("an installed wheel opens");
    opened.verify().expect("an installed wheel verifies");
    let written: BTreeSet<PathBuf> = walkdir::WalkDir::new(&out)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| !e.file_type().is_dir())
        .map(|e| e.into_path())
        .collect();
    let reported: BTreeSet<PathBuf> = installed.files.iter().cloned().collect();
    assert_eq!(
        written, reported,
        "the install wrote other files than it reports"
    );
    let listed: BTreeSet<&str> = opened.record.iter().map(|r| r.path.as_str()).collect();
    let files: BTreeSet<&str> = opened
        .entries
        .iter()
        .filter(|e| !e.is_dir)
        .map(|e| e.path.as_str())
        .collect();
    for path in &files {
        // Signatures may be absent from RECORD (the binary distribution format).
        let signature = [".jws", ".p7s"]
            .iter()
            .any(|ext| *path == format!("{}/RECORD{ext}", opened.dist_info));
        assert!(
            listed.contains(path) || signature,
            "installed, but {path:?} is not in RECORD"
        );
    }
    assert!(
        listed.is_subset(&files),
        "installed, but RECORD lists a file the archive lacks"
    );
    assert_eq!(
        reported.len(),
        files.len(),
        "a file of the wheel was not installed"
    );
    for path in &reported {
        assert!(
            in_layout(path, &layout),
            "{} is in no directory of the layout",
            path.display()
        );
    }
});

fn in_layout(path: &Path, layout: &InstallLayout) -> bool {
    [
        &layout.purelib,
        &layout.platlib,
        &layout.scripts,
        &layout.data,
        &layout.headers,
    ]
    .iter()
    .any(|dir| path.starts_with(dir) && path != dir.as_path())
}
