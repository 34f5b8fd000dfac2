//! The SVG: bandwidth against size above, the ratio to copy below; x is log2 of the
//! message size, labelled in KiB/MiB/GiB. Colour says put, get or copy (a shade per run);
//! the marker says which run.

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::curves::Run;

/// A shade per run (the first run's is the first), for put, get and copy.
pub const PUT_COLOURS: [&str; 3] = ["#1f77b4", "#6baed6", "#08306b"];
pub const GET_COLOURS: [&str; 3] = ["#ff7f0e", "#fdae6b", "#a63603"];
pub const COPY_COLOURS: [&str; 3] = ["#2ca02c", "#74c476", "#00441b"];

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 900;

fn colour(hex: &str) -> RGBColor {
    let c = |i: usize| u8::from_str_radix(&hex[i..i + 2], 16).unwrap_or(0);
    RGBColor(c(1), c(3), c(5))
}

/// `4 KiB`, `256 MiB` for whole powers of two (log2 values); nothing between them.
fn size_label(log2: f64) -> String {
    if (log2 - log2.round()).abs() > 1e-6 || log2 < 0.0 {
        return String::new();
    }
    let bytes = 1u128 << (log2.round() as u32);
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// The x range: 4 KiB..256 MiB, widened to every size measured.
fn x_range(runs: &[Run]) -> (f64, f64) {
    runs.iter()
        .flat_map(|r| r.curves.sizes())
        .map(|b| (b.max(1) as f64).log2())
        .fold((12.0, 28.0), |(lo, hi), x| {
            (lo.min(x.floor()), hi.max(x.ceil()))
        })
}

pub fn svg(runs: &[Run]) -> Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        let (top, bottom) = root.split_vertically(560);
        bandwidth(&top, runs).map_err(|e| anyhow!("drawing the bandwidth chart: {e}"))?;
        ratio(&bottom, runs).map_err(|e| anyhow!("drawing the ratio chart: {e}"))?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    Ok(out)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = std::result::Result<(), Box<dyn std::error::Error + 'static>>;

/// One line with markers, in the legend as `name`.
fn line<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    points: &[(u64, f64)],
    hex: &str,
    run: usize,
    name: String,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    if points.is_empty() {
        return Ok(());
    }
    let c = colour(hex);
    let xy: Vec<(f64, f64)> = points
        .iter()
        .map(|(b, g)| ((*b as f64).log2(), *g))
        .collect();
    let style = c.stroke_width(2);
    chart
        .draw_series(LineSeries::new(xy.clone(), style))?
        .label(name)
        .legend(move |(x, y)| {
            EmptyElement::at((x, y))
                + PathElement::new(vec![(0, 0), (24, 0)], c.stroke_width(2))
                + marker(run, (12, 0), c)
        });
    chart.draw_series(
        xy.into_iter()
            .map(|p| EmptyElement::at(p) + marker(run, (0, 0), c)),
    )?;
    Ok(())
}

/// The marker of run `run`: a circle, a triangle, a square, a cross.
fn marker<DB: DrawingBackend>(
    run: usize,
    at: (i32, i32),
    c: RGBColor,
) -> DynElement<'static, DB, (i32, i32)> {
    let (x, y) = at;
    match run % 4 {
        0 => Circle::new(at, 4, c.filled()).into_dyn(),
        1 => TriangleMarker::new(at, 6, c.filled()).into_dyn(),
        2 => Rectangle::new([(x - 4, y - 4), (x + 4, y + 4)], c.filled()).into_dyn(),
        _ => Cross::new(at, 5, c.stroke_width(2)).into_dyn(),
    }
}

fn legend_name(kind: &str, run: &Run, several: bool) -> String {
    match several {
        true => format!("{kind}: {} ({})", run.label, run.what),
        false => format!("{kind} ({})", run.what),
    }
}

type Chart<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One panel of the picture: its caption, the runs' log2 size axis, y from 0 to `top`,
/// the mesh drawn.
fn panel<'a, 'b>(
    area: &'a Area<'b>,
    runs: &[Run],
    caption: (&str, u32),
    top: f64,
    y_label: &dyn Fn(&f64) -> String,
    y_desc: &str,
) -> std::result::Result<Chart<'a, 'b>, Box<dyn std::error::Error + 'static>> {
    let (lo, hi) = x_range(runs);
    let mut chart = ChartBuilder::on(area)
        .caption(caption.0, ("sans-serif", caption.1))
        .margin(14)
        .margin_right(44)
        .x_label_area_size(46)
        .y_label_area_size(72)
        .build_cartesian_2d(lo..hi, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels((hi - lo) as usize + 1)
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(y_label)
        .light_line_style(RGBColor(238, 238, 238))
        .x_desc("message size (log2 scale)")
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 15))
        .draw()?;
    Ok(chart)
}

/// The panel's legend, at `position`.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>, position: SeriesLabelPosition) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn bandwidth(area: &Area, runs: &[Run]) -> DrawResult {
    let top = runs.iter().map(|r| r.curves.max_gbps()).fold(1.0, f64::max) * 1.1;
    let mut chart = panel(
        area,
        runs,
        ("NVSHMEM self-test: bandwidth against message size", 22),
        top,
        &|v| format!("{v:.0}"),
        "GB/s (median)",
    )?;
    let several = runs.len() > 1;
    for (i, run) in runs.iter().enumerate() {
        let c = &run.curves;
        line(
            &mut chart,
            &c.put,
            PUT_COLOURS[i % 3],
            i,
            legend_name("put", run, several),
        )?;
        line(
            &mut chart,
            &c.get,
            GET_COLOURS[i % 3],
            i,
            legend_name("get", run, several),
        )?;
        line(
            &mut chart,
            &c.copy,
            COPY_COLOURS[i % 3],
            i,
            legend_name("copy", run, several),
        )?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

fn ratio(area: &Area, runs: &[Run]) -> DrawResult {
    let ratios: Vec<_> = runs.iter().map(|r| r.curves.ratios()).collect();
    let top = ratios
        .iter()
        .flat_map(|(p, g)| p.iter().chain(g))
        .map(|(_, r)| *r)
        .fold(110.0, f64::max);
    let mut chart = panel(
        area,
        runs,
        (
            "put and get as a percentage of copy (cuMemcpyDtoDAsync)",
            18,
        ),
        top,
        &|v| format!("{v:.0}%"),
        "% of copy",
    )?;
    let several = runs.len() > 1;
    for (i, (run, (put, get))) in runs.iter().zip(&ratios).enumerate() {
        line(
            &mut chart,
            put,
            PUT_COLOURS[i % 3],
            i,
            legend_name("put/copy", run, several),
        )?;
        line(
            &mut chart,
            get,
            GET_COLOURS[i % 3],
            i,
            legend_name("get/copy", run, several),
        )?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_labelled_in_binary_units_at_powers_of_two_only() {
        assert_eq!(size_label(12.0), "4 KiB");
        assert_eq!(size_label(28.0), "256 MiB");
        assert_eq!(size_label(30.0), "1 GiB");
        assert_eq!(size_label(9.0), "512 B");
        assert_eq!(size_label(12.5), "");
    }
}
