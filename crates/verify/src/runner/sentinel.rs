//! The test-end sentinel: `@@commstack: test-end NAME rc=N pid=P@@`, printed by the
//! wrapper when the test function returns (and by each multiprocessing child, named
//! `NAME/Process-1`), before any teardown.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sentinel {
    pub name: String,
    pub rc: i32,
    pub pid: u32,
}

/// The sentinel on a line, if the line is one (possibly after other text a C library
/// left unterminated on the same line).
pub fn parse_sentinel(line: &str) -> Option<Sentinel> {
    let start = line.find("@@commstack: test-end ")?;
    let body = line[start + "@@commstack: test-end ".len()..].strip_suffix("@@")?;
    let mut words = body.rsplitn(3, ' ');
    let pid = words.next()?.strip_prefix("pid=")?.parse().ok()?;
    let rc = words.next()?.strip_prefix("rc=")?.parse().ok()?;
    let name = words.next()?.to_string();
    Some(Sentinel { name, rc, pid })
}
