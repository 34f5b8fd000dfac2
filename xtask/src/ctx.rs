//! Options every command shares, and the paths derived from them.

use std::path::PathBuf;

use anyhow::{Context, Result};

#[derive(clap::Args)]
pub struct GlobalArgs {
    /// The stack manifest to use; its lock is the file beside it with the `.lock` extension.
    #[arg(
        long,
        global = true,
        env = "COMMSTACK_STACK",
        default_value = "stack.toml"
    )]
    pub stack: PathBuf,
    /// Where commstack keeps its download cache and step store.
    /// Default: $XDG_CACHE_HOME/commstack (usually ~/.cache/commstack).
    #[arg(long, global = true, env = "COMMSTACK_HOME")]
    pub home: Option<PathBuf>,
    /// Print less: no progress bars, only results and errors.
    #[arg(long, short, global = true)]
    pub quiet: bool,
}

pub struct Ctx {
    pub stack_path: PathBuf,
    pub home: PathBuf,
    pub quiet: bool,
}

impl Ctx {
    pub fn new(args: GlobalArgs) -> Result<Ctx> {
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
        Ok(Ctx {
            stack_path: args.stack,
            home,
            quiet: args.quiet,
        })
    }

    /// `stack.toml` -> `stack.lock`, `stacks/bookworm.toml` -> `stacks/bookworm.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.stack_path.with_extension("lock")
    }

    pub fn store_dir(&self) -> PathBuf {
        self.home.join("store")
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.home.join("cache")
    }
}
