//! Options every command shares, and the paths derived from them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::options::GlobalOptions;

pub struct Ctx {
    pub stack_path: PathBuf,
    /// `--stack` (or COMMSTACK_STACK) was given, rather than stack.toml found by walking up.
    pub stack_given: bool,
    pub home: PathBuf,
    pub quiet: bool,
}

impl Ctx {
    pub fn new(args: GlobalOptions) -> Result<Ctx> {
        let home = match args.home {
            Some(home) => home,
            None => dirs::cache_dir()
                .context("no cache directory for this user: pass --home DIR or set COMMSTACK_HOME")?
                .join("commstack"),
        };
        // Absolute, so build keys and the paths recorded in reports do not depend on the
        // directory a command was started from.
        let home =
            std::path::absolute(&home).with_context(|| format!("--home {}", home.display()))?;
        let stack_given = args.stack.is_some();
        // Not found is not an error here: doctor, logscan, verify, cache and store read no
        // manifest. A command that does gets "cannot read stack.toml" with the hint.
        let stack_path = match args.stack {
            Some(path) => path,
            None => std::env::current_dir()
                .ok()
                .and_then(|cwd| find_stack_toml(&cwd).ok())
                .unwrap_or_else(|| PathBuf::from("stack.toml")),
        };
        Ok(Ctx {
            stack_path,
            stack_given,
            home,
            quiet: args.quiet,
        })
    }

    /// `stack.toml` -> `stack.lock`, `stacks/gpu-adopt.toml` -> `stacks/gpu-adopt.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.stack_path.with_extension("lock")
    }

    /// ` --stack FILE` when the stack was given, for the commands a message tells the user
    /// to run; empty when stack.toml is found by default.
    pub fn stack_flag(&self) -> String {
        match self.stack_given {
            true => format!(" --stack {}", self.stack_path.display()),
            false => String::new(),
        }
    }

    pub fn store_dir(&self) -> PathBuf {
        self.home.join("store")
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.home.join("cache")
    }

    /// A progress line on stderr, unless `--quiet`.
    pub fn say(&self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }
}

/// `stack.toml` in `cwd` or the nearest parent that has one, as a path relative to `cwd`
/// (`stack.toml`, `../stack.toml`, ...) so messages stay as short as the file is near.
fn find_stack_toml(cwd: &Path) -> Result<PathBuf> {
    let mut relative = PathBuf::new();
    for dir in cwd.ancestors() {
        if dir.join("stack.toml").is_file() {
            return Ok(relative.join("stack.toml"));
        }
        relative.push("..");
    }
    anyhow::bail!(
        "no stack.toml in {} or any parent directory: run from a commstack checkout, or pass --stack FILE",
        cwd.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stack_toml_is_found_in_the_nearest_parent() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("kernels/src");
        std::fs::create_dir_all(&deep).unwrap();
        assert!(find_stack_toml(&deep).is_err());
        std::fs::write(root.path().join("stack.toml"), "").unwrap();
        assert_eq!(
            find_stack_toml(&deep).unwrap(),
            Path::new("../../stack.toml")
        );
        assert_eq!(
            find_stack_toml(root.path()).unwrap(),
            Path::new("stack.toml")
        );
        std::fs::write(deep.join("stack.toml"), "").unwrap();
        assert_eq!(find_stack_toml(&deep).unwrap(), Path::new("stack.toml"));
    }
}
