//! Running one command with exactly the environment given, its output in a log file,
//! and the first error lines read back when it fails (a [`CommandFailed`], as every
//! command the stack runs reports).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use commstack_exec::shell_quote;

/// Run `program args...` in `cwd` with `env` as its whole environment, stdout and stderr
/// appended to `log` as they come (`tail -f` works); `progress` hears ninja's
/// `[done/total]` every 30 s. Returns the seconds taken.
pub fn run_logged(
    program: &Path,
    args: &[String],
    cwd: &Path,
    env: &BTreeMap<String, String>,
    log: &Path,
    what: &str,
    progress: Option<&dyn Fn(&str)>,
) -> Result<f64> {
    let shown = format!(
        "{} {}",
        program.display(),
        args.iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut header = format!("$ cd {}\n", cwd.display());
    for (k, v) in env {
        header.push_str(&format!("$ export {k}={}\n", shell_quote(v)));
    }
    header.push_str(&format!("$ {shown}\n"));
    let mut command = Command::new(program);
    command.args(args).current_dir(cwd).env_clear().envs(env);
    commstack_exec::run_logged_with_progress(command, &header, log, what, progress)
}

/// Run a short command with `env` as its whole environment and return its stdout; a
/// failure is a [`commstack_exec::CommandFailed`] (its stderr's last lines).
pub fn output(program: &Path, args: &[&str], env: &BTreeMap<String, String>) -> Result<String> {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null());
    let what = program.file_name().unwrap_or_default().to_string_lossy();
    let out = commstack_exec::output(&what, &mut command)?;
    String::from_utf8(out.stdout)
        .with_context(|| format!("{} printed non-UTF-8 output", program.display()))
}

/// The environment for helper commands (pip, venv, probes): a minimal PATH, a private
/// HOME, no pip configuration from the user or the machine (PIP_* variables, pip.conf).
pub fn tool_env(home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".into(), "/usr/bin:/bin".into());
    env.insert("HOME".into(), home.display().to_string());
    env.insert("LANG".into(), "C.UTF-8".into());
    env.insert("LC_ALL".into(), "C.UTF-8".into());
    env.insert("PYTHONNOUSERSITE".into(), "1".into());
    env.insert("PYTHONDONTWRITEBYTECODE".into(), "1".into());
    env.insert("PIP_CONFIG_FILE".into(), "/dev/null".into());
    env.insert("PIP_DISABLE_PIP_VERSION_CHECK".into(), "1".into());
    env.insert("PIP_NO_INPUT".into(), "1".into());
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_command_names_its_log_and_first_errors() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("build.log");
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
        let err = run_logged(
            Path::new("/bin/sh"),
            &[
                "-c".into(),
                "echo compiling; echo '/usr/bin/ld: cannot find -l:libnvshmem_host.so' >&2; exit 3"
                    .into(),
            ],
            dir.path(),
            &env,
            &log,
            "setup.py bdist_wheel",
            None,
        )
        .unwrap_err();
        let failed = err.downcast_ref::<commstack_exec::CommandFailed>().unwrap();
        assert_eq!(
            failed.stderr_tail[0],
            "/usr/bin/ld: cannot find -l:libnvshmem_host.so"
        );
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("$ export PATH=/usr/bin:/bin") && text.contains("compiling"),
            "{text}"
        );
    }

    #[test]
    fn the_environment_is_exactly_the_one_given() {
        let dir = tempfile::tempdir().unwrap();
        let mut env = tool_env(dir.path());
        env.insert("ONLY_THIS".into(), "1".into());
        let out = output(Path::new("/usr/bin/env"), &[], &env).unwrap();
        let keys: Vec<&str> = out.lines().filter_map(|l| l.split('=').next()).collect();
        let mut want: Vec<&str> = env.keys().map(String::as_str).collect();
        want.sort();
        let mut got = keys.clone();
        got.sort();
        assert_eq!(
            got, want,
            "cargo's CARGO_* variables and the user's PIP_* must not leak"
        );
    }
}
