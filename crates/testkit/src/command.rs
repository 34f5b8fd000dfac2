//! Running a program a test needs and insisting that it succeeds.

use std::path::Path;
use std::process::Command;

/// Runs `program args` in `dir` and returns its stdout; panics naming the program (and
/// `needs`: what provides it) when it cannot start, and with its output when it fails.
pub fn run_ok(program: &str, args: &[&str], dir: &Path, needs: &str) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} is needed for this test ({e}): {needs}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
