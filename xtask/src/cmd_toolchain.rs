//! `cargo xtask toolchain`: provision the locked CUDA compiler wheels, cmake and ninja
//! into the step store (or describe this machine's CUDA with `--system`).

use std::process::ExitCode;

use anyhow::Result;

use commstack_steps::ctx::Ctx;
use commstack_steps::flow::toolchain::resolve;

use crate::args::ToolchainArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub toolchain: ToolchainArgs,
    /// Unpack and check again even if the store has it.
    #[arg(long)]
    pub force: bool,
    /// Print the toolchain as JSON (paths and versions).
    #[arg(long)]
    pub json: bool,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<ExitCode> {
    let tc = resolve(ctx, &args.toolchain.into(), args.force, &|l| ctx.say(l))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&tc)?);
    } else {
        println!("toolchain: {}", tc.describe());
        println!("  CUDA_HOME  {}", tc.cuda_home.display());
        println!("  nvcc       {}", tc.nvcc.display());
        println!("  cudart     {}", tc.cudart_lib_dir.display());
        for d in &tc.cuda_include_dirs {
            println!("  include    {}", d.display());
        }
        println!("  cmake      {}", tc.cmake.display());
        println!("  ninja      {}", tc.ninja.display());
    }
    Ok(ExitCode::SUCCESS)
}
