//! `cargo xtask store ls` and `store gc --unsigned` on a store holding a step that entered
//! without a trusted signature (as `build --allow-unsigned` leaves one) beside one built
//! here: the listing marks the first, and gc --unsigned removes it and only it.

use commstack_store::{StepKey, Store};
use serde_json::json;

mod common;
use common::{text, xtask};

#[test]
fn store_ls_marks_unsigned_steps_and_gc_unsigned_removes_only_them() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open(home.path().join("store")).unwrap();
    let pulled = StepKey::new("pipeline-dropin", &json!({"v": 1}));
    store
        .run(&pulled, &json!({"v": 1}), false, |dir| {
            dir.mark_unsigned("pulled from r.example/cache:dropin-1@sha256:ab with --allow-unsigned: it is not signed");
            Ok(std::fs::write(dir.out.join("result.json"), "{}")?)
        })
        .unwrap();
    let built = StepKey::new("pipeline-nvshmem", &json!({"v": 2}));
    store
        .run(&built, &json!({"v": 2}), false, |dir| {
            Ok(std::fs::write(dir.out.join("result.json"), "{}")?)
        })
        .unwrap();

    let out = xtask(home.path(), &["store", "ls"]);
    let listing = text(&out);
    assert!(out.status.success(), "{listing}");
    let row = |step: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(step))
            .unwrap_or_else(|| panic!("no row for {step}:\n{listing}"))
            .to_string()
    };
    assert!(
        row("pipeline-dropin").contains("UNSIGNED: pulled from r.example/cache:dropin-1"),
        "{listing}"
    );
    assert!(!row("pipeline-nvshmem").contains("UNSIGNED"), "{listing}");
    assert!(
        listing.contains("1 steps entered without a trusted signature")
            && listing.contains("cargo xtask store gc --unsigned"),
        "{listing}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&xtask(home.path(), &["store", "ls", "--json"]).stdout).unwrap();
    let marked: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["meta"]["unsigned"].is_string())
        .map(|s| s["meta"]["step"].as_str().unwrap())
        .collect();
    assert_eq!(marked, ["pipeline-dropin"]);

    let out = xtask(home.path(), &["store", "gc", "--unsigned"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&pulled.dir_name()), "{}", text(&out));
    assert!(
        store.lookup(&pulled).is_none(),
        "the unsigned step is removed"
    );
    assert!(store.lookup(&built).is_some(), "the one built here stays");
    assert!(!text(&xtask(home.path(), &["store", "ls"])).contains("UNSIGNED"));
}
