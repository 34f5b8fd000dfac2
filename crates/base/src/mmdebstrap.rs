//! Running mmdebstrap: found on PATH, its version (part of the step key), the command
//! line with SOURCE_DATE_EPOCH and an empty environment, in a new network namespace
//! where the kernel allows one (proof that the base is made offline).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The mmdebstrap on PATH and its version ("1.3.5").
#[derive(Clone, Debug)]
pub struct Mmdebstrap {
    pub path: PathBuf,
    pub version: String,
}

pub fn find() -> Result<Mmdebstrap> {
    let path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain(["/usr/bin".into(), "/usr/sbin".into()])
        .map(|d| d.join("mmdebstrap"))
        .find(|p| p.is_file())
        .context(
            "mmdebstrap is not installed (the base root filesystem is made with it): \
             `apt-get install mmdebstrap` on Debian or Ubuntu",
        )?;
    let out = Command::new(&path)
        .arg("--version")
        .env_clear()
        .env("PATH", SYSTEM_PATH)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .with_context(|| format!("cannot run {} --version", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .nth(1)
        .filter(|_| out.status.success() && text.starts_with("mmdebstrap "))
        .with_context(|| format!("{} --version printed {text:?}", path.display()))?
        .to_string();
    Ok(Mmdebstrap { path, version })
}

/// mmdebstrap calls apt, dpkg, chroot and friends from the host.
pub const SYSTEM_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether `unshare --net` works here (root, or a kernel that lets us): then mmdebstrap
/// runs with no network at all.
pub fn can_cut_network() -> bool {
    Command::new("unshare")
        .args(["--net", "--", "true"])
        .env_clear()
        .env("PATH", SYSTEM_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Everything one run needs.
pub struct Run<'a> {
    pub tool: &'a Mmdebstrap,
    pub variant: &'a str,
    pub include: &'a [String],
    pub architecture: &'a str,
    pub suite: &'a str,
    pub source: &'a str,
    /// The `etc/apt/sources.list` the image keeps (the lock's mirror), fixed text.
    pub sources_list: &'a str,
    pub epoch: u64,
    pub out_tar: &'a Path,
    pub home: &'a Path,
    pub tmp: &'a Path,
    pub cut_network: bool,
    pub log: &'a Path,
}

/// `'...'` for sh, whatever the text holds.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The argument list after the program (shown in the log and the report).
pub fn arguments(r: &Run<'_>) -> Vec<String> {
    // No --mode: mmdebstrap's auto picks root mode as root (what runs here and in CI)
    // and unshare mode otherwise; both give the same tree.
    let mut args = vec![
        format!("--variant={}", r.variant),
        format!("--architectures={}", r.architecture),
        "--skip=output/dev".to_string(),
        "--aptopt=Acquire::Languages \"none\"".to_string(),
        "--customize-hook=printf 'commstack\\n' > \"$1/etc/hostname\"".to_string(),
        "--customize-hook=printf '# commstack: the container runtime provides the resolver configuration\\n' > \"$1/etc/resolv.conf\"".to_string(),
        format!(
            "--customize-hook=printf '%s\\n' {} > \"$1/etc/apt/sources.list\"",
            sh_quote(r.sources_list)
        ),
    ];
    if !r.include.is_empty() {
        args.push(format!("--include={}", r.include.join(",")));
    }
    args.push(r.suite.to_string());
    args.push(r.out_tar.display().to_string());
    args.push(r.source.to_string());
    args
}

/// Run it, output appended to `r.log`. Returns the command line as shown in the log.
pub fn run(r: &Run<'_>) -> Result<String> {
    let args = arguments(r);
    let (program, mut full): (PathBuf, Vec<String>) = if r.cut_network {
        (
            PathBuf::from("unshare"),
            vec![
                "--net".into(),
                "--".into(),
                r.tool.path.display().to_string(),
            ],
        )
    } else {
        (r.tool.path.clone(), Vec::new())
    };
    full.extend(args);
    let shown = std::iter::once(program.display().to_string())
        .chain(full.iter().map(|a| sh_quote(a)))
        .collect::<Vec<_>>()
        .join(" ");
    let env = [
        ("PATH", SYSTEM_PATH.to_string()),
        ("HOME", r.home.display().to_string()),
        ("TMPDIR", r.tmp.display().to_string()),
        ("SOURCE_DATE_EPOCH", r.epoch.to_string()),
        ("LC_ALL", "C.UTF-8".to_string()),
    ];
    let mut log =
        File::create(r.log).with_context(|| format!("cannot create {}", r.log.display()))?;
    {
        use std::io::Write;
        for (k, v) in &env {
            writeln!(log, "# {k}={v}")?;
        }
        writeln!(log, "$ {shown}")?;
    }
    let mut cmd = Command::new(&program);
    cmd.args(&full)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {}", program.display()))?;
    if !status.success() {
        // The last lines of its log: apt's and mmdebstrap's own `E:` lines come last.
        let text = std::fs::read_to_string(r.log).unwrap_or_default();
        bail!(commstack_exec::CommandFailed {
            what: "mmdebstrap".into(),
            program: program.display().to_string(),
            args: full,
            status: status.to_string(),
            stderr_tail: commstack_exec::last_lines(&text, 15),
            log: Some(r.log.to_path_buf()),
        });
    }
    Ok(shown)
}
