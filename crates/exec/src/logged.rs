//! A long build command (cmake, ninja, setup.py) with its output in a log file, written as
//! it runs (`tail -f` works), and its first error lines read back when it fails.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::{CommandFailed, MAX_LINES};

/// Run `command` (program, arguments, environment and directory already set) with
/// `header` written to `log` first and the command's output appended after it. On
/// failure the first error lines are read from the command's output (not the header) into
/// a [`CommandFailed`] that names `log`. Returns seconds taken. `what` says what it is for.
pub fn run_logged(command: Command, header: &str, log: &Path, what: &str) -> Result<f64> {
    run_logged_with_progress(command, header, log, what, None)
}

/// [`run_logged`], calling `progress` with ninja's `[done/total]` (read from the log's
/// last lines) every 30 s while the command runs: a long build says how far it is.
pub fn run_logged_with_progress(
    mut command: Command,
    header: &str,
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
    let mut child = command.spawn().with_context(|| {
        format!(
            "cannot start {what} (`{}`)",
            command.get_program().to_string_lossy()
        )
    })?;
    let mut said = None;
    let mut next = started + PROGRESS_EVERY;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
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
            program: command.get_program().to_string_lossy().into_owned(),
            args: command
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            status: status.to_string(),
            stderr_tail: first_error_lines(&text, MAX_LINES),
            log: Some(log.to_path_buf()),
        }
        .into());
    }
    Ok(seconds)
}

const PROGRESS_EVERY: Duration = Duration::from_secs(30);

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

    #[test]
    fn a_failed_build_command_names_its_log_and_first_errors() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("build.log");
        let mut sh = Command::new("/bin/sh");
        sh.args([
            "-c",
            "echo compiling; echo 'a.c:1: error: bad' >&2; echo context; echo more; exit 2",
        ]);
        let err = run_logged(sh, "$ header error: not this one\n", &log, "the build").unwrap_err();
        let failed = err.downcast_ref::<CommandFailed>().unwrap();
        assert_eq!(failed.stderr_tail, ["a.c:1: error: bad", "context"]);
        assert_eq!(failed.log.as_deref(), Some(log.as_path()));
        let text = failed.to_string();
        assert!(
            text.starts_with("the build failed (exit status: 2): `/bin/sh -c ")
                && text.contains("; its log: build.log; it said:\n  | a.c:1: error: bad"),
            "{text}"
        );
        let written = fs::read_to_string(&log).unwrap();
        assert!(
            written.starts_with("$ header") && written.contains("more"),
            "{written}"
        );
    }
}

/// The directory of a step's logs where [`keep_ninja_logs`] keeps them.
pub const NINJA_LOGS_DIR: &str = "ninja";

/// Keeps every `.ninja_log` under `build` (a nested project has its own) as
/// `logs/ninja/<dir>.ninja_log` (`build.ninja_log` for the top one): the start and end of
/// each compile job, for finding what bounds a build (`build --timings` draws them).
/// Returns the files kept. Best effort, also after a failed build: a log that cannot be
/// copied must not fail a good build, so it is left out.
pub fn keep_ninja_logs(build: &Path, logs: &Path) -> Vec<std::path::PathBuf> {
    let dest = logs.join(NINJA_LOGS_DIR);
    let mut kept = Vec::new();
    for entry in walkdir::WalkDir::new(build)
        .sort_by_file_name()
        .into_iter()
        .filter_map(|e| e.ok())
    {
        if entry.file_name() != ".ninja_log" {
            continue;
        }
        let dir = entry
            .path()
            .parent()
            .and_then(|d| d.strip_prefix(build).ok());
        let name = match dir.map(|d| d.to_string_lossy().replace('/', "_")) {
            Some(d) if !d.is_empty() => format!("{d}.ninja_log"),
            _ => "build.ninja_log".to_string(),
        };
        let to = dest.join(&name);
        if fs::create_dir_all(&dest)
            .and_then(|_| fs::copy(entry.path(), &to))
            .is_ok()
        {
            kept.push(to);
        }
    }
    kept
}

#[cfg(test)]
mod ninja_log_tests {
    use super::*;

    #[test]
    fn every_ninja_log_is_kept_under_a_name_of_its_directory() {
        let d = tempfile::tempdir().unwrap();
        let build = d.path().join("build");
        for (dir, text) in [("", "top"), ("src/device", "nested")] {
            fs::create_dir_all(build.join(dir)).unwrap();
            fs::write(build.join(dir).join(".ninja_log"), text).unwrap();
        }
        fs::write(build.join("other.log"), "x").unwrap();
        let logs = d.path().join("logs");
        let kept = keep_ninja_logs(&build, &logs);
        let names: Vec<String> = kept
            .iter()
            .map(|p| p.strip_prefix(&logs).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            ["ninja/build.ninja_log", "ninja/src_device.ninja_log"]
        );
        assert_eq!(fs::read_to_string(&kept[1]).unwrap(), "nested");
        // No build directory: nothing kept, no error.
        assert!(keep_ninja_logs(&d.path().join("none"), &logs).is_empty());
    }
}
