//! docs/timings-example/: the timings page of a real cold build on the CPU machine
//! (`cargo xtask build --timings`, copied with `cargo xtask timings SUMMARY.json --copy-to
//! docs/timings-example`), checked against the summary.json kept beside it: every number
//! the page shows is summary.json's, and the page renders again from that directory byte
//! for byte.

use std::path::{Path, PathBuf};

use regex::Regex;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/timings-example")
}

fn summary() -> serde_json::Value {
    let text = std::fs::read_to_string(example().join("summary.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn page() -> String {
    std::fs::read_to_string(example().join("timings.html")).unwrap()
}

fn attr(element: &str, name: &str) -> String {
    let re = Regex::new(&format!(r#"\b{name}="([^"]*)""#)).unwrap();
    re.captures(element)
        .unwrap_or_else(|| panic!("no {name} in {element}"))[1]
        .to_string()
}

#[test]
fn the_examples_numbers_are_its_summarys() {
    let s = summary();
    let html = page();
    let steps = s["steps"].as_array().unwrap();
    assert!(
        s["ok"].as_bool().unwrap(),
        "the example is of a build that passed"
    );
    // A cold build: every step made here, none reused.
    let made = steps.iter().filter(|r| r["outcome"] == "built").count();
    assert!(made >= 12, "{made} steps built");
    let groups: Vec<&str> = Regex::new(r#"<g class="step"[^>]*>"#)
        .unwrap()
        .find_iter(&html)
        .map(|m| m.as_str())
        .collect();
    assert_eq!(groups.len(), steps.len());
    let td = Regex::new(r"<td[^>]*>([^<]*)</td>").unwrap();
    for (g, r) in groups.iter().zip(steps) {
        assert_eq!(attr(g, "data-step"), r["step"].as_str().unwrap());
        assert_eq!(attr(g, "data-outcome"), r["outcome"].as_str().unwrap());
        for k in ["start", "end", "wait", "seconds"] {
            let v: f64 = attr(g, &format!("data-{k}")).parse().unwrap();
            assert_eq!(v, r[k].as_f64().unwrap(), "{k} of {g}");
        }
        // The table's row shows the same, rounded to tenths.
        let row = Regex::new(&format!(
            r#"(?s)<tr data-step="{}">(.*?)</tr>"#,
            r["step"].as_str().unwrap()
        ))
        .unwrap();
        let cells: Vec<String> = td
            .captures_iter(&row.captures(&html).unwrap()[1])
            .map(|c| c[1].to_string())
            .collect();
        let tenth = |k: &str| format!("{:.1}", r[k].as_f64().unwrap());
        assert_eq!(
            cells[2..6],
            [
                tenth("start"),
                tenth("wait"),
                tenth("seconds"),
                tenth("end")
            ],
            "{}",
            r["step"]
        );
    }
    let total = Regex::new(r#"(?s)<tr id="total">.*?</tr>"#).unwrap();
    assert!(
        total
            .find(&html)
            .unwrap()
            .as_str()
            .contains(&format!("{:.1}", s["seconds"].as_f64().unwrap()))
    );
    // NVSHMEM's and DeepEP's compile jobs, one rect per job of their ninja logs' last run.
    for step in ["nvshmem", "deepep"] {
        let dir = example().join("ninja").join(step);
        let mut jobs = 0;
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            jobs += commstack_timings::parse_ninja_log(&text)
                .unwrap()
                .jobs
                .len();
        }
        let svgs: usize = Regex::new(&format!(r#"<svg class="ninja" data-step="{step}"[^>]*>"#))
            .unwrap()
            .find_iter(&html)
            .map(|m| attr(m.as_str(), "data-jobs").parse::<usize>().unwrap())
            .sum();
        assert!(
            jobs > 0 && svgs == jobs,
            "{step}: {svgs} drawn, {jobs} in its logs"
        );
    }
}

#[test]
fn the_example_renders_again_byte_for_byte() {
    let again = commstack_timings::render(&example().join("summary.json")).unwrap();
    assert!(
        again == page(),
        "docs/timings-example/timings.html is not what its summary.json renders: run `cargo xtask timings docs/timings-example/summary.json`"
    );
}
