//! The timings page as a person sees it: rendered from a summary.json and ninja logs
//! written here in the formats `cargo xtask build` and ninja write, opened in a real
//! headless browser (chromium), its DOM and its screenshot's pixels checked for the steps,
//! the axes, the legend and the compile jobs, and every number against the summary.

use std::path::Path;

use commstack_testkit::browser::{rgb, show};
use regex::Regex;
use serde_json::json;

/// A ninja log of one run: `jobs` compile jobs on two lanes (a .cu, then a .cpp, ...)
/// and a link at the end; returns the text and the job count.
fn ninja_log(jobs: u64) -> (String, usize) {
    let mut lines = vec!["# ninja log v5".to_string()];
    let mut ends = Vec::new();
    for i in 0..jobs {
        let lane = i % 2;
        let start = (i / 2) * 3000 + lane * 500;
        let (name, long) = match i % 3 {
            0 => (format!("src/CMakeFiles/nvshmem.dir/k{i}.cu.o"), 2900),
            1 => (format!("src/CMakeFiles/nvshmem.dir/h{i}.cpp.o"), 1800),
            _ => (format!("src/CMakeFiles/nvshmem.dir/c{i}.o"), 1200),
        };
        ends.push((start + long, start, name));
    }
    let last = ends.iter().map(|e| e.0).max().unwrap();
    ends.push((last + 4000, last, "src/lib/libnvshmem_host.so.3.4.5".into()));
    ends.sort();
    for (end, start, name) in &ends {
        lines.push(format!("{start}\t{end}\t0\t{name}\t{:x}", end * 7 + start));
    }
    (lines.join("\n") + "\n", ends.len())
}

/// A summary as `cargo xtask build --timings` writes it: a cold build where base waited
/// for deepep, verify and load ran beside each other, nvshmem and deepep kept ninja logs.
fn write_fixture(dir: &Path) -> (serde_json::Value, usize, usize) {
    let (nv, nv_jobs) = ninja_log(40);
    let (dp, dp_jobs) = ninja_log(9);
    let logs = dir.join("store/steps/nvshmem-1/logs/ninja");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("build.ninja_log"), &nv).unwrap();
    let dlogs = dir.join("store/steps/deepep-1/logs/ninja");
    std::fs::create_dir_all(&dlogs).unwrap();
    std::fs::write(
        dlogs.join("build_temp.linux-x86_64-cpython-311.ninja_log"),
        &dp,
    )
    .unwrap();
    let step = |name: &str, outcome: &str, start: f64, end: f64, wait: f64| {
        json!({"step": name, "outcome": outcome, "seconds": end - start, "start": start,
               "end": end, "wait": wait, "output": format!("/h/store/steps/{name}-1"),
               "key": null, "reason": "not built yet", "facts": {}})
    };
    let mut steps = vec![
        step("lock", "reused", 0.0, 0.0, 0.0),
        step("fetch", "built", 0.0, 26.4, 0.0),
        step("toolchain", "built", 26.4, 35.4, 0.0),
        step("nvshmem-source", "built", 35.4, 35.7, 9.0),
        step("nvshmem", "built", 35.7, 260.2, 0.0),
        step("dropin", "built", 260.2, 262.0, 0.0),
        step("kernels", "built", 262.0, 300.5, 0.0),
        step("deepep", "built", 300.5, 800.0, 0.0),
        step("wheelhouse", "built", 800.0, 830.0, 0.0),
        step("base", "built", 830.0, 900.0, 803.6),
        step("image", "built", 900.0, 960.0, 0.0),
        step("verify", "built", 960.0, 990.0, 0.0),
        step("load", "built", 960.0, 1010.0, 0.0),
        step("runtime", "built", 1010.0, 1020.5, 0.0),
    ];
    steps[4]["facts"] = json!({"version": "3.4.5", "ninja_logs": [logs.join("build.ninja_log")]});
    steps[7]["facts"] =
        json!({"ninja_logs": [dlogs.join("build_temp.linux-x86_64-cpython-311.ninja_log")]});
    steps[11]["beside"] = json!("load");
    steps[12]["beside"] = json!("verify");
    let summary = json!({
        "stack": "/src/stack.toml", "lock": "/src/stack.lock", "ok": true,
        "seconds": 1021.25, "started": "2026-12-04T20:00:00Z", "run_offset": 0.5,
        "steps": steps, "unsigned": [],
        "verify": [{"level": "static", "status": "passed"},
                   {"level": "runtime", "status": "not run", "why": "needs NVIDIA GPUs"}],
    });
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap(),
    )
    .unwrap();
    (summary, nv_jobs, dp_jobs)
}

/// `name="value"` of the element that `tag_re` matches first.
fn attr(element: &str, name: &str) -> String {
    let re = Regex::new(&format!(r#"\b{name}="([^"]*)""#)).unwrap();
    re.captures(element)
        .unwrap_or_else(|| panic!("no {name} in {element}"))[1]
        .to_string()
}

#[test]
fn the_page_shows_every_step_the_axis_the_legend_and_the_compile_jobs() {
    let d = tempfile::tempdir().unwrap();
    let (summary, nv_jobs, dp_jobs) = write_fixture(d.path());
    let page = commstack_timings::write_beside(&d.path().join("summary.json")).unwrap();
    assert_eq!(page, d.path().join("timings.html"));
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing fetched, nothing run.
    for bad in ["http:", "https:", "<script", "src=", "<link"] {
        assert!(!html.contains(bad), "the page holds {bad:?}");
    }
    let shown = show(&page, 1250, 2600, &d.path().join("browser"));
    let dom = &shown.dom;

    // Every step, with the summary's numbers exactly.
    let step_re = Regex::new(r#"<g class="step"[^>]*>"#).unwrap();
    let drawn: Vec<&str> = step_re.find_iter(dom).map(|m| m.as_str()).collect();
    let steps = summary["steps"].as_array().unwrap();
    assert_eq!(drawn.len(), steps.len());
    for (g, s) in drawn.iter().zip(steps) {
        assert_eq!(attr(g, "data-step"), s["step"].as_str().unwrap());
        assert_eq!(attr(g, "data-outcome"), s["outcome"].as_str().unwrap());
        for k in ["start", "end", "wait", "seconds"] {
            let v: f64 = attr(g, &format!("data-{k}")).parse().unwrap();
            assert_eq!(v, s[k].as_f64().unwrap(), "{k} of {g}");
        }
    }
    // The axis: ticks from 0 s to the end (17 min rounded to 2 min ticks).
    let tick_re = Regex::new(r#"<text class="tick"[^>]*>([^<]*)</text>"#).unwrap();
    let ticks: Vec<String> = tick_re
        .captures_iter(dom)
        .map(|c| c[1].to_string())
        .collect();
    for t in ["0 s", "2 min", "16 min"] {
        assert!(ticks.iter().any(|x| x == t), "{t} not in {ticks:?}");
    }
    // The legends: outcomes and wait; the compile jobs' kinds.
    for key in [
        "built",
        "substituted",
        "failed",
        "reused",
        "wait",
        "cuda",
        "c++",
        "link",
    ] {
        assert!(
            dom.contains(&format!(r#"data-key="{key}""#)),
            "no legend {key}"
        );
    }
    // Each ninja log on its own timeline, one rect per job.
    for (step, jobs) in [("nvshmem", nv_jobs), ("deepep", dp_jobs)] {
        let svg = Regex::new(&format!(r#"<svg class="ninja" data-step="{step}"[^>]*>"#))
            .unwrap()
            .find(dom)
            .unwrap_or_else(|| panic!("no ninja timeline of {step}"))
            .as_str()
            .to_string();
        assert_eq!(attr(&svg, "data-jobs"), jobs.to_string());
    }
    assert_eq!(
        dom.matches(r#"<rect class="job""#).count(),
        nv_jobs + dp_jobs
    );
    // What ran beside what: verify and load, in the table.
    let row = Regex::new(r#"(?s)<tr data-step="verify">.*?</tr>"#).unwrap();
    assert!(row.find(dom).unwrap().as_str().contains("<td>load</td>"));

    // The pixels: the built bars, base's wait, the legend-only colours, the job kinds.
    for (what, hex, min) in [
        ("built bars", "#1f5fbf", 5000),
        ("base's wait", "#f0b400", 2000),
        ("legend: pulled", "#2ca02c", 150),
        ("legend: failed", "#d62728", 150),
        ("cuda jobs", "#ff7f0e", 2000),
        ("c++ jobs", "#9467bd", 1000),
        ("link jobs", "#8c564b", 300),
    ] {
        let n = shown.count(rgb(hex), 10);
        assert!(
            n >= min,
            "{what} ({hex}): {n} pixels, expected {min} or more; see {}",
            shown.png.display()
        );
    }
    // The steps' bars stand one under the other: the built colour spans many rows.
    let rows = shown.rows_with(rgb("#1f5fbf"), 10, 3);
    assert!(
        rows.len() >= 13 * 12,
        "{} rows with a built bar",
        rows.len()
    );
}

#[test]
fn a_summary_without_times_is_refused_with_the_command_that_makes_them() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("summary.json");
    std::fs::write(
        &file,
        r#"{"stack":"s","lock":"l","ok":true,"seconds":1.0,"steps":[{"step":"lock","outcome":"reused","seconds":0.0}]}"#,
    )
    .unwrap();
    let err = format!("{:#}", commstack_timings::render(&file).unwrap_err());
    assert!(
        err.contains("no start and end") && err.contains("cargo xtask build --timings"),
        "{err}"
    );
    assert!(!d.path().join("timings.html").exists());
}

#[test]
fn a_ninja_log_moved_beside_the_summary_is_found_there() {
    let d = tempfile::tempdir().unwrap();
    let (summary, nv_jobs, _) = write_fixture(d.path());
    let first = commstack_timings::render(&d.path().join("summary.json")).unwrap();
    // The report copied elsewhere with its logs under ninja/<step>/: the same page.
    let other = d.path().join("copy");
    for (step, dir) in [("nvshmem", "nvshmem-1"), ("deepep", "deepep-1")] {
        let to = other.join("ninja").join(step);
        std::fs::create_dir_all(&to).unwrap();
        for e in
            std::fs::read_dir(d.path().join("store/steps").join(dir).join("logs/ninja")).unwrap()
        {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    std::fs::write(other.join("summary.json"), summary.to_string()).unwrap();
    std::fs::remove_dir_all(d.path().join("store")).unwrap();
    let again = commstack_timings::render(&other.join("summary.json")).unwrap();
    assert_eq!(first, again);
    assert!(again.matches(r#"<rect class="job""#).count() > nv_jobs);
    // copy_report does the copying: the same page again, from the copy alone.
    let copied =
        commstack_timings::copy_report(&other.join("summary.json"), &d.path().join("kept"))
            .unwrap();
    assert_eq!(std::fs::read_to_string(&copied).unwrap(), first);
    assert!(
        d.path()
            .join("kept/ninja/deepep/build_temp.linux-x86_64-cpython-311.ninja_log")
            .is_file()
    );
    assert!(
        commstack_timings::copy_report(&other.join("summary.json"), &d.path().join("kept"))
            .is_err()
    );
    // A log gone from both places is an error naming it and where to put it.
    std::fs::remove_dir_all(other.join("ninja/deepep")).unwrap();
    let err = format!(
        "{:#}",
        commstack_timings::render(&other.join("summary.json")).unwrap_err()
    );
    assert!(
        err.contains("build_temp.linux-x86_64-cpython-311.ninja_log")
            && err.contains("ninja/deepep"),
        "{err}"
    );
}
