//! Rules the command line's overrides can break are refused before anything runs:
//! `build --no-ibgda` with DeepEP in the selection names rule deepep-needs-ibgda at once
//! (it used to pass lock and plan, build NVSHMEM for 11 minutes and fail in DeepEP's
//! device link); a selection without DeepEP (`--until nvshmem`) plans as asked.

use std::path::Path;
use std::process::Output;

mod common;
use common::text;

fn xtask(home: &Path, args: &[&str]) -> Output {
    common::xtask_in(&common::repo_root(), home, args)
}

#[test]
fn no_ibgda_with_deepep_in_the_selection_is_refused_before_anything_runs() {
    let home = tempfile::tempdir().unwrap();
    for args in [
        &["build", "--no-ibgda", "--dry-run"][..],
        &["build", "--no-ibgda", "--until", "deepep", "--dry-run"][..],
    ] {
        let out = xtask(home.path(), args);
        let said = text(&out);
        assert!(!out.status.success(), "{args:?}:\n{said}");
        assert!(
            said.contains("[rule deepep-needs-ibgda]")
                && said.contains("nvshmemi_ibgda_device_state_d")
                && said.contains("cargo xtask build nvshmem --no-ibgda"),
            "{args:?}:\n{said}"
        );
        // Refused before the plan: no step row was printed.
        assert!(!said.contains("runs: not built yet"), "{args:?}:\n{said}");
    }
    // No step was made.
    let steps = home.path().join("store/steps");
    let made: Vec<_> = std::fs::read_dir(&steps)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(made.is_empty(), "{made:?}");
    let out = xtask(
        home.path(),
        &["build", "--no-ibgda", "--until", "nvshmem", "--dry-run"],
    );
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("nvshmem "), "{said}");
    assert!(!said.contains("deepep-needs-ibgda"), "{said}");
}
