//! The plot as a person sees it: written from the self-test reports in `fixtures/` (the
//! self-test's JSON format, commstack-selftest/1, with synthetic curves that end at the
//! 256 MiB medians docs/benchmarks.md records for the H200), opened in a real headless
//! browser (chromium), its DOM and its screenshot's pixels checked for the axes, the
//! lines and the legend.

use std::path::{Path, PathBuf};

use commstack_plot::{COPY_COLOURS, GET_COLOURS, PUT_COLOURS};
use commstack_testkit::browser::{rgb, show};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The texts of the SVG's `<text>` elements, in order.
fn texts(dom: &str) -> Vec<String> {
    let re = regex::Regex::new(r"(?s)<text[^>]*>(.*?)</text>").unwrap();
    re.captures_iter(dom)
        .map(|c| c[1].trim().replace("&amp;", "&"))
        .collect()
}

#[test]
fn one_run_shows_axes_lines_and_legend() {
    let d = tempfile::tempdir().unwrap();
    let svg = d.path().join("selftest.svg");
    let runs = commstack_plot::write(&[fixture("selftest-ours.json")], &svg).unwrap();
    assert_eq!(runs[0].curves.put.len(), 17);
    let shown = show(&svg, 1000, 900, &d.path().join("browser"));
    let texts = texts(&shown.dom);
    // The x axis: every power of two from 4 KiB to 256 MiB, on both charts.
    for label in ["4 KiB", "8 KiB", "64 KiB", "1 MiB", "16 MiB", "256 MiB"] {
        assert_eq!(
            texts.iter().filter(|t| *t == label).count(),
            2,
            "{label} in {texts:?}"
        );
    }
    for want in [
        "message size (log2 scale)",
        "GB/s (median)",
        "% of copy",
        "100%",
        "put (NVIDIA H200, NVSHMEM 3.4.5)",
        "get (NVIDIA H200, NVSHMEM 3.4.5)",
        "copy (NVIDIA H200, NVSHMEM 3.4.5)",
        "put/copy (NVIDIA H200, NVSHMEM 3.4.5)",
        "get/copy (NVIDIA H200, NVSHMEM 3.4.5)",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    // What was drawn: each line's colour, over many pixels (a line across the chart and
    // its markers), the axes' black.
    for (what, hex, min) in [
        ("put", PUT_COLOURS[0], 1500),
        ("get", GET_COLOURS[0], 1500),
        ("copy", COPY_COLOURS[0], 800),
        ("axes", "#000000", 1500),
    ] {
        let n = shown.count(rgb(hex), 24);
        assert!(
            n >= min,
            "{what} ({hex}): {n} pixels, expected {min} or more; see {}",
            shown.png.display()
        );
    }
    // Two charts: the put colour is in the top half (bandwidth) and the bottom (ratio).
    let rows = shown.rows_with(rgb(PUT_COLOURS[0]), 24, 1);
    assert!(
        rows.iter().any(|y| *y < 540) && rows.iter().any(|y| *y > 580),
        "{rows:?}"
    );
    // A second run's shade is not in a plot of one run.
    assert_eq!(shown.count(rgb(PUT_COLOURS[1]), 4), 0);
}

#[test]
fn several_runs_get_a_line_each_named_by_file() {
    let d = tempfile::tempdir().unwrap();
    let svg = d.path().join("two.svg");
    commstack_plot::write(
        &[
            fixture("selftest-nvidia.json"),
            fixture("selftest-ours.json"),
        ],
        &svg,
    )
    .unwrap();
    let shown = show(&svg, 1000, 900, &d.path().join("browser"));
    let texts = texts(&shown.dom);
    for want in [
        "put: selftest-nvidia (NVIDIA H200, NVSHMEM 3.4.5)",
        "put: selftest-ours (NVIDIA H200, NVSHMEM 3.4.5)",
        "copy: selftest-ours (NVIDIA H200, NVSHMEM 3.4.5)",
        "get/copy: selftest-nvidia (NVIDIA H200, NVSHMEM 3.4.5)",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    for hex in [
        PUT_COLOURS[0],
        PUT_COLOURS[1],
        GET_COLOURS[1],
        COPY_COLOURS[1],
    ] {
        // The runs' lines nearly coincide: the later one covers much of the earlier.
        let n = shown.count(rgb(hex), 12);
        assert!(n >= 100, "{hex}: {n} pixels; see {}", shown.png.display());
    }
}

#[test]
fn a_file_that_is_not_a_report_is_named_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    let bad = d.path().join("summary.json");
    std::fs::write(&bad, r#"{"stack":"x"}"#).unwrap();
    let svg = d.path().join("out.svg");
    let err =
        commstack_plot::write(&[fixture("selftest-ours.json"), bad.clone()], &svg).unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains(&bad.display().to_string()) && text.contains("not a self-test report"),
        "{text}"
    );
    assert!(!svg.exists());
}
