//! Warning and error lines that no signature explains: they are listed, never dropped.

use regex::bytes::RegexSet;
use serde::{Deserialize, Serialize};

/// Literals that make a line worth a second look. They feed the prefilter, so every word
/// [`level`] reacts to must be here.
pub(crate) const TRIGGERS: &[&str] = &[
    "WARN",
    "Warning",
    "warning:",
    "ERROR",
    "Error",
    "error:",
    "FATAL",
    "Fatal",
    "fatal",
    "Traceback",
    "failed",
    "Failed",
    "FAILED",
    "Segmentation fault",
    "terminate called",
    "Aborted",
    "core dumped",
    "undefined symbol",
    "undefined reference",
    "Undefined reference",
    "cannot find",
    "No such file",
    // c10/glog prefixes `[W CudaIPCTypes.cpp:15]`, `[rank0]:[E1218 ...]` (month 01..12). Three
    // bytes or more each: the SIMD prefilter then fingerprints on 3 bytes, not 2, and wades
    // through far fewer false candidates.
    "[W ",
    "[W0",
    "[W1",
    "[E ",
    "[E0",
    "[E1",
];

const ERROR_WORDS: &[&str] = &[
    "ERROR",
    "Error",
    "error:",
    "FATAL",
    "Fatal",
    "fatal",
    "Traceback",
    "failed",
    "Failed",
    "FAILED",
    "Segmentation fault",
    "terminate called",
    "Aborted",
    "core dumped",
    "undefined symbol",
    "undefined reference",
    "Undefined reference",
    "cannot find",
    "No such file",
];
const WARNING_WORDS: &[&str] = &["WARN", "Warning", "warning:"];

/// NCCL and NVSHMEM INFO/TRACE lines are chatter even when they say "Failed to find plugin".
const CHATTER: &[&str] = &[
    " NCCL INFO ",
    " NVSHMEM INFO ",
    " NCCL TRACE ",
    " NVSHMEM TRACE ",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownLevel {
    Warning,
    Error,
}

impl UnknownLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownLevel::Warning => "warning",
            UnknownLevel::Error => "error",
        }
    }
}

/// Tells warning lines from error lines by their words, in one pass over the line.
#[derive(Debug)]
pub(crate) struct LevelMatcher {
    /// Patterns: 0 = INFO/TRACE chatter, 1 = error words, 2 = warning words.
    set: RegexSet,
}

impl LevelMatcher {
    pub(crate) fn new() -> LevelMatcher {
        let words = |ws: &[&str]| {
            ws.iter()
                .map(|w| regex::escape(w))
                .collect::<Vec<_>>()
                .join("|")
        };
        // c10/glog severity prefixes: `[W CudaIPCTypes.cpp:15]`, `[rank0]:[E1218 20:27:21.42 ...]`.
        let glog = |letter: char| format!(r"^\s*(?:\[rank\d+\]:)?\[{letter}[\d ]");
        let set = RegexSet::new([
            words(CHATTER),
            format!("{}|{}", words(ERROR_WORDS), glog('E')),
            format!("{}|{}", words(WARNING_WORDS), glog('W')),
        ])
        .expect("the unknown-line patterns are valid regexes");
        LevelMatcher { set }
    }

    /// Whether a line reads as a warning or an error, judged by its words.
    pub(crate) fn level(&self, line: &[u8]) -> Option<UnknownLevel> {
        let found = self.set.matches(line);
        if found.matched(0) {
            None
        } else if found.matched(1) {
            Some(UnknownLevel::Error)
        } else if found.matched(2) {
            Some(UnknownLevel::Warning)
        } else {
            None
        }
    }
}

/// A line with its volatile parts (hostnames, pids, numbers, addresses) replaced, so repeats of
/// one message from many ranks group together.
pub(crate) fn template(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut out = String::with_capacity(text.len().min(TEMPLATE_MAX));
    let mut chars = text.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if out.len() >= TEMPLATE_MAX {
            out.push('…');
            break;
        }
        if c == '0' && chars.peek() == Some(&'x') {
            chars.next();
            while chars.peek().is_some_and(|c| c.is_ascii_hexdigit()) {
                chars.next();
            }
            out.push_str("0x#");
        } else if c.is_ascii_digit() {
            while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                chars.next();
            }
            out.push('#');
        } else {
            out.push(c);
        }
    }
    drop_host_token(&out)
}

const TEMPLATE_MAX: usize = 240;

/// NCCL and NVSHMEM start lines with `host:pid:tid [dev] `; the host differs per node.
fn drop_host_token(template: &str) -> String {
    let mut offset = 0;
    // A `[timestamp] ` in front (NCCL_DEBUG_TIMESTAMP_FORMAT, CI runners) stays.
    if template.starts_with('[')
        && let Some(end) = template.find("] ")
    {
        offset = end + 2;
    }
    let rest = &template[offset..];
    if let Some((token, tail)) = rest.split_once(' ')
        && token.ends_with(":#:#")
        && tail.starts_with('[')
    {
        return format!("{}*:#:# {}", &template[..offset], tail);
    }
    template.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triggers_are_at_least_three_bytes() {
        assert!(TRIGGERS.iter().all(|t| t.len() >= 3));
    }

    #[test]
    fn every_word_level_reacts_to_is_a_trigger() {
        for w in ERROR_WORDS.iter().chain(WARNING_WORDS) {
            assert!(
                TRIGGERS.contains(w),
                "{w} is not in TRIGGERS: the prefilter would skip it"
            );
        }
    }

    fn level(line: &[u8]) -> Option<UnknownLevel> {
        LevelMatcher::new().level(line)
    }

    #[test]
    fn levels() {
        assert_eq!(
            level(b"a:1:2 [0] net.cc:765 NCCL WARN Cannot get incoming CPU."),
            Some(UnknownLevel::Warning)
        );
        assert_eq!(
            level(b"Traceback (most recent call last):"),
            Some(UnknownLevel::Error)
        );
        assert_eq!(
            level(b"[rank0]:[E1218 20:27:21.426 X.cpp:629] boom"),
            Some(UnknownLevel::Error)
        );
        assert_eq!(
            level(b"[W CudaIPCTypes.cpp:15] something"),
            Some(UnknownLevel::Warning)
        );
        assert_eq!(
            level(b"h:1:1 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v5 symbol."),
            None,
            "INFO chatter is not a warning"
        );
        assert_eq!(level(b"[Examples] done"), None);
        assert_eq!(
            level(b"  [rank3]:[W625 01:10:05.14 X.cpp:1] y"),
            Some(UnknownLevel::Warning)
        );
        assert_eq!(level(b"[testing] Running with BF16 ... passed"), None);
    }

    #[test]
    fn templates_group_ranks_and_numbers() {
        let a = template(
            b"node-a:2374:2994 [0] proxy.cc:1458 NCCL WARN socket 0x7f00aa timed out after 30 s",
        );
        let b =
            template(b"node-b:99:100 [7] proxy.cc:1458 NCCL WARN socket 0x55 timed out after 31 s");
        assert_eq!(a, b);
        assert_eq!(
            a,
            "*:#:# [#] proxy.cc:# NCCL WARN socket 0x# timed out after # s"
        );
        let t = template(b"[2026-04-22 21:34:20] host-1:20:21 [0] x.cc:1 NCCL WARN hi");
        assert_eq!(t, "[#-#-# #:#:#] *:#:# [#] x.cc:# NCCL WARN hi");
    }
}
