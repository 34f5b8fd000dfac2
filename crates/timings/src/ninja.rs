//! `.ninja_log` files as compile jobs: each line `start end mtime output hash` (ms since
//! that ninja started), the longest ninja run of the file only (a nested project's log
//! holds its build and then a short install run; a resumed build, each attempt), one job per command (the
//! outputs of one command merged), packed into lanes (a job in the first lane free at its
//! start: as many lanes as jobs ran at once).

use anyhow::{Result, bail};

/// One command ninja ran.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// Milliseconds since that ninja started.
    pub start_ms: u64,
    pub end_ms: u64,
    /// What it made (a command with several outputs names them all).
    pub outputs: Vec<String>,
    /// cuda, c++, compile, link or other, from its first output's name.
    pub kind: &'static str,
    /// The lane it is drawn in (0 = top).
    pub lane: usize,
}

/// The jobs of one ninja log's longest run, with their lanes.
#[derive(Clone, Debug, PartialEq)]
pub struct NinjaLog {
    /// The log's file name (`build.ninja_log`, `src_device.ninja_log`, ...).
    pub name: String,
    pub version: u32,
    pub jobs: Vec<Job>,
    /// Other ninja runs in the same file (shorter), left out.
    pub other_runs: usize,
}

impl NinjaLog {
    pub fn lanes(&self) -> usize {
        self.jobs.iter().map(|j| j.lane + 1).max().unwrap_or(0)
    }

    /// From the first job's start to the last one's end, in seconds.
    pub fn seconds(&self) -> f64 {
        let end = self.jobs.iter().map(|j| j.end_ms).max().unwrap_or(0);
        end as f64 / 1000.0
    }

    /// Seconds of all jobs together (CPU-ish time: what ran in parallel counts each).
    pub fn job_seconds(&self) -> f64 {
        self.jobs
            .iter()
            .map(|j| (j.end_ms - j.start_ms) as f64 / 1000.0)
            .sum()
    }
}

/// The ninja log `text` (versions 5 to 7: `# ninja log vN` then tab-separated lines).
pub fn parse_ninja_log(text: &str) -> Result<NinjaLog> {
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let Some(version) = header
        .strip_prefix("# ninja log v")
        .and_then(|v| v.trim().parse::<u32>().ok())
    else {
        bail!("the first line is {header:?}, not `# ninja log vN`");
    };
    if !(5..=7).contains(&version) {
        bail!("ninja log version {version}: only versions 5 to 7 are read");
    }
    // Each run's jobs, and the (start, end, hash) of each: one command's outputs share them.
    let mut runs: Vec<Vec<(Job, String)>> = vec![Vec::new()];
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let [start, end, _mtime, output, hash] = f[..] else {
            bail!("line {}: {} fields, expected 5: {line:?}", n + 2, f.len());
        };
        let (Ok(start_ms), Ok(end_ms)) = (start.parse::<u64>(), end.parse::<u64>()) else {
            bail!(
                "line {}: start and end are not milliseconds: {line:?}",
                n + 2
            );
        };
        // Jobs are logged as they end: an end before the last one is a later ninja run.
        if runs
            .last()
            .and_then(|r| r.last())
            .is_some_and(|(j, _)| end_ms < j.end_ms)
        {
            runs.push(Vec::new());
        }
        let run = runs.last_mut().expect("one run");
        let same = |(j, h): &&mut (Job, String)| {
            j.start_ms == start_ms && j.end_ms == end_ms.max(start_ms) && h == hash
        };
        match run.iter_mut().rev().take(64).find(same) {
            Some((j, _)) => j.outputs.push(output.to_string()),
            None => run.push((
                Job {
                    start_ms,
                    end_ms: end_ms.max(start_ms),
                    outputs: vec![output.to_string()],
                    kind: kind(output),
                    lane: 0,
                },
                hash.to_string(),
            )),
        }
    }
    let other_runs = runs.len() - 1;
    // The longest run (the last of equally long ones).
    let span = |r: &Vec<(Job, String)>| r.iter().map(|(j, _)| j.end_ms).max().unwrap_or(0);
    let longest = (0..runs.len())
        .max_by_key(|i| (span(&runs[*i]), *i))
        .expect("one run");
    let mut jobs: Vec<Job> = runs
        .swap_remove(longest)
        .into_iter()
        .map(|(j, _)| j)
        .collect();
    jobs.sort_by_key(|j| (j.start_ms, j.end_ms));
    let mut lane_ends: Vec<u64> = Vec::new();
    for j in &mut jobs {
        j.lane = match lane_ends.iter().position(|e| *e <= j.start_ms) {
            Some(l) => l,
            None => {
                lane_ends.push(0);
                lane_ends.len() - 1
            }
        };
        lane_ends[j.lane] = j.end_ms;
    }
    Ok(NinjaLog {
        name: String::new(),
        version,
        jobs,
        other_runs,
    })
}

/// What a job made, from its output's name.
fn kind(output: &str) -> &'static str {
    let name = output.rsplit('/').next().unwrap_or(output);
    if name.ends_with(".cu.o") {
        "cuda"
    } else if [".cpp.o", ".cc.o", ".cxx.o", ".c.o"]
        .iter()
        .any(|x| name.ends_with(x))
    {
        "c++"
    } else if name.ends_with(".o") {
        "compile"
    } else if name.ends_with(".so") || name.ends_with(".a") || name.contains(".so.") {
        "link"
    } else {
        "other"
    }
}

/// The kinds, in legend order.
pub const KINDS: [&str; 5] = ["cuda", "c++", "compile", "link", "other"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_run_is_read_and_jobs_are_packed_into_lanes() {
        let log = "# ninja log v5\n\
            0\t900\t1\told.o\taa\n\
            1000\t2000\t1\told2.o\tab\n\
            0\t1500\t1\tsrc/b.cpp.o\tb2\n\
            1500\t2500\t1\tsrc/c.cc.o\tb3\n\
            0\t4000\t1\tsrc/a.cu.o\tb1\n\
            4000\t4200\t1\tlib/libx.so.3\tb4\n\
            4000\t4200\t1\tlib/libx.so\tb4\n";
        let l = parse_ninja_log(log).unwrap();
        assert_eq!(l.other_runs, 1);
        let got: Vec<(&str, u64, u64, usize, &str)> = l
            .jobs
            .iter()
            .map(|j| (j.outputs[0].as_str(), j.start_ms, j.end_ms, j.lane, j.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("src/b.cpp.o", 0, 1500, 0, "c++"),
                ("src/a.cu.o", 0, 4000, 1, "cuda"),
                ("src/c.cc.o", 1500, 2500, 0, "c++"),
                ("lib/libx.so.3", 4000, 4200, 0, "link"),
            ]
        );
        assert_eq!(l.jobs[3].outputs, ["lib/libx.so.3", "lib/libx.so"]);
        assert_eq!(l.lanes(), 2);
        assert_eq!(l.seconds(), 4.2);
        assert!((l.job_seconds() - 6.7).abs() < 1e-9);
    }

    #[test]
    fn a_nested_projects_install_run_after_its_build_is_left_out() {
        // As NVSHMEM's device project logs it: the build, then `ninja install`.
        let log = "# ninja log v7\n\
            13\t1227\t1\ta.cpp.o\th1\n\
            6\t7822\t1\tb.cu.o\th2\n\
            7822\t7900\t1\tlib/libx.a\th3\n\
            15\t39\t1\tCMakeFiles/install.util\th4\n";
        let l = parse_ninja_log(log).unwrap();
        assert_eq!(l.other_runs, 1);
        let outputs: Vec<&str> = l.jobs.iter().map(|j| j.outputs[0].as_str()).collect();
        assert_eq!(outputs, ["b.cu.o", "a.cpp.o", "lib/libx.a"]);
    }

    #[test]
    fn a_bad_log_is_refused_with_the_line() {
        assert!(parse_ninja_log("hello\n").is_err());
        assert!(parse_ninja_log("# ninja log v4\n").is_err());
        let e = parse_ninja_log("# ninja log v5\n1\t2\tx\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_ninja_log("# ninja log v5\na\t2\t3\tx\th\n").unwrap_err();
        assert!(e.to_string().contains("milliseconds"), "{e}");
    }
}
