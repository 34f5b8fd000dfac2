//! The test runner and the exit-clean gate, on real python3 processes: teardown lines
//! printed from atexit, multiprocessing ranks, C stdio buffers, crashes and hangs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use commstack_verify::Status;
use commstack_verify::process::Exit;
use commstack_verify::runner::{
    Sentinel, TestOutcome, TestRun, TestSpec, parse_sentinel, run_test,
};

const ACCEPT_FAILED: &str = "gpu-node:2817:2901 [0] proxy.cc:1458 NCCL WARN [Service thread] Accept failed Resource temporarily unavailable";
const DESTROY_PG: &str = "[rank0]:[W1202 16:47:01.123456 2817 ProcessGroupNCCL.cpp:1479] Warning: WARNING: destroy_process_group() was not called before program exit, which can leak resources. For more info, please see https://pytorch.org/docs/stable/distributed.html#shutdown (function operator())";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn run(spec: &TestSpec) -> TestRun {
    run_test(Path::new("python3"), spec).unwrap()
}

#[test]
fn clean_test_passes_both() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_clean.py",
        "def test():\n    print('all good')\n",
    );
    let r = run(&TestSpec::function("clean", &f, "test"));
    assert_eq!(r.outcome, TestOutcome::Passed);
    assert_eq!(r.gate.status, Status::Passed, "{:#?}", r.gate);
    assert_eq!(r.gate.opened_by.as_ref().unwrap().name, "clean");
    let [t, g] = r.checks();
    assert_eq!((t.status, g.status), (Status::Passed, Status::Passed));
    assert!(r.captured.lines.iter().any(|l| l.text == "all good"));
}

#[test]
fn exit_time_warnings_after_return_fail_the_gate_with_cause_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_leaky.py",
        &format!(
            r#"
import atexit, sys
def teardown():
    print({ACCEPT_FAILED:?})
    print({DESTROY_PG:?}, file=sys.stderr)
atexit.register(teardown)
def test():
    # The same line during the run is the run's business, not the gate's.
    print({ACCEPT_FAILED:?})
"#
        ),
    );
    let r = run(&TestSpec::function("leaky", &f, "test"));
    assert_eq!(r.outcome, TestOutcome::Passed, "the test itself passed");
    assert_eq!(r.gate.status, Status::Failed);
    assert_eq!(r.gate.fatal.len(), 2, "{:#?}", r.gate.fatal);
    let sigs: Vec<Option<&str>> = r
        .gate
        .fatal
        .iter()
        .map(|f| f.signature.as_deref())
        .collect();
    assert!(sigs.contains(&Some("nccl-proxy-accept-failed")), "{sigs:?}");
    assert!(
        sigs.contains(&Some("torch-destroy-process-group-not-called")),
        "{sigs:?}"
    );
    assert!(
        r.gate
            .fatal
            .iter()
            .all(|f| !f.cause.is_empty() && !f.fix.is_empty())
    );
    let [_, g] = r.checks();
    assert_eq!(g.status, Status::Failed);
    assert!(
        g.detail
            .contains("2 exit-time lines after the test returned"),
        "{}",
        g.detail
    );
    assert!(
        g.fix.as_deref().unwrap().contains("destroy_process_group"),
        "{:?}",
        g.fix
    );
}

#[test]
fn warnings_the_knowledge_base_does_not_know_still_fail_by_marker() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_nvshmem.py",
        "import atexit\natexit.register(lambda: print('host:1:1 [0] NVSHMEM WARN something new at exit'))\ndef test():\n    pass\n",
    );
    let r = run(&TestSpec::function("nvshmem_warn", &f, "test"));
    assert_eq!(r.gate.status, Status::Failed);
    assert_eq!(r.gate.fatal[0].signature, None);
    assert!(
        r.gate.fatal[0]
            .cause
            .contains("NVSHMEM warned during teardown")
    );
}

#[test]
fn a_test_that_never_returns_is_not_passed() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_exit.py",
        "import os\ndef test():\n    os._exit(0)\n",
    );
    let r = run(&TestSpec::function("bail", &f, "test"));
    assert_eq!(
        r.outcome,
        TestOutcome::NotFinished {
            exit: Exit::Code { code: 0 }
        }
    );
    assert_eq!(r.gate.status, Status::NotRun);
    let [t, g] = r.checks();
    assert_eq!(
        t.status,
        Status::Failed,
        "exit code 0 without the sentinel is not a pass"
    );
    assert_eq!(g.status, Status::NotRun);

    let hang = write(
        dir.path(),
        "t_hang.py",
        "import time\ndef test():\n    time.sleep(60)\n",
    );
    let mut spec = TestSpec::function("hang", &hang, "test");
    spec.timeout = Duration::from_secs(2);
    let r = run(&spec);
    assert_eq!(
        r.outcome,
        TestOutcome::NotFinished {
            exit: Exit::TimedOut { after_s: 2 }
        }
    );
    assert!(r.captured.wall_ms < 20_000);
}

#[test]
fn a_crash_during_teardown_fails_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_segv.py",
        "import atexit, os, signal\natexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))\ndef test():\n    pass\n",
    );
    let r = run(&TestSpec::function("segv", &f, "test"));
    assert_eq!(r.outcome, TestOutcome::Passed);
    assert_eq!(r.gate.status, Status::Failed);
    assert!(
        r.gate
            .summary
            .contains("returned rc=0 but the process then ended with killed by signal 11"),
        "{}",
        r.gate.summary
    );
}

#[test]
fn scripts_get_their_arguments_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "t_script.py",
        "import sys\nprint('args', sys.argv[1:])\nif __name__ == '__main__':\n    sys.exit(int(sys.argv[2]))\n",
    );
    let r = run(&TestSpec::script("script", &f, &["--rc", "3"]));
    assert_eq!(r.outcome, TestOutcome::Failed { rc: 3 });
    assert!(
        r.captured
            .lines
            .iter()
            .any(|l| l.text == "args ['--rc', '3']")
    );
    assert_eq!(
        r.gate.status,
        Status::Passed,
        "rc 3 at the sentinel and at exit: teardown was clean"
    );
}

#[test]
fn c_stdio_written_during_the_test_is_flushed_before_the_sentinel() {
    let dir = tempfile::tempdir().unwrap();
    // printf into a pipe is block-buffered: without the wrapper's fflush it would come out
    // at exit, after the sentinel, and be judged as teardown.
    let f = write(
        dir.path(),
        "t_cbuf.py",
        "import ctypes\ndef test():\n    ctypes.CDLL(None).printf(b'h:1:1 [0] NCCL WARN during the run\\n')\n",
    );
    let mut spec = TestSpec::function("cbuf", &f, "test");
    // The runner sets PYTHONUNBUFFERED=1, which also unbuffers C stdio; a test environment
    // that clears it must still be judged right.
    spec.env.push(("PYTHONUNBUFFERED".into(), String::new()));
    let r = run(&spec);
    assert!(
        r.captured
            .lines
            .iter()
            .any(|l| l.text.contains("NCCL WARN during the run"))
    );
    assert_eq!(r.gate.status, Status::Passed, "{:#?}", r.gate);
}

const RANKS: &str = r#"
import multiprocessing as mp, multiprocessing.util as util, sys

def rank(i):
    # Printed after the rank's function returned, while its process shuts down.
    util.Finalize(None, lambda: print("h:%d:1 [%d] NCCL WARN [Proxy Service %d] Failed to execute operation Close from rank %d, retcode 3" % (i, i, i, i), flush=True), exitpriority=0)
    print("rank", i, "done", flush=True)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank, args=(i,)) for i in range(2)]
    for p in procs: p.start()
    for p in procs: p.join()
    sys.exit(max(p.exitcode for p in procs))
"#;

#[test]
fn ranks_teardown_is_judged_through_their_own_sentinels() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "t_ranks.py", RANKS);
    let r = run(&TestSpec::script("ranks", &f, &[]));
    assert_eq!(
        r.outcome,
        TestOutcome::Passed,
        "{}",
        r.captured.transcript()
    );
    let child_marks = r
        .captured
        .lines
        .iter()
        .filter_map(|l| parse_sentinel(&l.text))
        .filter(|s| s.name.starts_with("ranks/"))
        .count();
    assert_eq!(
        child_marks,
        4,
        "two ranks, each on stdout and stderr:\n{}",
        r.captured.transcript()
    );
    assert_eq!(r.gate.status, Status::Failed, "{}", r.captured.transcript());
    assert_eq!(r.gate.fatal.len(), 2);
    assert!(
        r.gate
            .fatal
            .iter()
            .all(|f| f.signature.as_deref() == Some("nccl-proxy-close-failed"))
    );

    // Without the rank marks, the lines land before the main sentinel and go unseen:
    // why the marks exist.
    let mut spec = TestSpec::script("ranks", &f, &[]);
    spec.mark_children = false;
    assert_eq!(run(&spec).gate.status, Status::Passed);
}

#[test]
fn an_existing_sitecustomize_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs");
    std::fs::create_dir_all(&theirs).unwrap();
    write(
        &theirs,
        "sitecustomize.py",
        "print('their sitecustomize ran')\n",
    );
    let f = write(dir.path(), "t_site.py", "def test():\n    pass\n");
    let mut spec = TestSpec::function("site", &f, "test");
    spec.env
        .push(("PYTHONPATH".into(), theirs.display().to_string()));
    let r = run(&spec);
    assert!(
        r.captured
            .lines
            .iter()
            .any(|l| l.text == "their sitecustomize ran"),
        "{}",
        r.captured.transcript()
    );
    assert_eq!(r.outcome, TestOutcome::Passed);
}

#[test]
fn sentinel_lines_parse() {
    assert_eq!(
        parse_sentinel("@@commstack: test-end intranode/Process-1 rc=0 pid=4242@@"),
        Some(Sentinel {
            name: "intranode/Process-1".into(),
            rc: 0,
            pid: 4242
        })
    );
    assert_eq!(
        parse_sentinel("partial line@@commstack: test-end t rc=-11 pid=1@@")
            .unwrap()
            .rc,
        -11
    );
    assert_eq!(parse_sentinel("@@commstack: test-end t rc=x pid=1@@"), None);
    assert_eq!(parse_sentinel("test-end t rc=0 pid=1"), None);
}
