//! Running a scenario as a user who is not root, so that file permissions bite: a test
//! of what a normal user can remove must not pass merely because CI runs as root.
//!
//! As root, [`as_non_root`] runs the calling test again in a child process under
//! `setpriv --reuid=65534` (nobody; util-linux, on every Debian), in a directory it owns,
//! and fails unless the child ran the scenario to its end. As anyone else it runs the
//! scenario in place.

use std::path::Path;
use std::process::Command;

const DIR_VAR: &str = "COMMSTACK_TEST_NON_ROOT_DIR";
const NOBODY: u32 = 65534;
/// Written by the child once the scenario returned: a child that ran no test (a wrong
/// test name) or stopped early leaves none.
const DONE: &str = "scenario-done";

/// Runs `scenario` with a fresh directory, as a user who is not root. `test` is the
/// calling test's name as libtest knows it (`module::name` in a unit test, the function
/// name in an integration test).
pub fn as_non_root(test: &str, scenario: impl FnOnce(&Path)) {
    if let Ok(dir) = std::env::var(DIR_VAR) {
        // SAFETY: geteuid has no preconditions.
        assert_ne!(
            unsafe { libc::geteuid() },
            0,
            "the child still runs as root"
        );
        scenario(Path::new(&dir));
        std::fs::write(Path::new(&dir).join(DONE), b"").unwrap();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: as above.
    if unsafe { libc::geteuid() } != 0 {
        scenario(dir.path());
        return;
    }
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY)).unwrap();
    // A copy of this test binary nobody can run, wherever the checkout lies (it may be
    // under a 0700 home).
    let exe = dir.path().join("test-binary");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(DIR_VAR, &work)
        .output()
        .expect("setpriv (util-linux) runs the test as nobody: install util-linux");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "as nobody: {log}");
    assert!(
        work.join(DONE).exists(),
        "as nobody, the scenario did not run to its end (is {test:?} the test's name?): {log}"
    );
}
