//! A huge log is read in bounded memory. Alone in its test binary so the peak resident size
//! (VmHWM) it measures belongs to this scan only.

use std::io::{self, Read};

use commstack_logscan::{KnowledgeBase, Scanner};

/// Produces `remaining` bytes of one endless line of `x`, then a known line; nothing is stored.
struct EndlessLine {
    remaining: u64,
    tail: &'static [u8],
}

impl Read for EndlessLine {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining > 0 {
            let n = (buf.len() as u64).min(self.remaining) as usize;
            buf[..n].fill(b'x');
            self.remaining -= n as u64;
            return Ok(n);
        }
        let n = buf.len().min(self.tail.len());
        buf[..n].copy_from_slice(&self.tail[..n]);
        self.tail = &self.tail[n..];
        Ok(n)
    }
}

const TAIL: &[u8] = b"\nNVSHMEM API called before NVSHMEM initialization has completed\n";

fn peak_resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_512_mib_line_is_not_buffered_whole() {
    let kb = KnowledgeBase::builtin();
    let before = peak_resident_kib();
    let mut scanner = Scanner::new(kb);
    scanner
        .scan(
            "endless",
            EndlessLine {
                remaining: 512 << 20,
                tail: TAIL,
            },
        )
        .unwrap();
    let report = scanner.finish();
    let grown_mib = (peak_resident_kib() - before) / 1024;
    assert_eq!(report.sources[0].lines, 2);
    assert_eq!(report.sources[0].bytes, (512 << 20) + TAIL.len() as u64);
    assert_eq!(report.hit("nvshmem-api-before-init").unwrap().first.line, 2);
    assert!(
        grown_mib < 32,
        "peak resident memory grew by {grown_mib} MiB while scanning a 512 MiB line"
    );
}
