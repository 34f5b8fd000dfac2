//! Adopting a real venv that pip filled with a fake-but-real stack (gcc-built libraries,
//! real wheels): torch whose library maps nvidia/nvshmem/lib/libnvshmem_host.so.3 (as the
//! real torch does), NCCL 2.28.9, NVIDIA's NVSHMEM built with NCCL on.
//!
//! The runtime check is the verify crate's, run in the venv's python: it fails while
//! NVIDIA's NVSHMEM is installed (even with DeepEP in place), passes once the drop-in
//! replaces it, fails on a second libnccl; `undo` puts the site-packages tree back byte
//! for byte.

#[path = "../../deepep/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use commstack_adopt::{self as adopt, Ours, Severity};
use commstack_deepep::python::PythonEnv;
use commstack_verify::Status;
use commstack_verify::runtime::RuntimeFindings;

fn check(findings: &RuntimeFindings, name: &str) -> Status {
    findings
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}: {:#?}", findings.checks))
        .status
}

fn detail<'a>(findings: &'a RuntimeFindings, name: &str) -> &'a str {
    &findings
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap()
        .detail
}

fn stack() -> commstack_stack::Stack {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../stacks/gpu-adopt.toml");
    commstack_stack::Stack::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// The fake stack, and a venv pip filled with its torch, NCCL 2.28.9 and NVIDIA's NVSHMEM:
/// the environment as NVIDIA's wheels leave it.
fn nvidias_environment(root: &Path) -> (FakeStack, std::path::PathBuf) {
    let fake = fake_stack(&root.join("fake"));
    let python = venv(&root.join("env"), true);
    let installed = [&fake.torch, &fake.nccl, &fake.nvidia_nvshmem];
    let paths: Vec<&str> = installed.iter().map(|w| w.path.to_str().unwrap()).collect();
    let out = pip(
        &python,
        &[&["install", "--no-index", "--no-deps"][..], &paths].concat(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (fake, python)
}

#[test]
fn adopt_replaces_nvidias_nvshmem_proves_it_and_undoes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (fake, python) = nvidias_environment(root);

    let env = PythonEnv::probe(&python).unwrap();
    assert_eq!(env.torch_version(), Some("2.11.0"));
    assert_eq!(env.torch_cuda(), Some("13.0"));
    assert_eq!(
        env.torch_pin("nvidia-nccl-cu").unwrap().version.to_string(),
        "2.28.9"
    );
    let site = env.site_packages().to_path_buf();
    let pristine = tree(&site);

    let lock = fake_lock(&[
        (&fake.torch, false),
        (&fake.nccl, false),
        (&fake.nvidia_nvshmem, true),
    ]);
    let stack = stack();
    let ours = Ours {
        dropin: Some(&fake.dropin),
        nccl: None,
        deepep: Some(&fake.deepep),
        nvshmem_version: Some("3.4.5"),
        rdc_fix: Some(true),
    };
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    let row = |what: &str| cmp.rows.iter().find(|r| r.what == what).unwrap().clone();
    assert_eq!(row("torch").severity, Severity::Ok, "{}", cmp.render());
    assert_eq!(row("nvidia-nccl-cu13").severity, Severity::Ok);
    assert_eq!(row("nvidia-nvshmem-cu13").severity, Severity::Change);
    assert!(row("nvidia-nvshmem-cu13").note.contains("NVIDIA's wheel"));
    assert_eq!(row("deep-ep").severity, Severity::Change);
    assert!(cmp.errors().is_empty(), "{}", cmp.render());

    let expect = adopt::expectations(&lock, &site).unwrap();
    let timeout = Duration::from_secs(120);

    // Today's state: torch maps NVIDIA's NVSHMEM (NCCL on). The check says so and why.
    let before = adopt::runtime_check(&python, &expect, timeout).unwrap();
    assert_eq!(check(&before, "nvshmem-host.nccl-off"), Status::Failed);
    assert!(
        detail(&before, "nvshmem-host.nccl-off")
            .contains("NVIDIA's nvidia-nvshmem wheel is still installed")
    );

    // The trap: DeepEP installed, NVIDIA's NVSHMEM left in place. Still NVIDIA's is mapped.
    let adopt_root = adopt::env_dir(&root.join("home"), &env);
    let only_deepep = adopt::plan(&env, std::slice::from_ref(&fake.deepep)).unwrap();
    assert!(only_deepep.backup.is_empty());
    adopt::apply(&only_deepep, &env, &adopt_root).unwrap();
    let trap = adopt::runtime_check(&python, &expect, timeout).unwrap();
    assert_eq!(
        check(&trap, "import.deep_ep"),
        Status::Passed,
        "{:#?}",
        trap.checks
    );
    assert_eq!(check(&trap, "nvshmem-host.nccl-off"), Status::Failed);
    assert_eq!(trap.status(), Status::Failed);

    // The drop-in: the dry run says what changes, the apply does it.
    let env = PythonEnv::probe(&python).unwrap();
    let before_plan = tree(&site);
    let p = adopt::plan(&env, std::slice::from_ref(&fake.dropin)).unwrap();
    let shown = p.render();
    assert!(
        shown.contains("replace nvidia-nvshmem-cu13 3.4.5 -> 3.4.5+commstack.gabc1234"),
        "{shown}"
    );
    assert!(
        p.backup
            .iter()
            .any(|f| f.ends_with("nvidia/nvshmem/lib/libnvshmem_host.so.3"))
    );
    assert_eq!(tree(&site), before_plan, "planning changes nothing");
    adopt::apply(&p, &env, &adopt_root).unwrap();
    let after = adopt::runtime_check(&python, &expect, timeout).unwrap();
    assert_eq!(after.status(), Status::Passed, "{:#?}", after.checks);
    assert!(detail(&after, "nvshmem-host.nccl-off").contains("NVSHMEM_USE_NCCL=OFF"));
    assert!(detail(&after, "nccl.version").contains("22809"));

    // pip sees the drop-in as installed, by name and version.
    let list = pip(&python, &["list", "--format=freeze"]);
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.contains("nvidia-nvshmem-cu13==3.4.5+commstack.gabc1234"),
        "{list}"
    );
    assert!(
        list.contains("deep_ep==1.2.1") || list.contains("deep-ep==1.2.1"),
        "{list}"
    );

    // Adopting again with the same wheels is a no-op.
    let env = PythonEnv::probe(&python).unwrap();
    let again = adopt::plan(&env, &[fake.dropin.clone(), fake.deepep.clone()]).unwrap();
    assert!(again.is_noop(), "{}", again.render());
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    assert!(
        cmp.rows.iter().all(|r| r.severity == Severity::Ok),
        "{}",
        cmp.render()
    );

    // Undo: both generations, newest first; the tree is the pristine one again.
    let undone = adopt::undo(&adopt_root).unwrap();
    assert_eq!(undone.len(), 2);
    assert_eq!(
        tree(&site),
        pristine,
        "undo must restore site-packages exactly"
    );
    assert!(adopt::generations(&adopt_root).unwrap().is_empty());
    let restored = adopt::runtime_check(&python, &expect, timeout).unwrap();
    assert_eq!(check(&restored, "nvshmem-host.nccl-off"), Status::Failed);
}

#[test]
fn a_second_libnccl_fails_the_runtime_check_and_a_failed_install_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let fake = fake_stack(&root.join("fake"));
    let python = venv(&root.join("env"), false);
    let env = PythonEnv::probe(&python).unwrap();
    let adopt_root = adopt::env_dir(&root.join("home"), &env);
    // Our own installer fills the env (no pip in it).
    let p = adopt::plan(
        &env,
        &[
            fake.torch.clone(),
            fake.nccl.clone(),
            fake.dropin.clone(),
            fake.deepep_second_nccl.clone(),
        ],
    )
    .unwrap();
    adopt::apply(&p, &env, &adopt_root).unwrap();
    let lock = fake_lock(&[
        (&fake.torch, false),
        (&fake.nccl, false),
        (&fake.nvidia_nvshmem, true),
    ]);
    let expect = adopt::expectations(&lock, env.site_packages()).unwrap();
    let f = adopt::runtime_check(&python, &expect, Duration::from_secs(120)).unwrap();
    assert_eq!(
        check(&f, "nccl.mapped-once"),
        Status::Failed,
        "{:#?}",
        f.checks
    );
    assert!(detail(&f, "nccl.mapped-once").contains("2 libnccl files are mapped"));
    assert_eq!(check(&f, "nvshmem-host.nccl-off"), Status::Passed);

    // A wheel that collides with a file another distribution owns is refused up front.
    let env = PythonEnv::probe(&python).unwrap();
    let clash = wheel(
        &root.join("clash"),
        "other",
        "1.0",
        ("py3", "none", "any"),
        true,
        &[],
        &[("torch/version.py", b"x = 1\n".to_vec())],
    );
    let err = adopt::plan(&env, &[clash]).unwrap_err().to_string();
    assert!(err.contains("which torch owns"), "{err}");

    // An install that fails half-way (a wheel whose RECORD lies) is rolled back at once.
    let before = tree(env.site_packages());
    let bad = root.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let good = fake.deepep.path.clone();
    let broken = bad.join(good.file_name().unwrap());
    corrupt_one_file(&good, &broken);
    let mut w = fake.deepep.clone();
    w.path = broken;
    let p = adopt::plan(&env, &[w]).unwrap();
    assert!(
        !p.backup.is_empty(),
        "replacing the installed deep_ep moves its files"
    );
    let err = adopt::apply(&p, &env, &adopt_root).unwrap_err();
    assert!(
        format!("{err:#}").contains("restored from the backup"),
        "{err:#}"
    );
    assert_eq!(tree(env.site_packages()), before);
    assert_eq!(
        adopt::generations(&adopt_root).unwrap().len(),
        1,
        "the failed generation is retired, the first one stays"
    );
    assert!(adopt_root.join("undone").read_dir().unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .contains("-failed-")
    }));
}

/// Copy a wheel changing the bytes of one file but not its RECORD line.
fn corrupt_one_file(from: &Path, to: &Path) {
    use std::io::{Read, Write};
    let mut zin = zip::ZipArchive::new(std::fs::File::open(from).unwrap()).unwrap();
    let mut zout = zip::ZipWriter::new(std::fs::File::create(to).unwrap());
    for i in 0..zin.len() {
        let mut f = zin.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes).unwrap();
        if name == "deep_ep/__init__.py" {
            bytes.extend_from_slice(b"# tampered\n");
        }
        zout.start_file(name, zip::write::SimpleFileOptions::default())
            .unwrap();
        zout.write_all(&bytes).unwrap();
    }
    zout.finish().unwrap();
}

/// A RECORD that lists files outside the environment (`../../../../x`, an absolute path):
/// adopt refuses, naming the entry, and moves nothing; `--dry-run`'s plan names every
/// path it would touch.
#[test]
fn record_entries_outside_the_environment_are_refused_and_nothing_moves() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let fake = fake_stack(&root.join("fake"));
    let python = venv(&root.join("env"), true);
    let out = pip(
        &python,
        &[
            "install",
            "--no-index",
            "--no-deps",
            fake.nvidia_nvshmem.path.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = PythonEnv::probe(&python).unwrap();

    // A clean RECORD: the plan lists every file it would move and write.
    let plan = adopt::plan(&env, std::slice::from_ref(&fake.dropin)).unwrap();
    let shown = plan.render();
    assert!(!plan.backup.is_empty());
    for p in plan.backup.iter().chain(&plan.added) {
        assert!(
            shown.contains(&p.display().to_string()),
            "{} not in:\n{shown}",
            p.display()
        );
    }

    // Outside files, and a RECORD that claims them.
    let outside = root.join("outside.txt");
    let absolute = root.join("absolute.txt");
    std::fs::write(&outside, "keep me").unwrap();
    std::fs::write(&absolute, "keep me too").unwrap();
    let info = env
        .dist("nvidia-nvshmem-cu13")
        .and_then(|d| d.dist_info.clone())
        .unwrap();
    let record = info.join("RECORD");
    let depth = info.strip_prefix(root).unwrap().components().count();
    let escape = format!("{}outside.txt", "../".repeat(depth));
    let mut text = std::fs::read_to_string(&record).unwrap();
    text.push_str(&format!("{escape},,\n{},,\n", absolute.display()));
    std::fs::write(&record, &text).unwrap();
    let tampered = text;
    let before = tree(&root.join("env"));

    let err = format!(
        "{:#}",
        adopt::plan(&env, std::slice::from_ref(&fake.dropin)).unwrap_err()
    );
    assert!(err.contains(&format!("entry {escape:?}")), "{err}");

    // Through a symlinked directory whose subdirectory does not exist yet: refused too.
    let elsewhere = root.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let site = env.site_packages().to_path_buf();
    std::os::unix::fs::symlink(&elsewhere, site.join("linked")).unwrap();
    let clean_record = std::fs::read_to_string(&record).unwrap();
    let clean_record: String = clean_record
        .lines()
        .filter(|l| !l.starts_with("../") && !l.starts_with('/'))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&record, format!("{clean_record}linked/new/x.so,,\n")).unwrap();
    let linked = format!(
        "{:#}",
        adopt::plan(&env, std::slice::from_ref(&fake.dropin)).unwrap_err()
    );
    assert!(
        linked.contains("entry \"linked/new/x.so\"") && linked.contains("which leads to"),
        "{linked}"
    );
    std::fs::remove_file(site.join("linked")).unwrap();
    std::fs::write(&record, &tampered).unwrap();
    assert!(
        err.contains("outside the environment") && err.contains("2 such entries"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me");
    assert_eq!(std::fs::read_to_string(&absolute).unwrap(), "keep me too");
    assert_eq!(tree(&root.join("env")), before, "nothing in the env moved");
}

/// `[nccl] from-source`: the stack's NCCL (2.30.7, over torch's 2.28.9 pin) replaces the
/// environment's, the runtime check then sees that one NCCL at the lock's version, and
/// undo puts NVIDIA's back byte for byte.
#[test]
fn a_stack_that_builds_nccl_replaces_the_environments_nccl_and_undo_puts_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (fake, python) = nvidias_environment(root);
    let env = PythonEnv::probe(&python).unwrap();
    let site = env.site_packages().to_path_buf();
    let pristine = tree(&site);

    let ours_nccl = wheel(
        &root.join("ours"),
        "nvidia-nccl-cu13",
        "2.30.7+commstack.gabc1234",
        ("py3", "none", "manylinux_2_17_x86_64"),
        true,
        &[],
        &[
            (
                "nvidia/nccl/lib/libnccl.so.2",
                read(&nccl_lib(&root.join("nccl-ours"), 23007)),
            ),
            (
                "nvidia/nccl/include/nccl.h",
                b"#define NCCL_MAJOR 2\n#define NCCL_MINOR 30\n".to_vec(),
            ),
        ],
    );
    let mut lock = fake_lock(&[
        (&fake.torch, false),
        (&fake.nccl, false),
        (&fake.nvidia_nvshmem, true),
    ]);
    lock.resolved.nccl = "nvidia-nccl-cu13==2.30.7".parse().unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../stacks/gpu-adopt-v2.toml");
    let stack =
        commstack_stack::Stack::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut ours = Ours {
        dropin: Some(&fake.dropin),
        nccl: None,
        deepep: Some(&fake.deepep),
        nvshmem_version: Some("3.4.5"),
        rdc_fix: Some(true),
    };
    // Without the stack's NCCL build, 2.28.9 is a mismatch adopt cannot fix.
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    let row = cmp
        .rows
        .iter()
        .find(|r| r.what == "nvidia-nccl-cu13")
        .unwrap();
    assert_eq!(row.severity, Severity::Error, "{}", cmp.render());
    assert!(row.note.contains("from-source = true"), "{}", row.note);
    // DeepEP V2's NCCL floor, judged on what the environment holds: violated.
    assert!(
        cmp.rows.iter().any(|r| r.what == "rule deepep-v2-nccl"),
        "{}",
        cmp.render()
    );
    // With it: a change, said as such.
    ours.nccl = Some(&ours_nccl);
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    let row = cmp
        .rows
        .iter()
        .find(|r| r.what == "nvidia-nccl-cu13")
        .unwrap();
    assert_eq!(row.severity, Severity::Change, "{}", cmp.render());
    assert!(
        row.note.contains("replaced by the stack's NCCL 2.30.7"),
        "{}",
        row.note
    );

    let wheels = [ours_nccl.clone(), fake.dropin.clone(), fake.deepep.clone()];
    let p = adopt::plan(&env, &wheels).unwrap();
    let shown = p.render();
    assert!(
        shown.contains("replace nvidia-nccl-cu13 2.28.9 -> 2.30.7+commstack.gabc1234"),
        "{shown}"
    );
    assert!(
        p.backup
            .iter()
            .any(|f| f.ends_with("nvidia/nccl/lib/libnccl.so.2"))
    );
    let adopt_root = adopt::env_dir(&root.join("home"), &env);
    adopt::apply(&p, &env, &adopt_root).unwrap();

    let expect = adopt::expectations(&lock, &site).unwrap();
    let after = adopt::runtime_check(&python, &expect, Duration::from_secs(120)).unwrap();
    assert_eq!(after.status(), Status::Passed, "{:#?}", after.checks);
    assert!(
        detail(&after, "nccl.version").contains("23007"),
        "{}",
        detail(&after, "nccl.version")
    );
    assert_eq!(check(&after, "nccl.mapped-once"), Status::Passed);
    let env = PythonEnv::probe(&python).unwrap();
    let cmp = adopt::compare(&env, &lock, Some(&stack), &ours);
    let row = cmp
        .rows
        .iter()
        .find(|r| r.what == "nvidia-nccl-cu13")
        .unwrap();
    assert_eq!(row.severity, Severity::Ok, "{}", cmp.render());

    adopt::undo(&adopt_root).unwrap();
    assert_eq!(
        tree(&site),
        pristine,
        "undo must restore site-packages exactly"
    );
    let restored = adopt::runtime_check(&python, &expect, Duration::from_secs(120)).unwrap();
    assert!(
        detail(&restored, "nccl.version").contains("22809"),
        "{}",
        detail(&restored, "nccl.version")
    );
    assert_eq!(check(&restored, "nccl.version"), Status::Failed);
}
