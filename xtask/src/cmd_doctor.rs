use std::process::ExitCode;

use anyhow::Result;

use crate::ctx::Ctx;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_ctx: &Ctx, _args: Args) -> Result<ExitCode> {
    anyhow::bail!("`cargo xtask doctor` is not implemented yet")
}
