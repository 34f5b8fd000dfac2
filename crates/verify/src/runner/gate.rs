//! The exit-clean gate: what a test prints after its test function returned (after its
//! sentinel) is teardown. NCCL or NVSHMEM warnings, PyTorch's "destroy_process_group()
//! was not called", leaked CUDA IPC handles or leaked shared-memory objects there, or a
//! crash during teardown, mean the stack does not exit clean: the gate fails.
//!
//! Which lines are fatal is decided here (a short list of exit-time markers); what they
//! mean (cause, fix, reference) comes from commstack-logscan's knowledge base.

use commstack_logscan::{KnowledgeBase, LineClass, Phase, Severity};
use serde::Serialize;

use super::sentinel::{Sentinel, parse_sentinel};
use crate::check::Status;
use crate::process::{Captured, Exit, Line, Stream};

/// Exit-time markers that fail the gate after the sentinel, with a fallback explanation
/// for lines the knowledge base does not know.
const FATAL_MARKERS: &[(&str, &str, &str)] = &[
    (
        "NCCL WARN",
        "NCCL warned during teardown: communicators or proxy threads were still alive when the process (or a peer) exited",
        "destroy every NCCL process group before exit: `dist.barrier(); dist.destroy_process_group()` at the end of each rank",
    ),
    (
        "NVSHMEM WARN",
        "NVSHMEM warned during teardown: it was not finalized before exit",
        "call the NVSHMEM finalize path (DeepEP: destroy the Buffer) before the process exits",
    ),
    (
        "destroy_process_group() was not called",
        "PyTorch's ProcessGroupNCCL destructor ran with the group still registered: the test never destroyed its process group",
        "end each rank with `dist.barrier(); dist.destroy_process_group()`",
    ),
    (
        "Producer process has been terminated before all shared CUDA tensors released",
        "CUDA tensors shared through IPC were still referenced by another process when their producer exited: leaked IPC handles",
        "release shared CUDA tensors (and DeepEP buffers) in every consumer before the producer exits",
    ),
    (
        "leaked semaphore objects",
        "Python's resource_tracker cleaned up IPC semaphores nobody released",
        "close multiprocessing objects (queues, locks) and join child processes before exit",
    ),
    (
        "leaked shared_memory objects",
        "Python's resource_tracker cleaned up shared memory segments nobody unlinked",
        "close and unlink SharedMemory blocks before exit",
    ),
];

/// One line that fails the gate, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateFinding {
    pub line: Line,
    /// The knowledge-base signature, when logscan knows the line.
    pub signature: Option<String>,
    pub cause: String,
    pub fix: String,
    pub reference: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateResult {
    pub status: Status,
    /// The sentinel that opened teardown on each stream (the earliest of any process).
    pub opened_by: Option<Sentinel>,
    pub fatal: Vec<GateFinding>,
    /// Warning or error lines after the sentinel that are not fatal exit markers: listed
    /// for a human, not failing.
    pub unknown: Vec<Line>,
    /// Why the gate failed or could not judge, in one sentence.
    pub summary: String,
}

/// Judges `captured` against the main sentinel of test `name`.
pub fn exit_clean_gate(name: &str, captured: &Captured) -> GateResult {
    let main = captured
        .lines
        .iter()
        .filter_map(|l| parse_sentinel(&l.text))
        .find(|s| s.name == name);
    let Some(main) = main else {
        return GateResult {
            status: Status::NotRun,
            opened_by: None,
            fatal: Vec::new(),
            unknown: Vec::new(),
            summary: format!(
                "the test never reached its end ({}): its teardown cannot be judged",
                captured.exit
            ),
        };
    };
    let kb = KnowledgeBase::builtin();
    let mut fatal = Vec::new();
    let mut unknown = Vec::new();
    let mut opened_by: Option<(u64, Sentinel)> = None;
    for stream in [Stream::Stdout, Stream::Stderr] {
        let mut open = false;
        for line in captured.stream(stream) {
            if let Some(s) = parse_sentinel(&line.text) {
                // A rank's end opens teardown too: peers' exit-time lines follow it.
                if s.name == name || s.name.starts_with(&format!("{name}/")) {
                    if !open && opened_by.as_ref().is_none_or(|(t, _)| *t > line.t_ms) {
                        opened_by = Some((line.t_ms, s));
                    }
                    open = true;
                }
                continue;
            }
            if !open {
                continue;
            }
            match judge_line(kb, &line.text) {
                Judged::Fatal {
                    signature,
                    cause,
                    fix,
                    reference,
                } => fatal.push(GateFinding {
                    line: line.clone(),
                    signature,
                    cause,
                    fix,
                    reference,
                }),
                Judged::Unknown => unknown.push(line.clone()),
                Judged::Fine => {}
            }
        }
    }
    // A crash during teardown (segfault in a destructor, `terminate called`) is not clean
    // either, even when nothing was printed.
    let crashed = match captured.exit {
        Exit::Code { code } if code == main.rc => None,
        other => Some(format!(
            "the test returned rc={} but the process then ended with {other}",
            main.rc
        )),
    };
    let status = if fatal.is_empty() && crashed.is_none() {
        Status::Passed
    } else {
        Status::Failed
    };
    let summary = match (&crashed, fatal.len()) {
        (None, 0) => "nothing fatal after the test returned".to_string(),
        (Some(c), 0) => c.clone(),
        (c, n) => format!(
            "{n} exit-time line{} after the test returned{}",
            if n == 1 { "" } else { "s" },
            c.as_ref().map(|c| format!("; {c}")).unwrap_or_default()
        ),
    };
    GateResult {
        status,
        opened_by: opened_by.map(|(_, s)| s),
        fatal,
        unknown,
        summary,
    }
}

enum Judged {
    Fatal {
        signature: Option<String>,
        cause: String,
        fix: String,
        reference: Option<String>,
    },
    Unknown,
    Fine,
}

fn judge_line(kb: &KnowledgeBase, text: &str) -> Judged {
    let marker = FATAL_MARKERS.iter().find(|(m, _, _)| text.contains(m));
    match (kb.classify_bytes(text.as_bytes()), marker) {
        (LineClass::Known(sig), m)
            if m.is_some() || sig.phase == Phase::Exit || sig.severity == Severity::Error =>
        {
            Judged::Fatal {
                signature: Some(sig.id.clone()),
                cause: sig.cause.clone(),
                fix: sig.fix.clone(),
                reference: Some(sig.reference.clone()),
            }
        }
        (_, Some((_, cause, fix))) => Judged::Fatal {
            signature: None,
            cause: cause.to_string(),
            fix: fix.to_string(),
            reference: None,
        },
        (LineClass::Known(_) | LineClass::Unknown(_), None) => Judged::Unknown,
        (LineClass::Other, None) => Judged::Fine,
    }
}
