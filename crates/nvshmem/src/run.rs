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
    command: Command,
    header: &str,
    shown: &str,
    log: &Path,
    what: &str,
) -> Result<f64> {
    run_command_with_progress(command, header, shown, log, what, None)
}

/// [`run_command`], calling `progress` with ninja's `[done/total]` (read from the log's
/// last lines) every 30 s while the command runs: a long build says how far it is.
pub fn run_command_with_progress(
    mut command: Command,
    header: &str,
    shown: &str,
    log: &Path,
    what: &str,
    progress: Option<&dyn Fn(&str)>,
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
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start {what}: {shown}"))?;
    let mut said = None;
    let mut next = started + PROGRESS_EVERY;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        if let Some(say) = progress
            && Instant::now() >= next
        {
            next += PROGRESS_EVERY;
            let now = ninja_progress(log, output_starts as u64);
            if now.is_some() && now != said {
                let (done, total) = now.unwrap_or_default();
                say(&format!(
                    "{what}: {done}/{total} ({}%) after {:.0} s",
                    done * 100 / total.max(1),
                    started.elapsed().as_secs_f64()
                ));
                said = now;
            }
        }
    };
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

const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// The last `[done/total]` ninja wrote to `log` (after byte `from`): read from the log's
/// last 8 KiB only, however long the log grows.
fn ninja_progress(log: &Path, from: u64) -> Option<(u64, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = File::open(log).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(8192).max(from)))
        .ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    String::from_utf8_lossy(&tail)
        .lines()
        .rev()
        .find_map(|line| {
            let (done, total) = line.strip_prefix('[')?.split_once(']')?.0.split_once('/')?;
            Some((done.parse().ok()?, total.parse().ok()?))
        })
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

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn ninja_progress_is_the_last_counter_after_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("build.log");
        fs::write(
            &log,
            "$ ninja [9/9]\n[1/100] Building a.o\nwarning: x\n[48/100] Building b.o\nnoise\n",
        )
        .unwrap();
        assert_eq!(ninja_progress(&log, 14), Some((48, 100)));
        fs::write(&log, "$ ninja [9/9]\n").unwrap();
        assert_eq!(ninja_progress(&log, 14), None);
    }
}
