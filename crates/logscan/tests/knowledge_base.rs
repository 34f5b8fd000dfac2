//! The knowledge base against the real message texts: every example line, every fixture log.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use commstack_logscan::{
    KnowledgeBase, LineClass, Phase, ScanReport, Scanner, Severity, UnknownLevel, render_human,
    scan_reader,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn scan_fixture(name: &str) -> ScanReport {
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    scanner
        .scan(name, File::open(fixture(name)).unwrap())
        .unwrap();
    scanner.finish()
}

const FIXTURES: &[&str] = &[
    "deepep-intranode-exit.log",
    "nvshmem-init.log",
    "build.log",
    "import-and-run.log",
];

#[test]
fn every_example_classifies_to_its_own_signature() {
    let kb = KnowledgeBase::builtin();
    assert!(kb.signatures().len() >= 20);
    for sig in kb.signatures() {
        assert!(!sig.examples.is_empty(), "{} has no example line", sig.id);
        for example in &sig.examples {
            let got = kb.classify_line(example).map(|s| s.id.as_str());
            assert_eq!(
                got,
                Some(sig.id.as_str()),
                "example of {} classified as {got:?}: {example}",
                sig.id
            );
        }
    }
}

#[test]
fn every_example_holds_one_of_its_needles() {
    // The needles are the prefilter: a matching line without one would never be seen.
    for sig in KnowledgeBase::builtin().signatures() {
        for example in &sig.examples {
            assert!(
                sig.needles.iter().any(|n| example.contains(n.as_str())),
                "{}: example holds none of {:?}: {example}",
                sig.id,
                sig.needles
            );
        }
    }
}

#[test]
fn needles_are_at_least_three_bytes() {
    // Shorter literals make the SIMD prefilter fingerprint on 2 bytes and run ~2x slower.
    for sig in KnowledgeBase::builtin().signatures() {
        assert!(
            sig.needles.iter().all(|n| n.len() >= 3),
            "{}: needle shorter than 3 bytes",
            sig.id
        );
    }
}

#[test]
fn every_signature_is_met_in_a_fixture_log() {
    let kb = KnowledgeBase::builtin();
    let mut seen = BTreeSet::new();
    for name in FIXTURES {
        seen.extend(scan_fixture(name).matches.into_iter().map(|m| m.id));
    }
    let all: BTreeSet<String> = kb.signatures().iter().map(|s| s.id.clone()).collect();
    let missing: Vec<_> = all.difference(&seen).collect();
    assert!(missing.is_empty(), "no fixture line for {missing:?}");
}

#[test]
fn deepep_intranode_exit_is_four_known_exit_warnings_and_nothing_fatal() {
    let report = scan_fixture("deepep-intranode-exit.log");
    let got: Vec<_> = report
        .matches
        .iter()
        .map(|m| (m.id.as_str(), m.phase, m.count, m.first.line))
        .collect();
    assert_eq!(
        got,
        [
            ("nccl-proxy-accept-failed", Phase::Exit, 2, 5),
            ("nccl-proxy-recv-type-failed", Phase::Exit, 1, 8),
            ("nccl-proxy-close-failed", Phase::Exit, 1, 10),
            ("torch-destroy-process-group-not-called", Phase::Exit, 1, 26),
        ]
    );
    assert!(report.unknown.is_empty(), "{:?}", report.unknown);
    assert!(!report.has_fatal());
    assert_eq!(report.sources[0].lines, 26);
    let accept = report.hit("nccl-proxy-accept-failed").unwrap();
    assert!(accept.fix.contains("destroy_process_group"));
    assert_eq!(
        accept.reference,
        "https://github.com/deepseek-ai/DeepEP/issues/41"
    );
    assert!(accept.see_also.iter().any(|u| u.contains("c8dceba")));
    assert!(accept.see_also.iter().any(|u| u.contains("0c984e2")));
}

#[test]
fn nvshmem_init_failures_are_fatal_and_unexplained_lines_are_listed() {
    let report = scan_fixture("nvshmem-init.log");
    assert!(report.has_fatal());
    assert_eq!(report.hit("nvshmem-no-peermem").unwrap().count, 2);
    assert_eq!(
        report
            .hit("nvshmem-host-device-version-mismatch")
            .unwrap()
            .count,
        2
    );
    assert_eq!(
        report.hit("nvshmem-ibgda-uar-alloc-failed").unwrap().count,
        2
    );
    assert_eq!(
        report
            .hit("nvshmem-ibgda-gpu-cannot-map-nic")
            .unwrap()
            .count,
        2
    );
    let unknown: Vec<_> = report
        .unknown
        .iter()
        .map(|u| (u.level, u.first.line))
        .collect();
    // init.cu:998 "building transport map failed", "WARN: init failed for remote transport",
    // init.cu:989 "nvshmem detect topo failed". INFO lines and "not accessible, exiting" are not.
    assert_eq!(
        unknown,
        [
            (UnknownLevel::Error, 10),
            (UnknownLevel::Error, 13),
            (UnknownLevel::Error, 16)
        ]
    );
}

#[test]
fn build_failures_are_build_phase_errors() {
    let report = scan_fixture("build.log");
    let ids: Vec<_> = report
        .matches
        .iter()
        .map(|m| (m.id.as_str(), m.phase, m.severity))
        .collect();
    assert_eq!(
        ids,
        [
            (
                "deepep-v1-ibgda-multiple-definition",
                Phase::Build,
                Severity::Error
            ),
            (
                "deepep-nvshmem-without-ibgda",
                Phase::Build,
                Severity::Error
            ),
            ("cuda13-cccl-include-missing", Phase::Build, Severity::Error),
            (
                "deepep-nvshmem-unversioned-lib-missing",
                Phase::Build,
                Severity::Error
            ),
        ]
    );
    let unknown: Vec<_> = report.unknown.iter().map(|u| u.example.as_str()).collect();
    assert_eq!(
        unknown,
        [
            "collect2: error: ld returned 1 exit status",
            "47.98 ninja: build stopped: subcommand failed.",
            "47.99 Traceback (most recent call last):",
        ]
    );
}

#[test]
fn unknown_warnings_group_across_ranks_and_info_chatter_is_ignored() {
    let report = scan_fixture("import-and-run.log");
    let incoming = report
        .unknown
        .iter()
        .find(|u| u.example.contains("Cannot get incoming CPU"))
        .unwrap();
    assert_eq!(
        (incoming.level, incoming.count, incoming.first.line),
        (UnknownLevel::Warning, 2, 16)
    );
    assert_eq!(
        incoming.template,
        "*:#:# [#] net_fastsocket.cc:# NCCL WARN Cannot get incoming CPU."
    );
    let listed: Vec<_> = report.unknown.iter().map(|u| u.first.line).collect();
    assert_eq!(
        listed,
        [6, 15, 16],
        "Traceback, Socket recv failed, incoming CPU"
    );
    assert_eq!(report.hit("nccl-shm-segment-failed").unwrap().count, 3);
    assert_eq!(
        report.hit("torch-nccl-watchdog-timeout").unwrap().phase,
        Phase::Run
    );
}

#[test]
fn classify_bytes_tells_known_unknown_and_other_apart() {
    let kb = KnowledgeBase::builtin();
    assert!(matches!(
        kb.classify_bytes(b"x:1:2 [0] proxy.cc:1 NCCL WARN [Service thread] Accept failed Bad file descriptor\r"),
        LineClass::Known(s) if s.id == "nccl-proxy-accept-failed"
    ));
    assert_eq!(
        kb.classify_bytes(b"h:1:2 [3] foo.cc:1 NCCL WARN something new"),
        LineClass::Unknown(UnknownLevel::Warning)
    );
    assert_eq!(
        kb.classify_bytes(b"h:1:2 [3] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM"),
        LineClass::Other
    );
    assert_eq!(
        kb.classify_bytes(b"\xff\xfe\x00 NCCL WARN \xc3\x28"),
        LineClass::Unknown(UnknownLevel::Warning)
    );
    assert!(kb.classify_line("all tests passed").is_none());
}

#[test]
fn report_round_trips_through_json_and_renders_by_phase() {
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    for name in FIXTURES {
        scanner
            .scan(name, File::open(fixture(name)).unwrap())
            .unwrap();
    }
    let report = scanner.finish();
    let json = serde_json::to_string_pretty(&report).unwrap();
    let back: ScanReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
    assert!(json.contains("\"schema_version\": 1"));
    let text = render_human(&report);
    for header in [
        "BUILD —",
        "INIT —",
        "RUN —",
        "EXIT —",
        "UNKNOWN —",
        "Verdict: FATAL",
    ] {
        assert!(text.contains(header), "no {header:?} in:\n{text}");
    }
    assert!(text.find("BUILD —").unwrap() < text.find("EXIT —").unwrap());
    assert!(text.contains("first at deepep-intranode-exit.log:5"));
}

#[test]
fn scan_reader_reads_stdin_like_input() {
    let report =
        scan_reader(&b"ok\nNVSHMEM API called before NVSHMEM initialization has completed"[..])
            .unwrap();
    assert_eq!(report.sources[0].name, "-");
    assert_eq!(report.sources[0].lines, 2);
    assert_eq!(report.matches[0].first.line, 2);
}

#[test]
fn a_knowledge_base_with_mistakes_is_refused_with_the_culprit_named() {
    let one = |id: &str, regex: &str, needles: &str| {
        format!(
            "[[signature]]\nid = \"{id}\"\nphase = \"run\"\nseverity = \"error\"\nregex = '''{regex}'''\nneedles = {needles}\n\
             cause = \"c\"\nfix = \"f\"\nreference = \"r\"\nsource = \"s\"\nexamples = []\n"
        )
    };
    let dup = format!(
        "schema_version = 1\n{}{}",
        one("a", "x", "[\"x\"]"),
        one("a", "y", "[\"y\"]")
    );
    assert!(
        format!("{:#}", KnowledgeBase::from_toml(&dup).unwrap_err()).contains("`a` appears twice")
    );
    let bad = format!("schema_version = 1\n{}", one("b", "(", "[\"(\"]"));
    assert!(
        format!("{:#}", KnowledgeBase::from_toml(&bad).unwrap_err())
            .contains("signature `b`: bad regex")
    );
    let empty = format!("schema_version = 1\n{}", one("c", "x", "[]"));
    assert!(
        format!("{:#}", KnowledgeBase::from_toml(&empty).unwrap_err())
            .contains("`c` needs at least one")
    );
    let version = format!("schema_version = 2\n{}", one("d", "x", "[\"x\"]"));
    assert!(
        format!("{:#}", KnowledgeBase::from_toml(&version).unwrap_err())
            .contains("schema_version is 2")
    );
}

/// A log line carrying OSC/CSI sequences (set the window title, clear the screen) is shown
/// escaped, never echoed raw; the JSON keeps the bytes, escaped by JSON itself.
#[test]
fn escape_sequences_in_log_lines_do_not_reach_the_terminal() {
    let log = "NCCL WARN \u{1b}]0;pwned\u{7}\u{1b}[2J something odd happened\n\
               [rank0]:[W init.cpp:1] ProcessGroupNCCL: destroy_process_group() was not called \u{1b}[31mred\n";
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    scanner.scan("evil\u{1b}[2J.log", log.as_bytes()).unwrap();
    let report = scanner.finish();
    let text = render_human(&report);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.contains("\\x1b]0;pwned\\x07\\x1b[2J"), "{text}");
    assert!(text.contains("evil\\x1b[2J.log"), "{text}");
    let json = serde_json::to_string(&report).unwrap();
    assert!(!json.contains('\u{1b}'), "{json}");
}
