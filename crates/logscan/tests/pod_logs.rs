//! A job's collected pod logs (`kubectl logs --prefix`: `[pod/NAME/CONTAINER] ` before each
//! line) are classified as a node's log is, and each finding names the pods it came from.

use commstack_logscan::{KnowledgeBase, Scanner, UnknownLevel};

const ACCEPT: &str = "0bc8f5b83646:2374:2994 [0] proxy.cc:1458 NCCL WARN [Service thread] Accept failed Resource temporarily unavailable";
/// A c10d warning: known as one only by its glog prefix `[rank0]:[W1218 ...]`, which must
/// start the line.
const GLOG_WARNING: &str = "[rank0]:[W1218 20:27:21.420000 socket.cpp:752] [c10d] The client socket has timed out after 600000ms while trying to connect to (leader, 29500).";

fn scan(log: &str) -> commstack_logscan::ScanReport {
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    scanner.scan("gate.log", log.as_bytes()).unwrap();
    scanner.finish()
}

#[test]
fn prefixed_pod_logs_are_classified_as_a_nodes_log() {
    let pod0 = "pod/commstack-gate-selftest-0-0-x7k2p/selftest";
    let pod1 = "pod/commstack-gate-selftest-0-1-q9zt4/selftest";
    let log = format!(
        "[{pod0}] gate: self-test on node 0 of 2\n[{pod0}] {ACCEPT}\n[{pod1}] {GLOG_WARNING}\n[{pod1}] {ACCEPT}\n[{pod0}] {GLOG_WARNING}\n"
    );
    let prefixed = scan(&log);
    let plain = scan(&format!(
        "{ACCEPT}\n{GLOG_WARNING}\n{ACCEPT}\n{GLOG_WARNING}\n"
    ));

    // The same findings as the node's own log, with the same counts.
    let ids = |r: &commstack_logscan::ScanReport| {
        r.matches
            .iter()
            .map(|m| (m.id.clone(), m.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&prefixed), ids(&plain));
    let unknown = |r: &commstack_logscan::ScanReport| {
        r.unknown
            .iter()
            .map(|u| (u.level, u.template.clone(), u.count))
            .collect::<Vec<_>>()
    };
    assert_eq!(unknown(&prefixed), unknown(&plain));
    assert_eq!(prefixed.unknown.len(), 1, "{:#?}", prefixed.unknown);
    assert_eq!(prefixed.unknown[0].level, UnknownLevel::Warning);

    // Each names where it was first seen, pod and line, and every pod it came from.
    let hit = prefixed.hit("nccl-proxy-accept-failed").unwrap();
    assert_eq!(hit.first.line, 2);
    assert_eq!(hit.first.pod.as_deref(), Some(pod0));
    assert_eq!(hit.pods, [pod0, pod1]);
    assert!(!hit.example.contains("[pod/"), "{}", hit.example);
    assert_eq!(prefixed.unknown[0].first.pod.as_deref(), Some(pod1));
    assert!(
        plain
            .hit("nccl-proxy-accept-failed")
            .unwrap()
            .pods
            .is_empty()
    );

    // The human summary says which pod.
    let text = commstack_logscan::render_human(&prefixed);
    assert!(
        text.contains(&format!("first at gate.log:2 ({pod0}; 2 pods)")),
        "{text}"
    );
}

/// Only kubectl's exact form is a prefix: a line that merely starts with brackets is not
/// cut.
#[test]
fn other_bracketed_lines_are_left_whole() {
    let r = scan(&format!("[pod/x] {ACCEPT}\n[rank0] {ACCEPT}\n"));
    let hit = r.hit("nccl-proxy-accept-failed").unwrap();
    assert_eq!(hit.count, 2);
    assert_eq!(hit.first.pod, None);
}
