//! The human summary of a scan: grouped by phase, counts and first line numbers, cause and fix.

use std::fmt::Write;

use commstack_digest::terminal_safe;

use crate::scan::ScanReport;
use crate::signature::Phase;

const WIDTH: usize = 100;

/// ` (pod/NAME/CONTAINER; N pods)` for a hit in collected pod logs, else nothing.
fn pods(hit: &crate::scan::SignatureHit) -> String {
    match &hit.first.pod {
        Some(pod) => format!(
            " ({}; {} pod{})",
            terminal_safe(pod),
            hit.pods.len(),
            plural(hit.pods.len() as u64)
        ),
        None => String::new(),
    }
}

/// Render a report for a terminal. Plain text, no colour.
pub fn render_human(report: &ScanReport) -> String {
    let mut out = String::new();
    let unknown_lines: u64 =
        report.unknown.iter().map(|u| u.count).sum::<u64>() + report.unknown_not_listed;
    let _ = writeln!(
        out,
        "Scanned {} source{}, {} lines ({}): {} known signature{}, {} unknown warning/error line{}.",
        report.sources.len(),
        plural(report.sources.len() as u64),
        report.total_lines(),
        human_bytes(report.total_bytes()),
        report.matches.len(),
        plural(report.matches.len() as u64),
        unknown_lines,
        plural(unknown_lines),
    );
    for phase in Phase::ALL {
        let hits: Vec<_> = report.matches_in(phase).collect();
        if hits.is_empty() {
            continue;
        }
        let lines: u64 = hits.iter().map(|h| h.count).sum();
        let _ = writeln!(
            out,
            "\n{} — {} signature{}, {} line{}",
            phase.as_str().to_uppercase(),
            hits.len(),
            plural(hits.len() as u64),
            lines,
            plural(lines)
        );
        for hit in hits {
            let _ = writeln!(
                out,
                "  {:<8} {}  ×{}  first at {}:{}{}",
                hit.severity.as_str(),
                hit.id,
                hit.count,
                terminal_safe(&hit.first.source),
                hit.first.line,
                pods(hit)
            );
            // Log lines are untrusted: their escape sequences must not reach the terminal.
            let _ = writeln!(out, "      | {}", terminal_safe(&hit.example));
            wrap_into(&mut out, "      cause: ", &hit.cause);
            wrap_into(&mut out, "      fix:   ", &hit.fix);
            let _ = writeln!(out, "      ref:   {}", hit.reference);
        }
    }
    if !report.unknown.is_empty() || report.unknown_not_listed > 0 {
        let _ = writeln!(
            out,
            "\nUNKNOWN — {} distinct, {} line{} that no signature explains",
            report.unknown.len(),
            unknown_lines,
            plural(unknown_lines)
        );
        for group in &report.unknown {
            let _ = writeln!(
                out,
                "  {:<8} ×{}  first at {}:{}",
                group.level.as_str(),
                group.count,
                terminal_safe(&group.first.source),
                group.first.line
            );
            let _ = writeln!(out, "      | {}", terminal_safe(&group.example));
        }
        if report.unknown_not_listed > 0 {
            let _ = writeln!(
                out,
                "  … and {} more lines of other unknown messages (not listed)",
                report.unknown_not_listed
            );
        }
    }
    let fatal: Vec<&str> = report
        .matches
        .iter()
        .filter(|m| m.severity.is_fatal())
        .map(|m| m.id.as_str())
        .collect();
    if fatal.is_empty() {
        let _ = writeln!(out, "\nVerdict: no fatal signature.");
    } else {
        let _ = writeln!(
            out,
            "\nVerdict: FATAL — {} error-severity signature{}: {}.",
            fatal.len(),
            plural(fatal.len() as u64),
            fatal.join(", ")
        );
    }
    out
}

fn wrap_into(out: &mut String, label: &str, text: &str) {
    let indent = " ".repeat(label.chars().count());
    let mut line = String::from(label);
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out.push_str(&line);
            out.push('\n');
            line = indent.clone();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(&line);
    out.push('\n');
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Binary units ("1.50 GiB"), as every commstack command prints sizes.
fn human_bytes(n: u64) -> String {
    indicatif::HumanBytes(n).to_string()
}
