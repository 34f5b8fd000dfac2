//! Small helpers shared by commands.

use std::path::Path;

use anyhow::{Context, Result};

/// A multi-threaded runtime for the commands that use the network.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Read the stack manifest, with an error that says how to pick another one.
pub fn read_stack(path: &Path) -> Result<commstack_stack::Stack> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!("cannot read the stack manifest {} (pick one with --stack FILE, e.g. --stack stacks/gpu-adopt.toml; without --stack, the nearest stack.toml in this directory or a parent is used)", path.display())
    })?;
    commstack_stack::Stack::parse(path, &text).map_err(|d| anyhow::anyhow!("{d}"))
}

/// Sizes in binary units ("1.50 GiB"), for every xtask command. A String, not
/// `indicatif::HumanBytes` itself: its Display ignores width, and tables pad sizes.
pub fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

static RESULTS_ON_STDERR: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on the flows print their result lines on stderr: stdout carries only the
/// JSON a `--json` run asked for.
pub fn results_to_stderr() {
    RESULTS_ON_STDERR.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn results_on_stderr() -> bool {
    RESULTS_ON_STDERR.load(std::sync::atomic::Ordering::Relaxed)
}

/// A result line of a flow: stdout, or stderr under `--json` (see [`results_to_stderr`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        if $crate::util::results_on_stderr() {
            eprintln!($($arg)*)
        } else {
            println!($($arg)*)
        }
    };
}

/// Who made an output: this commstack (version and commit) on this machine. It travels
/// with what `push` and `cache push` send (provenance), so a puller can say where a
/// binary came from.
pub fn builder() -> serde_json::Value {
    let read = |file: &str| {
        std::fs::read_to_string(file)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    serde_json::json!({
        "commstack": env!("CARGO_PKG_VERSION"),
        "commit": commstack_tools::git_identity().1,
        "host": read("/proc/sys/kernel/hostname"),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "arch": std::env::consts::ARCH,
    })
}

/// Says `line` through `say` unless this process said the same line already: a warning
/// about an input (an archive accepted by its tree hash, a source override) is said by
/// the first step that meets it, not again by each step that reads the same input.
pub fn warn_once(say: &dyn Fn(&str), line: &str) {
    static SAID: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let first = SAID
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(line.to_string());
    if first {
        say(line);
    }
}
