//! Findings as text (one block each: place, rule, message, fix) or JSON.

use serde::Serialize;

use crate::lint::Finding;

/// The version of the JSON report's shape.
pub const SCHEMA: &str = "commstack-envlint/1";

#[derive(Serialize)]
pub struct Report<'a> {
    pub schema: &'static str,
    /// Where NVSHMEM's variables were read from.
    pub nvshmem_source: &'a str,
    pub files: &'a [String],
    pub settings: usize,
    pub findings: &'a [Finding],
}

/// Text, every untrusted part (names, values, file names) through `terminal_safe`.
pub fn human(findings: &[Finding], settings: usize, files: usize) -> String {
    let safe = |s: &str| commstack_digest::terminal_safe(s).into_owned();
    let mut out = String::new();
    for f in findings {
        out.push_str(&format!(
            "{}: {}: {}\n  fix: {}\n",
            safe(&f.place.to_string()),
            f.rule.as_str(),
            safe(&f.message),
            safe(&f.fix)
        ));
    }
    out.push_str(&format!(
        "{} finding(s) in {settings} setting(s) of {files} file(s)\n",
        findings.len()
    ));
    out
}
