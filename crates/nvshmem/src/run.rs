//! Running one build command with its output in a log file, and reading the first errors
//! back when it fails.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

/// A command that failed: which, its log, its first error lines.
#[derive(Debug)]
pub struct CommandFailed {
    pub what: String,
    pub log: std::path::PathBuf,
    pub status: String,
    pub first_errors: Vec<String>,
}

impl std::fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The log's directory moves with a failed step: name the file, the caller the place.
        let name = self
            .log
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        writeln!(
            f,
            "{} failed ({}); first error lines of {name}:",
            self.what, self.status
        )?;
        for l in &self.first_errors {
            writeln!(f, "  | {l}")?;
        }
        Ok(())
    }
}

impl std::error::Error for CommandFailed {}

/// Run `cmd` (from xshell, environment already set) with stdout and stderr appended to
/// `log`, which is written as the command runs (`tail -f` works). Returns seconds taken.
pub fn run_logged(cmd: xshell::Cmd<'_>, log: &Path, what: &str) -> Result<f64> {
    let shown = cmd.to_string();
    run_command(cmd.into(), &format!("$ {shown}\n"), &shown, log, what)
}

/// Run `command` (program, arguments, environment and directory already set) with
/// `header` written to `log` first and the command's output appended after it. On
/// failure the first error lines are read from the command's output (not the header) into
/// a [`CommandFailed`]. Returns seconds taken. `shown` names the command in errors.
pub fn run_command(
    mut command: Command,
    header: &str,
    shown: &str,
    log: &Path,
    what: &str,
) -> Result<f64> {
    let file = File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    {
        use std::io::Write;
        let mut f = &file;
        f.write_all(header.as_bytes())?;
    }
    let output_starts = file.metadata()?.len() as usize;
    command
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    let started = Instant::now();
    let status = command
        .status()
        .with_context(|| format!("cannot start {what}: {shown}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !status.success() {
        let bytes = fs::read(log).unwrap_or_default();
        let text = String::from_utf8_lossy(bytes.get(output_starts..).unwrap_or_default());
        return Err(CommandFailed {
            what: what.to_string(),
            log: log.to_path_buf(),
            status: status.to_string(),
            first_errors: first_error_lines(&text, 20),
        }
        .into());
    }
    Ok(seconds)
}

/// The first lines that look like errors (CMake, compilers, linkers, ninja), each with
/// the line after it for context; the last lines of the log if none match.
pub fn first_error_lines(log: &str, max: usize) -> Vec<String> {
    let re = regex::Regex::new(r"(CMake Error|error:|Error:|FAILED:|fatal error|undefined reference|cannot find|No such file|not found)")
        .expect("valid regex");
    let lines: Vec<&str> = log.lines().collect();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() && out.len() < max {
        if re.is_match(lines[i]) {
            out.push(lines[i].to_string());
            if let Some(next) = lines.get(i + 1) {
                out.push(next.to_string());
                i += 1;
            }
        }
        i += 1;
    }
    if out.is_empty() {
        out = lines
            .iter()
            .rev()
            .take(max)
            .rev()
            .map(|l| l.to_string())
            .collect();
    }
    out.truncate(max);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cmake_and_compiler_errors() {
        let log = "-- ok\nCMake Error at CMakeLists.txt:3 (find_package):\n  Could not find MPI\n-- more\nfoo.c:1:2: error: bad\n";
        let e = first_error_lines(log, 10);
        assert_eq!(
            e,
            [
                "CMake Error at CMakeLists.txt:3 (find_package):",
                "  Could not find MPI",
                "foo.c:1:2: error: bad"
            ]
        );
        assert_eq!(first_error_lines("a\nb\n", 1), ["b"]);
    }
}
