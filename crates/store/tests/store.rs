use std::fs;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use commstack_store::{GcOptions, Outcome, StepKey, Store};
use serde_json::json;

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    (dir, store)
}

#[test]
fn second_run_is_a_no_op_and_changed_input_rebuilds() {
    let (_d, store) = store();
    let inputs = json!({"source": "sha256:aa", "archs": ["90"]});
    let key = StepKey::new("demo", &inputs);
    let mut runs = 0;
    let first = store
        .run(&key, &inputs, false, |dir| {
            runs += 1;
            fs::write(dir.out.join("lib.so"), b"built")?;
            Ok(())
        })
        .unwrap();
    assert!(matches!(first, Outcome::Built { .. }));
    let second = store
        .run(&key, &inputs, false, |_| panic!("must not run again"))
        .unwrap();
    assert!(second.was_cached());
    assert_eq!(first.path(), second.path());
    assert_eq!(fs::read(second.path().join("lib.so")).unwrap(), b"built");
    assert_eq!(runs, 1);

    let other = json!({"source": "sha256:aa", "archs": ["90", "100"]});
    let key2 = StepKey::new("demo", &other);
    assert_ne!(key.hash, key2.hash);
    let third = store
        .run(&key2, &other, false, |dir| {
            Ok(fs::write(dir.out.join("x"), b"y")?)
        })
        .unwrap();
    assert!(!third.was_cached());
    assert_ne!(third.path(), first.path());
}

#[test]
fn key_ignores_json_key_order() {
    let a: serde_json::Value = serde_json::from_str(r#"{"x":1,"y":2}"#).unwrap();
    let b: serde_json::Value = serde_json::from_str(r#"{"y":2,"x":1}"#).unwrap();
    assert_eq!(StepKey::new("s", &a), StepKey::new("s", &b));
    assert_ne!(StepKey::new("s", &a), StepKey::new("t", &a));
}

#[test]
fn failure_never_looks_done_and_keeps_logs() {
    let (_d, store) = store();
    let inputs = json!({"v": 1});
    let key = StepKey::new("failing", &inputs);
    let err = store
        .run(&key, &inputs, false, |dir| {
            fs::write(dir.out.join("half.so"), b"partial")?;
            fs::write(dir.logs.join("build.log"), b"error: boom")?;
            anyhow::bail!("compiler exploded")
        })
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("compiler exploded"), "{msg}");
    assert!(msg.contains("failed"), "{msg}");
    assert!(
        store.lookup(&key).is_none(),
        "a failed step must not look done"
    );
    let failed = store.failed_path(&key);
    assert_eq!(
        fs::read(failed.join("logs/build.log")).unwrap(),
        b"error: boom"
    );
    // The next successful run replaces the failed attempt.
    store
        .run(&key, &inputs, false, |dir| {
            Ok(fs::write(dir.out.join("ok"), b"1")?)
        })
        .unwrap();
    assert!(store.lookup(&key).is_some());
    assert!(!failed.exists());
}

#[test]
fn a_crashed_step_is_invisible_and_gc_removes_it() {
    let (_d, store) = store();
    let inputs = json!({"v": 2});
    let key = StepKey::new("crashy", &inputs);
    // Simulate a process killed mid-build: a temp dir with content and no lock held.
    let tmp = store
        .root()
        .join("tmp")
        .join(format!("{}.99999.0", key.dir_name()));
    fs::create_dir_all(&tmp).unwrap();
    fs::write(tmp.join("half"), b"x").unwrap();
    assert!(store.lookup(&key).is_none());
    let report = store.gc(&GcOptions::default()).unwrap();
    assert_eq!(report.removed.len(), 1);
    assert!(!tmp.exists());
}

#[test]
fn force_rebuilds_and_replaces() {
    let (_d, store) = store();
    let inputs = json!({"v": 3});
    let key = StepKey::new("forced", &inputs);
    store
        .run(&key, &inputs, false, |dir| {
            Ok(fs::write(dir.out.join("f"), b"old")?)
        })
        .unwrap();
    let again = store
        .run(&key, &inputs, true, |dir| {
            Ok(fs::write(dir.out.join("f"), b"new")?)
        })
        .unwrap();
    assert!(!again.was_cached());
    assert_eq!(fs::read(again.path().join("f")).unwrap(), b"new");
}

#[test]
fn concurrent_runs_of_one_step_build_once() {
    let (_d, store) = store();
    let store = Arc::new(store);
    let inputs = json!({"v": 4});
    let key = StepKey::new("racy", &inputs);
    let builds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (store, key, inputs, builds, barrier) = (
                store.clone(),
                key.clone(),
                inputs.clone(),
                builds.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                store
                    .run(&key, &inputs, false, |dir| {
                        builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(100));
                        Ok(fs::write(dir.out.join("f"), b"once")?)
                    })
                    .unwrap()
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(builds.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(store.list().unwrap().len(), 1);
}

#[test]
fn gc_unused_respects_keep_list() {
    let (_d, store) = store();
    for v in 0..3 {
        let inputs = json!({"v": v});
        let key = StepKey::new("aged", &inputs);
        store
            .run(&key, &inputs, false, |dir| {
                Ok(fs::write(dir.out.join("f"), b"z")?)
            })
            .unwrap();
    }
    let keep_key = StepKey::new("aged", &json!({"v": 0})).dir_name();
    let opts = GcOptions {
        unused_for: Some(Duration::ZERO),
        keep: vec![keep_key.clone()],
        dry_run: true,
        ..GcOptions::default()
    };
    let report = store.gc(&opts).unwrap();
    assert_eq!(report.removed.len(), 2);
    assert_eq!(store.list().unwrap().len(), 3, "dry run removes nothing");
    let report = store
        .gc(&GcOptions {
            dry_run: false,
            ..opts
        })
        .unwrap();
    assert_eq!(report.removed.len(), 2);
    let left = store.list().unwrap();
    assert_eq!(left.len(), 1);
    assert!(left[0].path.ends_with(&keep_key));
}

#[test]
fn outputs_have_the_same_modes_whatever_the_umask_made() {
    use std::os::unix::fs::PermissionsExt;
    let (_d, store) = store();
    let inputs = json!({"modes": 1});
    let key = StepKey::new("modes", &inputs);
    let out = store
        .run(&key, &inputs, false, |dir| {
            // What a umask of 077 leaves: owner-only files and directories.
            let sub = dir.out.join("bin");
            fs::create_dir(&sub)?;
            fs::write(sub.join("tool"), "#!/bin/sh\n")?;
            fs::write(dir.out.join("data"), "x")?;
            fs::set_permissions(&sub, fs::Permissions::from_mode(0o700))?;
            fs::set_permissions(sub.join("tool"), fs::Permissions::from_mode(0o700))?;
            fs::set_permissions(dir.out.join("data"), fs::Permissions::from_mode(0o600))?;
            std::os::unix::fs::symlink("bin/tool", dir.out.join("link"))?;
            Ok(())
        })
        .unwrap();
    let mode = |rel: &str| {
        fs::metadata(out.path().join(rel))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin"), 0o755);
    assert_eq!(mode("bin/tool"), 0o755);
    assert_eq!(mode("data"), 0o644);
    assert_eq!(mode("."), 0o755);
    assert!(
        fs::symlink_metadata(out.path().join("link"))
            .unwrap()
            .is_symlink()
    );
}

/// Two processes substituting into one store would write the same `tmp/pull-<digest>`
/// file: the downloads lock makes the second wait until the first lets go.
#[test]
fn the_downloads_lock_makes_a_second_holder_wait() {
    let (dir, store) = store();
    let held = store.lock_downloads().unwrap();
    let root = dir.path().join("store");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        // Another handle, as another process would have.
        let other = Store::open(root).unwrap();
        let _lock = other.lock_downloads().unwrap();
        tx.send(()).unwrap();
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the second holder did not wait"
    );
    drop(held);
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the second holder got the lock once the first let go");
    waiter.join().unwrap();
}

/// A step marked unsigned (a binary cache's output taken with --allow-unsigned) says so in
/// its `.step.json`; `run` does not reuse it but builds it again, unmarked; `gc
/// --unsigned` removes the marked ones and only those.
#[test]
fn a_step_that_entered_unsigned_is_marked_never_reused_and_collected() {
    let (_d, store) = store();
    let inputs = json!({"pulled": 1});
    let key = StepKey::new("pulled", &inputs);
    store
        .run(&key, &inputs, false, |dir| {
            dir.mark_unsigned("taken from r/c:pulled-1@sha256:ab with --allow-unsigned");
            Ok(fs::write(dir.out.join("f"), b"from the cache")?)
        })
        .unwrap();
    let why = store.unsigned(&key).expect("marked");
    assert!(why.contains("--allow-unsigned"), "{why}");
    let meta: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(store.path(&key).join(".step.json")).unwrap())
            .unwrap();
    assert_eq!(meta["unsigned"], why);

    // A local build of the same key builds it here and replaces it.
    let again = store
        .run(&key, &inputs, false, |dir| {
            Ok(fs::write(dir.out.join("f"), b"built here")?)
        })
        .unwrap();
    assert!(!again.was_cached(), "a marked step is not reused");
    assert_eq!(fs::read(again.path().join("f")).unwrap(), b"built here");
    assert!(store.unsigned(&key).is_none());
    assert!(
        store
            .run(&key, &inputs, false, |_| Ok(()))
            .unwrap()
            .was_cached()
    );

    // gc --unsigned: only the marked ones go.
    let other = json!({"pulled": 2});
    let marked = StepKey::new("pulled", &other);
    store
        .run(&marked, &other, false, |dir| {
            dir.mark_unsigned("not signed");
            Ok(())
        })
        .unwrap();
    let report = store
        .gc(&GcOptions {
            unsigned: true,
            ..GcOptions::default()
        })
        .unwrap();
    assert_eq!(report.removed.len(), 1, "{:?}", report.removed);
    assert!(store.lookup(&marked).is_none());
    assert!(store.lookup(&key).is_some());
}

/// What a killed run left in tmp/ goes at the next `clear_abandoned`; a directory whose
/// step lock is held (being built now) and a blob download (continued by a rerun) stay.
#[test]
fn abandoned_temporary_directories_are_cleared_but_not_busy_ones_or_downloads() {
    let (_d, store) = store();
    let tmp = store.root().join("tmp");
    let left = tmp.join(format!(
        "{}.99999.0",
        StepKey::new("left", &json!(1)).dir_name()
    ));
    let old = tmp.join(format!(
        "{}.old.99999",
        StepKey::new("old", &json!(1)).dir_name()
    ));
    let busy_key = StepKey::new("busy", &json!(1));
    let busy = tmp.join(format!("{}.1.0", busy_key.dir_name()));
    let download = tmp.join(format!("pull-{}.tar", "ab".repeat(32)));
    for d in [&left, &old, &busy] {
        fs::create_dir_all(d.join("logs")).unwrap();
    }
    fs::write(&download, b"half a blob").unwrap();
    let lock = fs::File::create(
        store
            .root()
            .join("locks")
            .join(format!("{}.lock", busy_key.dir_name())),
    )
    .unwrap();
    lock.try_lock().unwrap();
    let cleared = store.clear_abandoned().unwrap();
    assert_eq!(cleared.removed.len(), 2, "{:?}", cleared.removed);
    assert!(cleared.failed.is_empty(), "{:?}", cleared.failed);
    assert!(!left.exists() && !old.exists());
    assert!(busy.exists() && download.exists());
}

#[test]
fn a_name_read_from_outside_is_checked_not_asserted() {
    for bad in ["../x", "a/b", "", "a.b", "x\ny", &"n".repeat(200)] {
        let err = StepKey::try_new(bad, &json!({})).unwrap_err().to_string();
        assert!(err.contains("cannot name a step"), "{bad:?}: {err}");
        assert!(!err.contains('\n'), "{err}");
    }
    assert_eq!(
        StepKey::try_new("fine-step_1", &json!({"a": 1})).unwrap(),
        StepKey::new("fine-step_1", &json!({"a": 1}))
    );
}

/// A step whose output holds directories of mode 0555 and 0000 (an archive's) fails,
/// twice, as a user who is not root: the second attempt replaces the first in `failed/`
/// (nothing is left in `tmp/`), and `store gc` removes it all.
#[test]
fn a_normal_user_cleans_up_a_failed_step_with_read_only_directories() {
    commstack_testkit::as_non_root(
        "a_normal_user_cleans_up_a_failed_step_with_read_only_directories",
        |dir| {
            use std::os::unix::fs::PermissionsExt;
            let store = Store::open(dir.join("store")).unwrap();
            let inputs = json!({"source": "sha256:ro"});
            let key = StepKey::new("nvshmem-source", &inputs);
            for _ in 0..2 {
                let err = store
                    .run(&key, &inputs, false, |out| {
                        for (name, mode) in [("ro", 0o555), ("none", 0o000)] {
                            let d = out.out.join("src").join(name);
                            fs::create_dir_all(d.join("sub")).unwrap();
                            fs::write(d.join("sub/file.c"), b"x").unwrap();
                            fs::set_permissions(&d, fs::Permissions::from_mode(mode)).unwrap();
                        }
                        anyhow::bail!("the tree hash differs")
                    })
                    .unwrap_err();
                let err = format!("{err:#}");
                assert!(err.contains("kept in"), "{err}");
            }
            let listed = |sub: &str| fs::read_dir(store.root().join(sub)).unwrap().count();
            assert_eq!(listed("tmp"), 0, "a failed attempt was left in tmp/");
            assert_eq!(listed("failed"), 1);
            let report = store.gc(&GcOptions::default()).unwrap();
            assert_eq!(report.removed.len(), 1);
            assert_eq!((listed("tmp"), listed("failed")), (0, 0));
        },
    );
}
