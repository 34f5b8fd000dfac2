//! Streaming scan: any size of log in bounded memory, binary junk included.
//!
//! The reader is consumed in blocks of whole lines. The prefilter runs over a whole block at
//! once, so a line that contains no needle and no warning word costs a share of one SIMD scan
//! and a newline count, nothing more. Lines longer than the read buffer are cut: their first
//! [`MAX_MATCH_LINE`] bytes are classified, the rest is skipped without being kept.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};

use memchr::{memchr, memchr_iter, memrchr};
use serde::{Deserialize, Serialize};

use crate::kb::{KnowledgeBase, LineClass, MAX_MATCH_LINE, clip};
use crate::signature::{Phase, Severity, Signature};
use crate::unknown::{self, UnknownLevel};

/// The version of the JSON report's shape.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// Bytes read per block. Memory use is this plus [`MAX_MATCH_LINE`], whatever the input.
const BLOCK: usize = 1 << 20;
/// Distinct unknown lines kept (by template); more are counted, not stored.
const MAX_UNKNOWN_GROUPS: usize = 500;
/// Characters of a line kept as an example in the report.
const EXAMPLE_MAX: usize = 400;

/// A place in the scanned input: which source and which line (1-based), and the pod and
/// container when the line carried `kubectl logs --prefix`'s `[pod/NAME/CONTAINER] `.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub source: String,
    pub line: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}

/// Pods named per signature, at most (a job's logs can hold thousands).
const MAX_PODS: usize = 64;

/// Every line of one known signature: how often, where first, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignatureHit {
    pub id: String,
    pub phase: Phase,
    pub severity: Severity,
    pub count: u64,
    pub first: Location,
    /// The first matching line, cut to 400 characters.
    pub example: String,
    pub cause: String,
    pub fix: String,
    pub reference: String,
    pub see_also: Vec<String>,
    /// Every pod (`pod/NAME/CONTAINER`) with a line of it, in order of first appearance, at
    /// most 64; empty for logs without kubectl's prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

/// Warning or error lines that share one template and match no signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownGroup {
    pub level: UnknownLevel,
    /// The line with hosts, pids and numbers replaced (`#`), which groups repeats.
    pub template: String,
    pub count: u64,
    pub first: Location,
    pub example: String,
}

/// What was read from one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceSummary {
    pub name: String,
    pub bytes: u64,
    pub lines: u64,
    /// Lines longer than 16 KiB that were matched on their first 16 KiB only.
    pub long_lines: u64,
}

/// The result of a scan: known signatures (grouped by id), unknown warnings/errors, sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanReport {
    pub schema_version: u32,
    pub sources: Vec<SourceSummary>,
    /// In order of first appearance.
    pub matches: Vec<SignatureHit>,
    /// In order of first appearance.
    pub unknown: Vec<UnknownGroup>,
    /// Unknown lines beyond the 500 distinct templates kept.
    pub unknown_not_listed: u64,
}

impl ScanReport {
    /// True when a signature of severity `error` was found: the build or run did not work.
    pub fn has_fatal(&self) -> bool {
        self.matches.iter().any(|m| m.severity.is_fatal())
    }

    pub fn hit(&self, id: &str) -> Option<&SignatureHit> {
        self.matches.iter().find(|m| m.id == id)
    }

    pub fn total_lines(&self) -> u64 {
        self.sources.iter().map(|s| s.lines).sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.sources.iter().map(|s| s.bytes).sum()
    }

    /// Matches of one phase, in order of first appearance.
    pub fn matches_in(&self, phase: Phase) -> impl Iterator<Item = &SignatureHit> {
        self.matches.iter().filter(move |m| m.phase == phase)
    }
}

/// Scan one reader with the built-in knowledge base.
pub fn scan_reader(reader: impl Read) -> io::Result<ScanReport> {
    let mut scanner = Scanner::new(KnowledgeBase::builtin());
    scanner.scan("-", reader)?;
    Ok(scanner.finish())
}

/// Accumulates a report over one or more sources (files, stdin, a process's output).
pub struct Scanner<'kb> {
    kb: &'kb KnowledgeBase,
    sources: Vec<SourceSummary>,
    matches: Vec<SignatureHit>,
    match_index: HashMap<&'kb str, usize>,
    unknown: Vec<UnknownGroup>,
    unknown_index: HashMap<String, usize>,
    unknown_not_listed: u64,
    buf: Vec<u8>,
}

impl<'kb> Scanner<'kb> {
    pub fn new(kb: &'kb KnowledgeBase) -> Scanner<'kb> {
        Scanner {
            kb,
            sources: Vec::new(),
            matches: Vec::new(),
            match_index: HashMap::new(),
            unknown: Vec::new(),
            unknown_index: HashMap::new(),
            unknown_not_listed: 0,
            buf: Vec::new(),
        }
    }

    /// Read `reader` to its end and classify every line. `name` is how the report refers to it.
    pub fn scan(&mut self, name: &str, mut reader: impl Read) -> io::Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(BLOCK + MAX_MATCH_LINE, 0);
        let mut source = SourceSummary {
            name: name.to_string(),
            bytes: 0,
            lines: 0,
            long_lines: 0,
        };
        let mut filled = 0;
        // Inside a line longer than the buffer: its head was classified, drop bytes to its end.
        let mut skipping = false;
        let result = loop {
            let n = match reader.read(&mut buf[filled..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            };
            source.bytes += n as u64;
            filled += n;
            let eof = n == 0;
            if skipping {
                match memchr(b'\n', &buf[..filled]) {
                    Some(i) => {
                        buf.copy_within(i + 1..filled, 0);
                        filled -= i + 1;
                        skipping = false;
                    }
                    None => {
                        filled = 0;
                        if eof {
                            break Ok(());
                        }
                        continue;
                    }
                }
            }
            if let Some(last_newline) = memrchr(b'\n', &buf[..filled]) {
                self.scan_block(&buf[..=last_newline], &mut source);
                buf.copy_within(last_newline + 1..filled, 0);
                filled -= last_newline + 1;
            }
            if eof {
                if filled > 0 {
                    self.scan_line(&buf[..filled], &mut source);
                }
                break Ok(());
            }
            if filled > MAX_MATCH_LINE {
                // A partial line already longer than what matching looks at: classify its head
                // now and drop the rest as it arrives, so memory stays bounded.
                self.scan_line(&buf[..MAX_MATCH_LINE], &mut source);
                filled = 0;
                skipping = true;
            }
        };
        self.buf = buf;
        self.sources.push(source);
        result
    }

    /// Classify one line from the caller (e.g. only the lines after a sentinel). `line` excludes
    /// its newline; `source` and `line_no` are what the report shows.
    pub fn feed_line(&mut self, source: &str, line_no: u64, line: &[u8]) -> LineClass<'kb> {
        let (pod, line) = unprefix(line);
        let class = self.kb.classify_bytes(line);
        self.record(class, source, line_no, pod, line);
        class
    }

    /// A block of whole lines, each ending with `\n`.
    fn scan_block(&mut self, block: &[u8], source: &mut SourceSummary) {
        let kb = self.kb;
        let mut line_no = source.lines; // lines before `counted`
        let mut counted = 0;
        let mut from = 0;
        while let Some(hit) = kb.next_candidate(block, from) {
            let start = memrchr(b'\n', &block[..hit]).map_or(0, |i| i + 1);
            let end = hit + memchr(b'\n', &block[hit..]).expect("a block ends with a newline");
            line_no += memchr_iter(b'\n', &block[counted..start]).count() as u64;
            counted = start;
            let line = &block[start..end];
            if line.len() > MAX_MATCH_LINE {
                source.long_lines += 1;
            }
            let (pod, line) = unprefix(line);
            // The prefilter may have hit only the prefix; the rest decides.
            let class = match pod {
                Some(_) => kb.classify_bytes(line),
                None => kb.classify_candidate(clip(line)),
            };
            self.record(class, &source.name, line_no + 1, pod, line);
            from = end + 1;
        }
        source.lines = line_no + memchr_iter(b'\n', &block[counted..]).count() as u64;
    }

    /// One line on its own: the last line without a newline, or the head of an overlong line.
    fn scan_line(&mut self, line: &[u8], source: &mut SourceSummary) {
        source.lines += 1;
        if line.len() >= MAX_MATCH_LINE {
            source.long_lines += 1;
        }
        let (pod, line) = unprefix(line);
        let class = self.kb.classify_bytes(line);
        self.record(class, &source.name, source.lines, pod, line);
    }

    fn record(
        &mut self,
        class: LineClass<'kb>,
        source: &str,
        line_no: u64,
        pod: Option<&[u8]>,
        line: &[u8],
    ) {
        let at = Location {
            source: source.to_string(),
            line: line_no,
            pod: pod.map(|p| String::from_utf8_lossy(p).into_owned()),
        };
        match class {
            LineClass::Known(sig) => self.record_known(sig, at, line),
            LineClass::Unknown(level) => self.record_unknown(level, at, line),
            LineClass::Other => {}
        }
    }

    fn record_known(&mut self, sig: &'kb Signature, at: Location, line: &[u8]) {
        if let Some(&i) = self.match_index.get(sig.id.as_str()) {
            let hit = &mut self.matches[i];
            hit.count += 1;
            if let Some(pod) = at.pod
                && hit.pods.len() < MAX_PODS
                && !hit.pods.contains(&pod)
            {
                hit.pods.push(pod);
            }
            return;
        }
        self.match_index.insert(&sig.id, self.matches.len());
        self.matches.push(SignatureHit {
            id: sig.id.clone(),
            phase: sig.phase,
            severity: sig.severity,
            count: 1,
            pods: at.pod.iter().cloned().collect(),
            first: at,
            example: example(line),
            cause: sig.cause.clone(),
            fix: sig.fix.clone(),
            reference: sig.reference.clone(),
            see_also: sig.see_also.clone(),
        });
    }

    fn record_unknown(&mut self, level: UnknownLevel, at: Location, line: &[u8]) {
        let template = unknown::template(clip(line));
        if let Some(&i) = self.unknown_index.get(&template) {
            self.unknown[i].count += 1;
            return;
        }
        if self.unknown.len() >= MAX_UNKNOWN_GROUPS {
            self.unknown_not_listed += 1;
            return;
        }
        self.unknown_index
            .insert(template.clone(), self.unknown.len());
        self.unknown.push(UnknownGroup {
            level,
            template,
            count: 1,
            first: at,
            example: example(line),
        });
    }

    pub fn finish(self) -> ScanReport {
        ScanReport {
            schema_version: REPORT_SCHEMA_VERSION,
            sources: self.sources,
            matches: self.matches,
            unknown: self.unknown,
            unknown_not_listed: self.unknown_not_listed,
        }
    }
}

/// The line without kubectl's `[pod/NAME/CONTAINER] `, and that pod.
fn unprefix(line: &[u8]) -> (Option<&[u8]>, &[u8]) {
    match crate::prefix::split(line) {
        Some((pod, rest)) => (Some(pod), rest),
        None => (None, line),
    }
}

fn example(line: &[u8]) -> String {
    let line = clip(line);
    let text = String::from_utf8_lossy(&line[..line.len().min(EXAMPLE_MAX * 4)]);
    let text = text.trim();
    match text.char_indices().nth(EXAMPLE_MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// Counts of matches per phase and severity, for summaries.
pub fn counts_by_phase(report: &ScanReport) -> BTreeMap<Phase, (usize, u64)> {
    let mut out = BTreeMap::new();
    for m in &report.matches {
        let entry = out.entry(m.phase).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += m.count;
    }
    out
}
