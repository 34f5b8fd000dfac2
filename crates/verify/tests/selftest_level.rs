//! The selftest level against stand-in self-test programs (real processes, real files):
//! exit codes map to verdicts, and the library a rank really loaded must be the stack's.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use commstack_verify::check::Status;
use commstack_verify::expect::Expectations;

fn fake(dir: &Path, exit: i32, loaded: &str) -> std::path::PathBuf {
    let bin = dir.join(format!("selftest-{exit}"));
    let script = format!(
        "#!/bin/sh\n# args: --gpus 1 --json FILE\necho 'put/copy at 256MiB on rank 0: 90.1%'\n\
         printf '{{\"schema\":\"commstack-selftest/1\",\"ranks\":[{{\"rank\":0,\"nvshmem\":{{\"loaded_library\":\"{loaded}\"}}}}],\"errors\":[]}}' > \"$4\"\n\
         exit {exit}\n"
    );
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn expect(prefix: &Path) -> Expectations {
    let mut e = Expectations::new();
    e.nvshmem_prefix = Some(prefix.to_path_buf());
    e
}

#[test]
fn a_clean_run_with_the_stacks_library_passes() {
    let d = tempfile::tempdir().unwrap();
    let prefix = d.path().join("site/nvidia/nvshmem");
    let bin = fake(
        d.path(),
        0,
        &format!("{}/lib/libnvshmem_host.so.3", prefix.display()),
    );
    let level = commstack_verify::selftest::run(&bin, &expect(&prefix), Some(d.path()), 1);
    assert_eq!(level.status, Status::Passed, "{level:?}");
    assert!(d.path().join("selftest.log").is_file());
}

#[test]
fn wrong_bytes_fail_and_another_library_fails() {
    let d = tempfile::tempdir().unwrap();
    let prefix = d.path().join("site/nvidia/nvshmem");
    let bin = fake(
        d.path(),
        1,
        &format!("{}/lib/libnvshmem_host.so.3", prefix.display()),
    );
    let level = commstack_verify::selftest::run(&bin, &expect(&prefix), None, 1);
    assert_eq!(level.status, Status::Failed);
    let bin = fake(d.path(), 0, "/usr/lib/libnvshmem_host.so.3");
    let level = commstack_verify::selftest::run(&bin, &expect(&prefix), None, 1);
    assert_eq!(level.status, Status::Failed, "{level:?}");
    assert!(format!("{level:?}").contains("not the library under"));
}
