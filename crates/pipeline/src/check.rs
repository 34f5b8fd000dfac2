//! `build --check`: build the steps a second time in a fresh home, with what should not
//! matter varied, and compare what each step ships byte for byte.
//!
//! The second build runs in a child process (the same command with `--force`), so the
//! variations reach every compiler: another COMMSTACK_HOME and store, another time zone,
//! locale, umask and job count, another hostname where a UTS namespace can be made, and
//! other process ids. Its store starts with links to every step of the first build's
//! store, so `--only STEP` rebuilds that step alone from the first build's inputs; `--force`
//! replaces a link with a fresh build (the store never writes through it).
//!
//! Each step's result names what it ships ([`commstack_steps::graph::Steps::shipped`]); the two
//! manifests (sha256, size and mode of every file) are compared, and each file that
//! differs is named, with diffoscope's report of it when diffoscope is installed.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use commstack_digest::manifest::{differences, manifest};
use serde::{Deserialize, Serialize};

use commstack_steps::graph::{StepId, Steps, StoredResult};

/// What the second build varies.
#[derive(Clone, Debug, Serialize)]
pub struct Variations {
    pub tz: String,
    pub locale: String,
    pub umask: u32,
    pub hostname: String,
    /// Parallel jobs (`--jobs`): one more than the first build's.
    pub jobs: usize,
}

impl Variations {
    /// Unlike what a build machine usually has: a time zone with a 45-minute offset (no
    /// tzdata needed), the C locale, a restrictive umask.
    pub fn for_check(first_jobs: usize) -> Variations {
        Variations {
            tz: "NPT-5:45".into(),
            locale: "C".into(),
            umask: 0o027,
            hostname: "commstack-check".into(),
            jobs: first_jobs + 1,
        }
    }

    /// `program args` run with the variations: `sh` sets the umask (and the hostname, in a
    /// new UTS namespace where `unshare` can make one) and execs it. Returns the command
    /// and, in words, what is varied and what could not be.
    pub fn command(&self, program: &Path, args: &[OsString]) -> (Command, Vec<String>) {
        let mut said = vec![
            format!("TZ={}", self.tz),
            format!("LC_ALL={}", self.locale),
            format!("umask {:04o}", self.umask),
            format!("{} jobs", self.jobs),
            "another COMMSTACK_HOME, store and process ids".to_string(),
        ];
        let uts = Command::new("unshare")
            .args(["--uts", "true"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        let script = match uts {
            true => {
                said.push(format!("hostname {}", self.hostname));
                format!(
                    "hostname {} && umask {:04o} && exec \"$@\"",
                    self.hostname, self.umask
                )
            }
            false => {
                said.push(
                    "hostname not varied: `unshare --uts` is not permitted here (needs root or user namespaces)"
                        .to_string(),
                );
                format!("umask {:04o} && exec \"$@\"", self.umask)
            }
        };
        let mut cmd = match uts {
            true => {
                let mut c = Command::new("unshare");
                c.args(["--uts", "sh", "-c", &script, "sh"]);
                c
            }
            false => {
                let mut c = Command::new("sh");
                c.args(["-c", &script, "sh"]);
                c
            }
        };
        cmd.arg(program).args(args);
        cmd.env("TZ", &self.tz)
            .env("LC_ALL", &self.locale)
            .env("LANG", &self.locale);
        (cmd, said)
    }
}

/// Makes `scratch` a fresh home for the second build: the first home's download cache
/// (inputs, checked by hash) linked, and each complete step of its store linked under
/// `store/steps/`.
pub fn scratch_home(first_home: &Path, scratch: &Path) -> Result<()> {
    if fs::symlink_metadata(scratch).is_ok() {
        fs::remove_dir_all(scratch)
            .with_context(|| format!("cannot clear the last check's home {}", scratch.display()))?;
    }
    let steps = scratch.join("store/steps");
    fs::create_dir_all(&steps).with_context(|| format!("cannot create {}", steps.display()))?;
    let cache = first_home.join("cache");
    if cache.is_dir() {
        std::os::unix::fs::symlink(&cache, scratch.join("cache"))?;
    }
    let first_steps = first_home.join("store/steps");
    if let Ok(entries) = fs::read_dir(&first_steps) {
        for e in entries {
            let e = e?;
            std::os::unix::fs::symlink(e.path(), steps.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// One step of a build, as the check reads it from a run's summary.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BuiltStep {
    pub step: StepId,
    /// The store directory name of the graph step.
    pub key: Option<String>,
}

impl From<&commstack_steps::graph::Ran> for BuiltStep {
    fn from(r: &commstack_steps::graph::Ran) -> BuiltStep {
        BuiltStep {
            step: r.step,
            key: r.key.clone(),
        }
    }
}

/// The verdict for one step.
#[derive(Clone, Debug, Serialize)]
pub struct StepCheck {
    pub step: StepId,
    pub key: String,
    /// The second build's key, when it is not the first's (an input that depends on the
    /// machine or the home: a defect of the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_key: Option<String>,
    pub files: usize,
    /// (file, what differs), relative to what the step ships.
    pub differences: Vec<(String, String)>,
    /// diffoscope's report of each differing file, where it ran.
    pub reports: Vec<PathBuf>,
}

impl StepCheck {
    pub fn passed(&self) -> bool {
        self.other_key.is_none() && self.differences.is_empty()
    }
}

/// The result of a keyed step, read from a store's `steps/<key>/result.json`.
fn read_result(store_root: &Path, key: &str) -> Result<StoredResult> {
    let file = store_root.join("steps").join(key).join("result.json");
    let text = fs::read_to_string(&file).with_context(|| {
        format!(
            "reading {} (the step is not complete in that store)",
            file.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a step result", file.display()))
}

/// Compares what each keyed step of `first` ships with the same step of `second`. Steps
/// that ship nothing are left out. Reports of diffoscope go under `report_dir`.
pub fn compare(
    steps: &dyn Steps<StepId>,
    first: &[BuiltStep],
    first_store: &Path,
    second: &[BuiltStep],
    second_store: &Path,
    report_dir: &Path,
) -> Result<Vec<StepCheck>> {
    let mut out = Vec::new();
    for a in first.iter().filter(|a| a.step.keyed()) {
        let Some(key) = &a.key else { continue };
        let Some(b) = second.iter().find(|b| b.step == a.step) else {
            continue;
        };
        let Some(other) = &b.key else { continue };
        let ra = read_result(first_store, key)?;
        let rb = read_result(second_store, other)?;
        let (Some(root_a), Some(root_b)) = (
            steps.shipped(a.step, &ra.result),
            steps.shipped(b.step, &rb.result),
        ) else {
            continue;
        };
        let skip = commstack_steps::graph::not_shipped;
        let ma = manifest(&root_a, &skip)
            .with_context(|| format!("reading what {} ships: {}", a.step, root_a.display()))?;
        let mb = manifest(&root_b, &skip)
            .with_context(|| format!("reading what {} ships: {}", b.step, root_b.display()))?;
        let diffs = differences(&ma, &mb);
        let mut reports = Vec::new();
        for (file, _) in diffs.iter().take(5) {
            let (fa, fb) = (file_in(&root_a, file), file_in(&root_b, file));
            if fa.is_file() && fb.is_file() {
                let out = report_dir
                    .join(a.step.name())
                    .join(format!("{}.diffoscope.txt", file.replace('/', "__")));
                if diffoscope(&fa, &fb, &out)? {
                    reports.push(out);
                }
            }
        }
        out.push(StepCheck {
            step: a.step,
            key: key.clone(),
            other_key: (other != key).then(|| other.clone()),
            files: ma.len(),
            differences: diffs,
            reports,
        });
    }
    Ok(out)
}

/// `root/file`, or `root` itself when it is a file (its manifest names it alone).
fn file_in(root: &Path, file: &str) -> PathBuf {
    match root.is_file() {
        true => root.to_path_buf(),
        false => root.join(file),
    }
}

/// diffoscope's text report of two files into `out`, when diffoscope is installed (false
/// when it is not). It exits 1 when the files differ, which is what is asked.
fn diffoscope(a: &Path, b: &Path, out: &Path) -> Result<bool> {
    let Some(program) = commstack_toolchain::find_in_path("diffoscope", None) else {
        return Ok(false);
    };
    if let Some(dir) = out.parent() {
        fs::create_dir_all(dir)?;
    }
    let status = Command::new("timeout")
        .arg("600")
        .arg(program)
        .arg("--text")
        .arg(out)
        .arg("--no-progress")
        .arg(a)
        .arg(b)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .with_context(|| format!("running diffoscope on {}", a.display()))?;
    Ok(matches!(status.code(), Some(0 | 1)) && out.is_file())
}

/// The check's verdict as a table on stderr (and the first lines of each report).
pub fn print(checks: &[StepCheck], varied: &[String]) {
    eprintln!("\nbuild --check: a second build with {}", varied.join(", "));
    eprintln!("{:<14} {:>7}  verdict", "step", "files");
    for c in checks {
        let verdict = match (&c.other_key, c.differences.len()) {
            (Some(k), _) => format!("DIFFERS: the second build's key is {k}"),
            (None, 0) => "identical".to_string(),
            (None, n) => format!("DIFFERS: {n} file(s)"),
        };
        eprintln!("{:<14} {:>7}  {verdict}", c.step.name(), c.files);
        for (file, what) in c.differences.iter().take(10) {
            eprintln!("{:>24} {file}: {what}", "");
        }
        if c.differences.len() > 10 {
            eprintln!("{:>24} ... and {} more", "", c.differences.len() - 10);
        }
        for r in &c.reports {
            eprintln!("{:>24} diffoscope: {}", "", r.display());
            if let Ok(text) = fs::read_to_string(r) {
                for line in text.lines().take(12) {
                    eprintln!("{:>26}{}", "", commstack_digest::terminal_safe(line));
                }
            }
        }
    }
}
