//! The page: a header, the steps on a timeline, each step's compile jobs on a timeline of
//! their own, and the tables. Every number drawn is also in a `data-` attribute, exactly
//! as summary.json has it, so that a test (or a person) can check the page against it.

use std::fmt::Write as _;

use crate::ninja::{KINDS, NinjaLog};
use crate::summary::{Step, Summary};
use crate::svg::{WAIT_COLOUR, esc, kind_colour, outcome_colour, time_axis};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 150.0;
const PLOT: f64 = 900.0;
const ROW: f64 = 22.0;
const LANE: f64 = 14.0;

const STYLE: &str = "body{font-family:sans-serif;margin:16px 24px;color:#111}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}\
td.num,th.num{text-align:right}svg text{font-size:12px;font-family:sans-serif}\
.meta{font-size:14px}.failed{color:#d62728;font-weight:bold}pre.failed{white-space:pre-wrap}.note{font-size:13px;color:#444}";

/// The whole page.
pub fn page(s: &Summary, logs: &[(String, NinjaLog)]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>commstack build timings</title><style>{STYLE}</style></head><body>\n"
    );
    header(&mut out, s);
    out.push_str("<h2>Steps</h2>\n");
    steps_timeline(&mut out, s);
    out.push_str("<h2>Compile jobs</h2>\n");
    if logs.is_empty() {
        out.push_str("<p class=\"note\" id=\"no-ninja\">No step built here kept a ninja log (NVSHMEM's and DeepEP's builds do when they run).</p>\n");
    }
    for (step, log) in logs {
        ninja_timeline(&mut out, step, log);
    }
    out.push_str("<h2>Summary</h2>\n");
    summary_table(&mut out, s);
    verify_table(&mut out, s);
    out.push_str("</body></html>\n");
    out
}

fn header(out: &mut String, s: &Summary) {
    let made = s.steps.iter().filter(|r| r.made()).count();
    let reused = s.steps.iter().filter(|r| r.outcome == "reused").count();
    let _ = write!(
        out,
        "<h1>commstack build timings</h1>\n<p class=\"meta\" id=\"meta\" data-seconds=\"{}\" data-run-offset=\"{}\" data-ok=\"{}\">stack {}<br>lock {}<br>{}{} in <b>{:.1} s</b>: {made} step(s) made here, {reused} reused; the steps' times count from the graph's run, {:.1} s after the command started (the lock and the plan)</p>\n",
        s.seconds,
        s.run_offset,
        s.ok,
        esc(&s.stack),
        esc(&s.lock),
        s.started
            .as_deref()
            .map(|t| format!("started {}<br>", esc(t)))
            .unwrap_or_default(),
        match s.ok {
            true => "done".to_string(),
            false => "<span class=\"failed\">FAILED</span>".to_string(),
        },
        s.seconds,
        s.run_offset
    );
    if let Some(f) = &s.failed {
        let _ = write!(
            out,
            "<pre class=\"failed\" id=\"failure\">step {} failed:\n{}</pre>\n",
            esc(&f.step),
            esc(&f.error.join("\n"))
        );
    }
}

/// One swatch of a legend, at x.
fn swatch(out: &mut String, x: f64, key: &str, colour: &str, label: &str) {
    let _ = write!(
        out,
        r#"<g class="legend-item" data-key="{key}"><rect x="{x:.1}" y="4" width="14" height="14" fill="{colour}"/><text x="{:.1}" y="16">{}</text></g>"#,
        x + 19.0,
        esc(label)
    );
}

fn steps_timeline(out: &mut String, s: &Summary) {
    let span = s.span().max(1.0);
    let scale = PLOT / span;
    let top = 34.0;
    let axis_y = top + s.steps.len() as f64 * ROW + 6.0;
    let _ = write!(
        out,
        r#"<svg id="steps" width="{WIDTH}" height="{:.0}" viewBox="0 0 {WIDTH} {:.0}" role="img" aria-label="the build's steps on a timeline">"#,
        axis_y + 30.0,
        axis_y + 30.0
    );
    out.push_str(r#"<g class="legend">"#);
    for (i, (key, label)) in [
        ("built", "built here"),
        ("substituted", "pulled (binary cache)"),
        ("failed", "failed"),
        ("reused", "reused"),
        ("wait", "waited"),
    ]
    .iter()
    .enumerate()
    {
        let colour = match *key {
            "wait" => WAIT_COLOUR,
            k => outcome_colour(k),
        };
        swatch(out, LEFT + i as f64 * 170.0, key, colour, label);
    }
    out.push_str("</g>");
    time_axis(out, LEFT, scale, span, axis_y, top - 4.0);
    for (i, r) in s.steps.iter().enumerate() {
        step_row(out, s, r, top + i as f64 * ROW, scale);
    }
    out.push_str("</svg>\n");
}

fn step_row(out: &mut String, s: &Summary, r: &Step, y: f64, scale: f64) {
    let (start, end, wait) = r.times();
    let beside = s.beside(r);
    let _ = write!(
        out,
        r#"<g class="step" data-step="{}" data-outcome="{}" data-start="{start}" data-end="{end}" data-wait="{wait}" data-seconds="{}"><title>{}: {}, start {start:.1} s, waited {wait:.1} s, ran {:.1} s, ended {end:.1} s{}</title>"#,
        esc(&r.step),
        esc(&r.outcome),
        r.seconds,
        esc(&r.step),
        esc(&r.outcome),
        r.seconds,
        match beside.is_empty() {
            true => String::new(),
            false => format!(", beside {}", esc(&beside.join(", "))),
        }
    );
    let _ = write!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
        LEFT - 8.0,
        y + 13.0,
        esc(&r.step)
    );
    if wait > 0.0 {
        let _ = write!(
            out,
            r#"<rect class="wait" x="{:.2}" y="{:.1}" width="{:.2}" height="14" fill="{WAIT_COLOUR}"/>"#,
            LEFT + (start - wait) * scale,
            y + 2.0,
            wait * scale
        );
    }
    let x = LEFT + start * scale;
    let (width, label) = match r.outcome.as_str() {
        "built" | "substituted" | "failed" => (
            ((end - start) * scale).max(2.0),
            format!("{:.1} s", r.seconds),
        ),
        "reused" => (3.0, "reused".to_string()),
        other => (0.0, other.to_string()),
    };
    if width > 0.0 {
        let _ = write!(
            out,
            r#"<rect class="run" x="{x:.2}" y="{:.1}" width="{width:.2}" height="14" fill="{}"/>"#,
            y + 2.0,
            outcome_colour(&r.outcome)
        );
    }
    let _ = write!(
        out,
        r##"<text class="label" x="{:.1}" y="{:.1}" fill="#333">{}</text></g>"##,
        x + width + 5.0,
        y + 13.0,
        esc(&label)
    );
}

fn ninja_timeline(out: &mut String, step: &str, log: &NinjaLog) {
    let span = log.seconds().max(0.1);
    let scale = PLOT / span;
    let lanes = log.lanes().max(1);
    let top = 30.0;
    let axis_y = top + lanes as f64 * LANE + 6.0;
    let _ = writeln!(
        out,
        "<h3>{} — {}: {} jobs in {:.1} s on ninja's clock (0 = ninja started), up to {} at once, {:.1} s of jobs together{}</h3>",
        esc(step),
        esc(&log.name),
        log.jobs.len(),
        log.seconds(),
        log.lanes(),
        log.job_seconds(),
        match log.other_runs {
            0 => String::new(),
            n => format!(" ({n} shorter ninja run(s) in the same log left out)"),
        }
    );
    let _ = write!(
        out,
        r#"<svg class="ninja" data-step="{}" data-log="{}" data-jobs="{}" width="{WIDTH}" height="{:.0}" viewBox="0 0 {WIDTH} {:.0}" role="img" aria-label="{} compile jobs">"#,
        esc(step),
        esc(&log.name),
        log.jobs.len(),
        axis_y + 30.0,
        axis_y + 30.0,
        esc(step)
    );
    out.push_str(r#"<g class="legend">"#);
    let present: Vec<&str> = KINDS
        .iter()
        .copied()
        .filter(|k| log.jobs.iter().any(|j| j.kind == *k))
        .collect();
    for (i, k) in present.iter().enumerate() {
        swatch(out, LEFT + i as f64 * 120.0, k, kind_colour(k), k);
    }
    out.push_str("</g>");
    time_axis(out, LEFT, scale, span, axis_y, top - 4.0);
    for j in &log.jobs {
        let (a, b) = (j.start_ms as f64 / 1000.0, j.end_ms as f64 / 1000.0);
        let _ = write!(
            out,
            r##"<rect class="job" data-kind="{}" data-start-ms="{}" data-end-ms="{}" x="{:.2}" y="{:.1}" width="{:.2}" height="{:.0}" fill="{}" stroke="#fff" stroke-width="0.5"><title>{} ({:.1} s)</title></rect>"##,
            j.kind,
            j.start_ms,
            j.end_ms,
            LEFT + a * scale,
            top + j.lane as f64 * LANE,
            ((b - a) * scale).max(1.0),
            LANE - 2.0,
            kind_colour(j.kind),
            esc(&j.outputs.join(", ")),
            b - a
        );
    }
    out.push_str("</svg>\n");
    slowest(out, step, log);
}

/// The ten longest jobs of a log.
fn slowest(out: &mut String, step: &str, log: &NinjaLog) {
    let mut jobs: Vec<_> = log.jobs.iter().collect();
    jobs.sort_by_key(|j| std::cmp::Reverse(j.end_ms - j.start_ms));
    let _ = write!(
        out,
        "<table class=\"slowest\" data-step=\"{}\"><tr><th>longest jobs</th><th class=\"num\">seconds</th></tr>",
        esc(step)
    );
    for j in jobs.iter().take(10) {
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"num\">{:.1}</td></tr>",
            esc(&j.outputs.join(", ")),
            (j.end_ms - j.start_ms) as f64 / 1000.0
        );
    }
    out.push_str("</table>\n");
}

fn summary_table(out: &mut String, s: &Summary) {
    out.push_str("<table id=\"summary\"><tr><th>step</th><th>outcome</th><th class=\"num\">start (s)</th><th class=\"num\">waited (s)</th><th class=\"num\">ran (s)</th><th class=\"num\">end (s)</th><th>beside</th><th>output, or why</th></tr>\n");
    for r in &s.steps {
        let (start, end, wait) = r.times();
        let what = match (&r.output, &r.reason) {
            (Some(o), _) if r.made() || r.outcome == "reused" => o.display().to_string(),
            (_, Some(why)) => why.clone(),
            (Some(o), None) => o.display().to_string(),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr data-step=\"{}\"><td>{}</td><td>{}</td><td class=\"num\">{start:.1}</td><td class=\"num\">{wait:.1}</td><td class=\"num\">{:.1}</td><td class=\"num\">{end:.1}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.step),
            esc(&r.step),
            esc(&r.outcome),
            r.seconds,
            esc(&s.beside(r).join(", ")),
            esc(&what)
        );
    }
    let _ = writeln!(
        out,
        "<tr id=\"total\"><td>whole command</td><td>{}</td><td></td><td></td><td class=\"num\">{:.1}</td><td></td><td></td><td></td></tr></table>",
        match s.ok {
            true => "done",
            false => "FAILED",
        },
        s.seconds
    );
}

fn verify_table(out: &mut String, s: &Summary) {
    if s.verify.is_empty() {
        return;
    }
    out.push_str("<h2>Verify levels</h2>\n<table id=\"verify\"><tr><th>level</th><th>status</th><th>why</th></tr>\n");
    for v in &s.verify {
        let _ = writeln!(
            out,
            "<tr data-level=\"{}\"><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&v.level),
            esc(&v.level),
            esc(&v.status),
            esc(v.why.as_deref().unwrap_or(""))
        );
    }
    out.push_str("</table>\n");
}
