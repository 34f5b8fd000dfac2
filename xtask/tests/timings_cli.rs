//! `build --timings`, `timings` and `plot selftest` from the command line: the page is
//! written beside summary.json and its path printed, with the run's steps and their
//! numbers; `timings --copy-to` copies it; the plot is written where `-o` says.

use std::path::Path;
use std::process::Output;

mod common;
use common::text;

fn xtask(home: &Path, args: &[&str]) -> Output {
    common::xtask_in(&common::repo_root(), home, args)
}

#[test]
fn build_timings_writes_the_page_beside_the_summary_and_prints_its_path() {
    let home = tempfile::tempdir().unwrap();
    // The lock only: offline, in a fraction of a second, yet a real run of the graph.
    let out = xtask(
        home.path(),
        &["build", "--until", "lock", "--offline", "--timings"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let page = stderr
        .lines()
        .find_map(|l| l.strip_prefix("timings: "))
        .unwrap_or_else(|| panic!("no timings line in {stderr}"));
    let page = Path::new(page);
    let summary = page.with_file_name("summary.json");
    assert!(page.starts_with(home.path().join("pipeline")) && summary.is_file());
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let lock = &s["steps"][0];
    assert_eq!(lock["step"], "lock");
    assert!(s["started"].is_string() && s["run_offset"].is_f64());
    let html = std::fs::read_to_string(page).unwrap();
    let start = lock["start"].as_f64().unwrap();
    assert!(
        html.contains(&format!(
            r#"data-step="lock" data-outcome="{}" data-start="{start}""#,
            lock["outcome"].as_str().unwrap()
        )),
        "{html}"
    );

    // The same page again, copied with its summary.
    let copy = home.path().join("copy");
    let out = xtask(
        home.path(),
        &[
            "timings",
            summary.to_str().unwrap(),
            "--copy-to",
            copy.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(copy.join("timings.html")).unwrap(),
        html
    );

    // Without --timings no page is written.
    std::fs::remove_file(page).unwrap();
    let out = xtask(home.path(), &["build", "--until", "lock", "--offline"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!page.exists() && !text(&out).contains("timings: "));
}

#[test]
fn plot_selftest_writes_the_svg_named_by_out() {
    let home = tempfile::tempdir().unwrap();
    let svg = home.path().join("plots/selftest.svg");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/plot/tests/fixtures/selftest-ours.json"
    );
    let out = xtask(
        home.path(),
        &["plot", "selftest", fixture, "-o", svg.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out));
    let text_out = text(&out);
    assert!(
        text_out.contains("selftest-ours: NVIDIA H200, NVSHMEM 3.4.5"),
        "{text_out}"
    );
    let body = std::fs::read_to_string(&svg).unwrap();
    assert!(
        body.starts_with("<svg") && body.contains("256 MiB"),
        "{}",
        &body[..200.min(body.len())]
    );
    // A report that is not one: refused, naming it.
    let out = xtask(
        home.path(),
        &[
            "plot",
            "selftest",
            "stack.toml",
            "-o",
            svg.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("stack.toml"), "{}", text(&out));
}
