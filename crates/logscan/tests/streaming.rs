//! The streaming reader: read sizes, long lines, binary junk, invalid UTF-8.

use std::io::{self, Read};

use commstack_logscan::{KnowledgeBase, MAX_MATCH_LINE, ScanReport, Scanner};

const ACCEPT: &[u8] =
    b"0bc8f5b83646:2374:2994 [0] proxy.cc:1458 NCCL WARN [Service thread] Accept failed Resource temporarily unavailable";
const API_BEFORE_INIT: &[u8] = b"NVSHMEM API called before NVSHMEM initialization has completed";

fn scan(reader: impl Read) -> ScanReport {
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    scanner.scan("input", reader).unwrap();
    scanner.finish()
}

/// Hands out its bytes a few at a time, as a pipe may.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.step = self.step % 7 + 1;
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn fixture_bytes() -> Vec<u8> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut all = Vec::new();
    for name in [
        "deepep-intranode-exit.log",
        "nvshmem-init.log",
        "build.log",
        "import-and-run.log",
    ] {
        all.extend(std::fs::read(dir.join(name)).unwrap());
    }
    all
}

#[test]
fn reading_a_few_bytes_at_a_time_gives_the_same_report() {
    let data = fixture_bytes();
    let whole = scan(&data[..]);
    let trickled = scan(Trickle {
        data: &data,
        step: 0,
    });
    assert_eq!(whole, trickled);
    assert!(whole.matches.len() >= 20);
}

#[test]
fn line_numbers_stay_right_across_block_boundaries() {
    // Enough filler that the signature lines straddle the 1 MiB read blocks.
    let filler = b"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n";
    let mut data = Vec::new();
    let mut expected = Vec::new();
    let mut lines = 0u64;
    while data.len() < 5 << 20 {
        for _ in 0..7919 {
            data.extend_from_slice(filler);
            lines += 1;
        }
        data.extend_from_slice(ACCEPT);
        data.push(b'\n');
        lines += 1;
        expected.push(lines);
    }
    let report = scan(&data[..]);
    let hit = report.hit("nccl-proxy-accept-failed").unwrap();
    assert_eq!(hit.count, expected.len() as u64);
    assert_eq!(hit.first.line, expected[0]);
    assert_eq!(report.sources[0].lines, lines);
    assert_eq!(report.sources[0].bytes, data.len() as u64);
}

#[test]
fn long_lines_are_matched_on_their_head_only() {
    let mut data = Vec::new();
    // Line 1: a signature at the start of a 3 MiB line: found.
    data.extend_from_slice(ACCEPT);
    data.extend(std::iter::repeat_n(b'x', 3 << 20));
    data.push(b'\n');
    // Line 2: the same text after 20 KiB of junk on its line: beyond the match window.
    data.extend(std::iter::repeat_n(b'y', MAX_MATCH_LINE + 4096));
    data.extend_from_slice(API_BEFORE_INIT);
    data.push(b'\n');
    // Line 3: an ordinary line after them, with its right number.
    data.extend_from_slice(API_BEFORE_INIT);
    let report = scan(&data[..]);
    assert_eq!(
        report.hit("nccl-proxy-accept-failed").unwrap().first.line,
        1
    );
    let api = report.hit("nvshmem-api-before-init").unwrap();
    assert_eq!((api.count, api.first.line), (1, 3));
    assert_eq!(report.sources[0].lines, 3);
    assert_eq!(report.sources[0].long_lines, 2);
    assert!(report.matches[0].example.chars().count() <= 401);
}

#[test]
fn random_bytes_and_invalid_utf8_do_not_crash_it() {
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut data = Vec::with_capacity(8 << 20);
    while data.len() < 8 << 20 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    // A known line in the middle of the junk, and one at the very end without a newline.
    let middle = data.len() / 2;
    let mut line = b"\n".to_vec();
    line.extend_from_slice(API_BEFORE_INIT);
    line.push(b'\n');
    data.splice(middle..middle, line);
    data.extend_from_slice(b"\n\xff\xfe");
    data.extend_from_slice(API_BEFORE_INIT);
    let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;

    let report = scan(&data[..]);
    assert_eq!(report.hit("nvshmem-api-before-init").unwrap().count, 2);
    assert_eq!(report.sources[0].lines, newlines + 1);
    let again = scan(Trickle {
        data: &data,
        step: 3,
    });
    assert_eq!(again, report);
    serde_json::to_string(&report).unwrap();
}
