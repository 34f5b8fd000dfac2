//! A newcomer's first commands: found from any subdirectory, and refused early, naming the
//! fix, when the lock no longer matches the manifest.

use std::path::Path;
use std::process::Output;

mod common;
use common::text;

fn xtask(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    common::xtask_in(cwd, home, args)
}

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn commands_find_stack_toml_from_a_subdirectory() {
    let home = tempfile::tempdir().unwrap();
    let out = xtask(
        &workspace().join("kernels/src"),
        home.path(),
        &["lock", "--check"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("../../stack.lock matches ../../stack.toml"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_stale_lock_is_refused_by_every_command_that_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let manifest = std::fs::read_to_string(workspace().join("stack.toml")).unwrap();
    assert!(manifest.contains("version = \"2.11.0\""));
    std::fs::write(
        dir.path().join("stack.toml"),
        manifest.replace("version = \"2.11.0\"", "version = \"2.99.0\""),
    )
    .unwrap();
    std::fs::copy(
        workspace().join("stack.lock"),
        dir.path().join("stack.lock"),
    )
    .unwrap();
    for args in [
        &["fetch", "--offline"][..],
        &["build", "nvshmem", "--offline"],
        &["build", "kernels"],
        &["toolchain"],
    ] {
        let out = xtask(dir.path(), &home, args);
        let all = text(&out);
        assert!(!out.status.success(), "{args:?} used a stale lock:\n{all}");
        assert!(
            all.contains("stack.lock is stale")
                && all.contains("2.99.0")
                && all.contains("run `cargo xtask lock` to resolve it again"),
            "{args:?}:\n{all}"
        );
    }
    // Named explicitly, the fix names the same file.
    let out = xtask(
        workspace(),
        &home,
        &[
            "--stack",
            dir.path().join("stack.toml").to_str().unwrap(),
            "fetch",
            "--offline",
        ],
    );
    assert!(
        text(&out).contains("run `cargo xtask lock --stack /"),
        "{}",
        text(&out)
    );
}

/// Commands that read no manifest work outside a checkout; one that does says what to do.
#[test]
fn outside_a_checkout_only_manifest_commands_need_stack_toml() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let out = xtask(dir.path(), &home, &["cache", "ls"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = xtask(dir.path(), &home, &["lock", "--check"]);
    assert!(!out.status.success());
    assert!(
        text(&out)
            .contains("cannot read the stack manifest stack.toml (pick one with --stack FILE")
            && text(&out).contains("the nearest stack.toml in this directory or a parent"),
        "{}",
        text(&out)
    );
}
