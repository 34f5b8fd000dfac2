//! commstack-exec: running external programs (cmake, ninja, nvcc, mmdebstrap, dpkg-deb,
//! docker, Python ...). One typed error for a command that ran and failed,
//! [`CommandFailed`]: what it was for, the program and its arguments, its exit status, the
//! lines of its output that say why, and its log; every crate that runs a program reports
//! a failure with it, so a caller can find the log in an error chain
//! (`err.chain().find_map(|e| e.downcast_ref::<CommandFailed>())`) and a user reads every
//! failure alike. Text from the command is escaped ([`commstack_digest::terminal_safe`])
//! and capped before it is printed.
//!
//! - [`output`]: a short command run to its end, its output captured and checked;
//! - [`logged`]: a long build command with its output in a log file, followed as it runs.
//!
//! It sits at the bottom of the flow beside commstack-digest (naming bytes is that crate's
//! one concern; running programs is this one's).

pub mod logged;

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::Context as _;
use commstack_digest::terminal_safe;

pub use logged::{first_error_lines, run_logged, run_logged_with_progress};

/// The most lines of a command's output a [`CommandFailed`] keeps.
pub const MAX_LINES: usize = 20;
/// The most characters of one line, and of the command line, that are printed.
const MAX_LINE_CHARS: usize = 300;

/// A command that ran and failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandFailed {
    /// What it was for, in words: `cmake configure`, `docker load`, `the nvcc smoke test`.
    pub what: String,
    /// The program as run (a path or a name).
    pub program: String,
    pub args: Vec<String>,
    /// How it ended: `exit status: 2`, `signal: 9 (SIGKILL)`.
    pub status: String,
    /// What it said that matters, at most [`MAX_LINES`] lines: the first error lines of its
    /// log (a build), else the last lines of its stderr (or of its stdout when stderr was
    /// empty).
    pub stderr_tail: Vec<String>,
    /// The file its whole output went to, when it had one.
    pub log: Option<PathBuf>,
}

impl CommandFailed {
    /// `command`, which ended as `output` says: the last lines of its stderr (of its stdout
    /// when it wrote nothing to stderr).
    pub fn from_output(what: &str, command: &Command, output: &Output) -> CommandFailed {
        let said = if output.stderr.iter().all(u8::is_ascii_whitespace) {
            &output.stdout
        } else {
            &output.stderr
        };
        CommandFailed {
            what: what.to_string(),
            program: command.get_program().to_string_lossy().into_owned(),
            args: command
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            status: output.status.to_string(),
            stderr_tail: last_lines(&String::from_utf8_lossy(said), MAX_LINES),
            log: None,
        }
    }

    /// The first [`CommandFailed`] in `err`'s chain: the command behind a failed step.
    pub fn in_chain(err: &anyhow::Error) -> Option<&CommandFailed> {
        // anyhow finds it as any context layer; the chain, as the source of another error.
        err.downcast_ref::<CommandFailed>()
            .or_else(|| err.chain().find_map(|e| e.downcast_ref::<CommandFailed>()))
    }

    /// The command line, as a shell would take it back (arguments quoted where needed).
    pub fn command_line(&self) -> String {
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl CommandFailed {
    /// The same on one line (what it said joined by ` | `), for a report's table cell.
    pub fn one_line(&self) -> String {
        self.to_string()
            .replace("\n  | ", " | ")
            .replacen("; it said: | ", "; it said: ", 1)
    }
}

impl fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed ({}): `{}`",
            capped(&self.what),
            self.status,
            capped(&self.command_line())
        )?;
        // A failed step's logs move with it: the file is named, the caller says where.
        if let Some(name) = self.log.as_ref().and_then(|l| l.file_name()) {
            write!(f, "; its log: {}", capped(&name.to_string_lossy()))?;
        }
        if !self.stderr_tail.is_empty() {
            write!(f, "; it said:")?;
            for line in &self.stderr_tail {
                write!(f, "\n  | {}", capped(line))?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for CommandFailed {}

/// Run `command` to its end with its output captured (stdin empty). A command that does
/// not start is an error naming it; one that fails is a [`CommandFailed`]. `what` says
/// what it was for.
pub fn output(what: &str, command: &mut Command) -> anyhow::Result<Output> {
    let out = command.output().with_context(|| {
        format!(
            "cannot start {} (`{}`)",
            capped(what),
            capped(&command.get_program().to_string_lossy())
        )
    })?;
    if !out.status.success() {
        return Err(CommandFailed::from_output(what, command, &out).into());
    }
    Ok(out)
}

/// The last `max` lines of `text` that are not blank.
pub fn last_lines(text: &str, max: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(max)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// `text` safe to print (control characters escaped) and at most [`MAX_LINE_CHARS`]
/// characters long.
fn capped(text: &str) -> String {
    let safe = terminal_safe(text);
    match safe.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => format!("{}...", &safe[..cut]),
        None => safe.into_owned(),
    }
}

/// `arg` quoted for a POSIX shell when it holds anything but plain word characters.
pub fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_command_is_named_with_its_status_and_last_lines() {
        let mut sh = Command::new("/bin/sh");
        sh.args([
            "-c",
            "echo out; echo 'first' >&2; echo 'it broke' >&2; exit 3",
        ]);
        let err = output("the test script", &mut sh).unwrap_err();
        let failed = err
            .downcast_ref::<CommandFailed>()
            .expect("a CommandFailed");
        assert_eq!(failed.stderr_tail, ["first", "it broke"]);
        assert_eq!(failed.program, "/bin/sh");
        assert_eq!(
            failed.to_string(),
            "the test script failed (exit status: 3): `/bin/sh -c 'echo out; echo '\\''first'\\'' >&2; \
             echo '\\''it broke'\\'' >&2; exit 3'`; it said:\n  | first\n  | it broke"
        );
        // Nothing on stderr: the last lines of stdout say why.
        let mut quiet = Command::new("/bin/sh");
        quiet.args(["-c", "echo only-stdout; exit 1"]);
        let err = output("quiet", &mut quiet).unwrap_err();
        assert_eq!(
            err.downcast_ref::<CommandFailed>().unwrap().stderr_tail,
            ["only-stdout"]
        );
        assert_eq!(
            failed.one_line(),
            "the test script failed (exit status: 3): `/bin/sh -c 'echo out; echo '\\''first'\\'' >&2; \
             echo '\\''it broke'\\'' >&2; exit 3'`; it said: first | it broke"
        );
        // Success returns the output.
        let ok = output("echo", Command::new("/bin/echo").arg("hi")).unwrap();
        assert_eq!(ok.stdout, b"hi\n");
    }

    #[test]
    fn it_is_found_in_an_error_chain_as_a_context_or_a_cause() {
        let mut sh = Command::new("/bin/false");
        let failed = output("false", &mut sh).unwrap_err();
        let as_cause = failed.context("building X");
        assert!(CommandFailed::in_chain(&as_cause).is_some());
        let inner = CommandFailed::in_chain(&as_cause).unwrap().clone();
        let as_context = anyhow::anyhow!("writing its input: broken pipe").context(inner);
        assert_eq!(CommandFailed::in_chain(&as_context).unwrap().what, "false");
        assert!(CommandFailed::in_chain(&anyhow::anyhow!("other")).is_none());
    }

    #[test]
    fn a_program_that_does_not_start_is_named() {
        let err = output("the tool", &mut Command::new("/nonexistent/tool")).unwrap_err();
        assert!(err.downcast_ref::<CommandFailed>().is_none());
        assert!(
            format!("{err:#}").starts_with("cannot start the tool (`/nonexistent/tool`)"),
            "{err:#}"
        );
    }

    #[test]
    fn what_a_command_said_is_escaped_and_capped() {
        let failed = CommandFailed {
            what: "gpgv".into(),
            program: "gpgv".into(),
            args: vec!["--keyring".into(), "k\x1b]0;x\x07".into()],
            status: "exit status: 2".into(),
            stderr_tail: vec!["\x1b[2Jbad".into(), "x".repeat(1000)],
            log: Some(PathBuf::from("/some/dir/gpgv\r.log")),
        };
        let text = failed.to_string();
        assert!(!text.contains('\x1b') && !text.contains('\r') && !text.contains('\x07'));
        assert!(text.contains("\\x1b[2Jbad") && text.contains("its log: gpgv\\r.log"));
        let long = text.lines().last().unwrap();
        assert_eq!(long, format!("  | {}...", "x".repeat(300)));
    }
}
