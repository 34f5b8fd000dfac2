use std::process::ExitCode;

use anyhow::Result;

use crate::ctx::Ctx;

#[derive(clap::Subcommand)]
pub enum Command {
    /// List entries.
    Ls,
}

pub fn run(_ctx: &Ctx, _cmd: Command) -> Result<ExitCode> {
    anyhow::bail!("`cargo xtask store` is not implemented yet")
}
