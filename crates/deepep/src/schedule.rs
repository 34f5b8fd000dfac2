//! The order of the compile jobs: a front for ninja (ninja_order.py, run by the build's
//! own Python) first on the build's PATH. Every object of torch's build.ninja feeds the
//! device link, so ninja's longest-path-first order weighs all compiles the same and
//! starts them in torch's order, the host objects last: DeepEP's longest job
//! (python_api.cpp, 58 of the 155 CPU-seconds of jobs on the CPU machine) started last and
//! ran alone for its last 20 s or so on 2 cores. The front starts the host compiles first;
//! the commands and the objects are torch's (the step's wheel is byte for byte the same
//! with it; the fixture: tests/ninja_order.rs).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::env::BuildEnv;
use crate::reproducible::sh_quote;

/// The front's directory under the build's fixed directory.
pub const NINJA_FRONT_DIR: &str = "ninja-front";

/// The script the front runs (its docstring says what it writes).
pub const NINJA_ORDER_PY: &str = include_str!("ninja_order.py");

/// Puts the ninja front first on `env`'s PATH, in `<root>/ninja-front`, in front of the
/// ninja that PATH finds now (which it runs). Returns that ninja, or None (with a note)
/// when PATH has none: torch then compiles without ninja and there is nothing to order.
pub fn install_ninja_front(
    env: &mut BuildEnv,
    root: &Path,
    python: &Path,
) -> Result<Option<PathBuf>> {
    let path = env.vars.get("PATH").cloned().unwrap_or_default();
    let Some(real) = commstack_toolchain::find_in_path("ninja", Some(path.as_ref())) else {
        env.notes
            .push("PATH: no ninja on it, so no ninja front (torch compiles without ninja)".into());
        return Ok(None);
    };
    let dir = root.join(NINJA_FRONT_DIR);
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let script = dir.join("ninja_order.py");
    fs::write(&script, NINJA_ORDER_PY)
        .with_context(|| format!("cannot write {}", script.display()))?;
    let front = dir.join("ninja");
    fs::write(
        &front,
        format!(
            "#!/bin/sh\n# commstack (DeepEP build): ninja's job order, see ninja_order.py beside this.\nexec {} -I -S {} {} \"$@\"\n",
            sh_quote(&python.display().to_string()),
            sh_quote(&script.display().to_string()),
            sh_quote(&real.display().to_string()),
        ),
    )
    .with_context(|| format!("cannot write {}", front.display()))?;
    fs::set_permissions(&front, fs::Permissions::from_mode(0o755))?;
    env.vars
        .insert("PATH".into(), format!("{}:{path}", dir.display()));
    // The order is ninja >= 1.12's (longest path first); an older one starts jobs in the
    // file's order, stamps or not. The report says which ran.
    let version =
        commstack_toolchain::ninja_version(&real).unwrap_or_else(|_| "of unknown version".into());
    let orders = critical_path_scheduler(&version);
    env.notes.push(format!(
        "PATH: + {} first: a front for {} (ninja {version}) that starts the host compiles (python_api.cpp, DeepEP's longest job) first; torch's build.ninja and commands unchanged{}",
        dir.display(),
        real.display(),
        if orders {
            ""
        } else {
            " (this ninja predates 1.12's longest-path-first order: the order stays torch's)"
        }
    ));
    Ok(Some(real))
}

/// Whether ninja `version` (its `--version` line) orders jobs by longest path (1.12+).
fn critical_path_scheduler(version: &str) -> bool {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (1, 12)
}

#[cfg(test)]
mod tests {
    use super::critical_path_scheduler;

    #[test]
    fn ninja_orders_by_longest_path_from_1_12() {
        assert!(critical_path_scheduler(
            "1.13.2.git.kitware.jobserver-pipe-1"
        ));
        assert!(critical_path_scheduler("1.12.0"));
        assert!(critical_path_scheduler("2.0"));
        assert!(!critical_path_scheduler("1.11.1"));
        assert!(!critical_path_scheduler("of unknown version"));
    }
}
