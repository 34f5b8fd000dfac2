//! Running a child process with its stdout and stderr captured line by line, each line
//! time-stamped, under a time limit that kills the whole process group (a test's ranks
//! included).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of output; bytes that are not UTF-8 are replaced, never fatal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Line {
    /// Milliseconds since the process started.
    pub t_ms: u64,
    pub stream: Stream,
    pub text: String,
}

/// How the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Exit {
    Code {
        code: i32,
    },
    Signal {
        signal: i32,
    },
    /// Killed by us after the time limit.
    TimedOut {
        after_s: u64,
    },
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code { code } => write!(f, "exit code {code}"),
            Exit::Signal { signal } => write!(f, "killed by signal {signal}"),
            Exit::TimedOut { after_s } => write!(f, "timed out after {after_s} s and was killed"),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Captured {
    /// The program and its arguments, as run.
    pub program: String,
    pub args: Vec<String>,
    /// stdout and stderr lines, each stream in its own order, merged by time stamp.
    pub lines: Vec<Line>,
    pub exit: Exit,
    pub wall_ms: u64,
}

impl Captured {
    /// This run as a failed command: its exit and its last lines (of stderr, else of
    /// everything it said). `what` says what it was for.
    pub fn failed(&self, what: &str) -> commstack_exec::CommandFailed {
        let text = |stream: Option<Stream>| -> String {
            self.lines
                .iter()
                .filter(|l| stream.is_none_or(|s| l.stream == s))
                .map(|l| format!("{}\n", l.text))
                .collect()
        };
        let mut tail =
            commstack_exec::last_lines(&text(Some(Stream::Stderr)), commstack_exec::MAX_LINES);
        if tail.is_empty() {
            tail = commstack_exec::last_lines(&text(None), commstack_exec::MAX_LINES);
        }
        commstack_exec::CommandFailed {
            what: what.to_string(),
            program: self.program.clone(),
            args: self.args.clone(),
            status: self.exit.to_string(),
            stderr_tail: tail,
            log: None,
        }
    }

    pub fn stream(&self, stream: Stream) -> impl Iterator<Item = &Line> {
        self.lines.iter().filter(move |l| l.stream == stream)
    }

    /// The whole output as text, `[+1.234s] [err] line`.
    pub fn transcript(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            let tag = match l.stream {
                Stream::Stdout => "out",
                Stream::Stderr => "err",
            };
            out.push_str(&format!(
                "[+{}.{:03}s] [{tag}] {}\n",
                l.t_ms / 1000,
                l.t_ms % 1000,
                l.text
            ));
        }
        out
    }
}

/// Runs `cmd` (stdin closed) in its own process group and captures its output.
pub fn run_captured(mut cmd: Command, timeout: Duration) -> Result<Captured> {
    let shown = format!("{cmd:?}");
    let program = cmd.get_program().to_string_lossy().into_owned();
    let args = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {shown}"))?;
    let (tx, rx) = mpsc::channel();
    let readers = [
        spawn_reader(
            child.stdout.take().expect("piped"),
            Stream::Stdout,
            start,
            tx.clone(),
        ),
        spawn_reader(
            child.stderr.take().expect("piped"),
            Stream::Stderr,
            start,
            tx,
        ),
    ];
    let exit =
        wait_with_timeout(&mut child, timeout).with_context(|| format!("waiting for {shown}"))?;
    // After a kill, grandchildren that kept the pipes open are gone too (process group).
    for r in readers {
        let _ = r.join();
    }
    let mut lines: Vec<Line> = rx.into_iter().collect();
    // Stable: lines of one stream keep their order.
    lines.sort_by_key(|l| l.t_ms);
    Ok(Captured {
        program,
        args,
        lines,
        exit,
        wall_ms: start.elapsed().as_millis() as u64,
    })
}

fn spawn_reader(
    pipe: impl Read + Send + 'static,
    stream: Stream,
    start: Instant,
    tx: mpsc::Sender<Line>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string();
                    let t_ms = start.elapsed().as_millis() as u64;
                    if tx.send(Line { t_ms, stream, text }).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::io::Result<Exit> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            kill_group(child.id());
            return Ok(exit_of(status));
        }
        if Instant::now() >= deadline {
            kill_group(child.id());
            child.wait()?;
            return Ok(Exit::TimedOut {
                after_s: timeout.as_secs(),
            });
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills what is left of the process group (ranks a test forgot): their output would
/// otherwise hold our pipes open.
fn kill_group(pgid: u32) {
    // Safety: kill(2) with a negative pid signals the group we created for this child.
    unsafe {
        libc::kill(-(pgid as i32), libc::SIGKILL);
    }
}

fn exit_of(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code { code },
        (None, Some(signal)) => Exit::Signal { signal },
        (None, None) => Exit::Code { code: -1 },
    }
}
