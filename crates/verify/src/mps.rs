//! The CUDA MPS daemon for a run with several PEs on one GPU (NVSHMEM's multiple-PEs-per-GPU
//! mode): started with its pipe and log directories in a temporary directory of its own,
//! so it neither meets nor disturbs a daemon the machine already runs, and stopped when
//! the guard is dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The daemon's control program (ships with the NVIDIA driver).
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";
/// How long the daemon may take to open its control pipe.
const START_WAIT: Duration = Duration::from_secs(15);

/// A running MPS daemon; dropped: stopped (`echo quit | nvidia-cuda-mps-control`).
pub struct MpsDaemon {
    program: PathBuf,
    dir: tempfile::TempDir,
}

impl MpsDaemon {
    /// Starts `nvidia-cuda-mps-control -d` from PATH.
    pub fn start() -> Result<MpsDaemon> {
        MpsDaemon::start_with(Path::new(MPS_CONTROL))
    }

    /// Starts the daemon with the control program `program`, and waits for its pipe.
    pub fn start_with(program: &Path) -> Result<MpsDaemon> {
        let dir = tempfile::Builder::new()
            .prefix("commstack-mps-")
            .tempdir()
            .context("creating the MPS daemon's directories")?;
        for d in ["pipe", "log"] {
            std::fs::create_dir(dir.path().join(d))?;
        }
        let daemon = MpsDaemon {
            program: program.to_path_buf(),
            dir,
        };
        let status = daemon
            .command()
            .arg("-d")
            .status()
            .with_context(|| {
                format!(
                    "cannot run {} -d (the CUDA MPS daemon ships with the NVIDIA driver; several PEs on one GPU need it)",
                    program.display()
                )
            })?;
        if !status.success() {
            bail!(
                "{} -d failed ({status}): see {}",
                program.display(),
                daemon.dir.path().join("log/control.log").display()
            );
        }
        let control = daemon.pipe_dir().join("control");
        let start = Instant::now();
        while !control.exists() {
            if start.elapsed() > START_WAIT {
                bail!(
                    "the MPS daemon opened no control pipe at {} within {START_WAIT:?}: see {}",
                    control.display(),
                    daemon.dir.path().join("log/control.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    pub fn pipe_dir(&self) -> PathBuf {
        self.dir.path().join("pipe")
    }

    /// What every process that uses this daemon needs in its environment.
    pub fn env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("CUDA_MPS_PIPE_DIRECTORY", self.pipe_dir()),
            ("CUDA_MPS_LOG_DIRECTORY", self.dir.path().join("log")),
        ]
    }

    /// The daemon's control log, to keep with a run's report.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log/control.log")).unwrap_or_default()
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.envs(self.env());
        c
    }
}

impl Drop for MpsDaemon {
    fn drop(&mut self) {
        let child = self.command().stdin(Stdio::piped()).spawn();
        if let Ok(mut child) = child {
            if let Some(mut stdin) = child.stdin.take() {
                let _ = stdin.write_all(b"quit\n");
            }
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_control_program_is_an_error_naming_it() {
        let err = MpsDaemon::start_with(Path::new("/nonexistent/nvidia-cuda-mps-control"))
            .err()
            .expect("no daemon without its program");
        let said = format!("{err:#}");
        assert!(
            said.contains("/nonexistent/nvidia-cuda-mps-control -d")
                && said.contains("NVIDIA driver"),
            "{said}"
        );
    }

    /// A stand-in control program (a real process): `-d` makes the control pipe where
    /// CUDA_MPS_PIPE_DIRECTORY says, as the daemon does; every call is recorded.
    #[test]
    fn the_daemon_gets_its_own_directories_and_is_told_to_quit_when_dropped() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("nvidia-cuda-mps-control");
        let calls = dir.path().join("calls");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\nif [ \"$1\" = -d ]; then mkfifo \"$CUDA_MPS_PIPE_DIRECTORY/control\"; echo \"start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY\" >> {c}; \
                 else read cmd; echo \"$cmd $CUDA_MPS_PIPE_DIRECTORY\" >> {c}; fi\n",
                c = calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let daemon = MpsDaemon::start_with(&program).unwrap();
        let pipe = daemon.pipe_dir();
        assert!(pipe.join("control").exists());
        let env = daemon.env();
        assert_eq!(env[0], ("CUDA_MPS_PIPE_DIRECTORY", pipe.clone()));
        assert!(env[1].1.ends_with("log") && env[1].1.starts_with(pipe.parent().unwrap()));
        drop(daemon);
        let said = std::fs::read_to_string(&calls).unwrap();
        let lines: Vec<&str> = said.lines().collect();
        assert_eq!(lines.len(), 2, "{said}");
        assert!(
            lines[0].starts_with(&format!("start {}", pipe.display())),
            "{said}"
        );
        assert_eq!(lines[1], format!("quit {}", pipe.display()));
        assert!(!pipe.exists(), "its directories go with it");
    }
}
