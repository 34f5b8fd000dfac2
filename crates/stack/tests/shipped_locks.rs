//! The locks in the repository read into the lock model and write back byte for byte: a
//! change to the model that would rewrite them (a field's type, its serde form) fails here,
//! not at the next `cargo xtask lock`.

use std::path::{Path, PathBuf};

use commstack_stack::Lock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn round_trips(lock: &str, requirements: &str) {
    let path = repo().join(lock);
    let text = std::fs::read_to_string(&path).unwrap();
    let parsed = Lock::parse(&path, &text).unwrap();
    assert_eq!(parsed.render(Some(&text)), text, "{lock}");
    let req = std::fs::read_to_string(repo().join(requirements)).unwrap();
    assert_eq!(parsed.requirements_txt(), req, "{requirements}");
}

/// The committed lock is what `cargo xtask lock` writes with no lock beside the manifest:
/// its canonical rendering, byte for byte, so the lock is a function of the manifest and
/// the index alone (issue 17). Offline: whether the index still gives these pins is
/// `cargo xtask lock --check --online`'s question.
fn is_canonical(lock: &str) {
    let path = repo().join(lock);
    let text = std::fs::read_to_string(&path).unwrap();
    let parsed = Lock::parse(&path, &text).unwrap();
    let fresh = parsed.render(None);
    if fresh != text {
        let line = fresh
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .map_or(fresh.lines().count().min(text.lines().count()), |i| i);
        panic!(
            "{lock} is not the canonical rendering of its model: from line {} it has {:?} \
             where a fresh lock has {:?}; run `cargo xtask lock --force` and commit the result",
            line + 1,
            text.lines().nth(line),
            fresh.lines().nth(line)
        );
    }
}

#[test]
fn stack_lock_is_canonical() {
    is_canonical("stack.lock");
}

#[test]
fn gpu_adopt_lock_is_canonical() {
    is_canonical("stacks/gpu-adopt.lock");
}

#[test]
fn stack_lock_round_trips() {
    round_trips("stack.lock", "requirements.lock");
}

#[test]
fn v2_lock_is_canonical() {
    is_canonical("stacks/v2.lock");
}

#[test]
fn v2_lock_round_trips() {
    round_trips("stacks/v2.lock", "stacks/v2.requirements.lock");
}

#[test]
fn gpu_adopt_v2_lock_is_canonical() {
    is_canonical("stacks/gpu-adopt-v2.lock");
}

#[test]
fn gpu_adopt_v2_lock_round_trips() {
    round_trips(
        "stacks/gpu-adopt-v2.lock",
        "stacks/gpu-adopt-v2.requirements.lock",
    );
}

#[test]
fn gpu_adopt_lock_round_trips() {
    round_trips(
        "stacks/gpu-adopt.lock",
        "stacks/gpu-adopt.requirements.lock",
    );
}

/// An empty or truncated lock says so and names the command that writes it again, instead
/// of blaming another commstack version.
#[test]
fn empty_and_truncated_locks_say_so() {
    let path = std::path::Path::new("stack.lock");
    let empty = commstack_stack::Lock::parse(path, "")
        .unwrap_err()
        .to_string();
    assert!(
        empty.contains("stack.lock is empty") && empty.contains("cargo xtask lock"),
        "{empty}"
    );
    assert!(!empty.contains("another commstack version"), "{empty}");
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../stack.lock"),
    )
    .unwrap();
    // Cut inside the header comments, before `version`: no version line.
    let head: String = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let cut = commstack_stack::Lock::parse(path, &head)
        .unwrap_err()
        .to_string();
    assert!(cut.contains("no lock format `version` line"), "{cut}");
    // Cut mid-way through a table.
    let half = &text[..text.len() / 2];
    let half = &half[..half.rfind('=').unwrap() + 2];
    let damaged = commstack_stack::Lock::parse(path, half)
        .unwrap_err()
        .to_string();
    assert!(damaged.contains("cargo xtask lock"), "{damaged}");
}
