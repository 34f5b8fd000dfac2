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

#[test]
fn stack_lock_round_trips() {
    round_trips("stack.lock", "requirements.lock");
}

#[test]
fn bookworm_lock_round_trips() {
    round_trips("stacks/bookworm.lock", "stacks/bookworm.requirements.lock");
}
