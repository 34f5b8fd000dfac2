//! Drawing helpers of the page: text escaped for HTML, a time axis's tick step, and the
//! colours of outcomes and job kinds. Imports nothing of this crate.

use std::fmt::Write as _;

/// `s` safe in HTML text and in a double-quoted attribute.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A tick step (seconds) that puts about `want` ticks on `span` seconds.
pub fn tick_step(span: f64, want: f64) -> f64 {
    const STEPS: [f64; 16] = [
        0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0,
        3600.0,
    ];
    let raw = span.max(0.1) / want.max(1.0);
    STEPS
        .iter()
        .copied()
        .find(|s| *s >= raw)
        .unwrap_or(3600.0 * (raw / 3600.0).ceil())
}

/// A tick's label: `90 s`, `2.5 s`, `4 min` (whole minutes from 2 min on).
pub fn tick_label(t: f64) -> String {
    if t >= 120.0 && (t % 60.0).abs() < 1e-9 {
        format!("{} min", (t / 60.0) as u64)
    } else if (t.fract()).abs() < 1e-9 {
        format!("{t:.0} s")
    } else {
        format!("{t:.1} s")
    }
}

/// The fill of a step's bar by its outcome.
pub fn outcome_colour(outcome: &str) -> &'static str {
    match outcome {
        "built" => "#1f5fbf",
        "substituted" => "#2ca02c",
        "failed" => "#d62728",
        "reused" => "#a0a0a0",
        _ => "#d0d0d0",
    }
}

/// The fill of the time a step waited.
pub const WAIT_COLOUR: &str = "#f0b400";

/// The fill of a compile job by its kind.
pub fn kind_colour(kind: &str) -> &'static str {
    match kind {
        "cuda" => "#ff7f0e",
        "c++" => "#9467bd",
        "compile" => "#17becf",
        "link" => "#8c564b",
        _ => "#7f7f7f",
    }
}

/// An axis along x: a line, a tick and label every `step` seconds up to `span`, at `y`,
/// `left + t * scale` pixels across; grid lines up to `grid_top`.
pub fn time_axis(out: &mut String, left: f64, scale: f64, span: f64, y: f64, grid_top: f64) {
    let step = tick_step(span, 10.0);
    let right = left + span * scale;
    let _ = write!(
        out,
        r##"<g class="axis"><line x1="{left:.1}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="#000"/>"##
    );
    let ticks = (span / step + 1e-9).floor() as u64;
    for i in 0..=ticks {
        let t = i as f64 * step;
        let x = left + t * scale;
        let _ = write!(
            out,
            r##"<line class="grid" x1="{x:.1}" y1="{grid_top:.1}" x2="{x:.1}" y2="{y:.1}" stroke="#e4e4e4"/><line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#000"/><text class="tick" x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y + 5.0,
            y + 18.0,
            tick_label(t)
        );
    }
    out.push_str("</g>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_labels_are_round() {
        assert_eq!(tick_step(1200.0, 10.0), 120.0);
        assert_eq!(tick_step(3.0, 10.0), 0.5);
        assert_eq!(tick_step(40.0, 10.0), 5.0);
        assert_eq!(tick_label(240.0), "4 min");
        assert_eq!(tick_label(90.0), "90 s");
        assert_eq!(tick_label(2.5), "2.5 s");
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
