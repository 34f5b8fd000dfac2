//! `cargo xtask store ls|gc`: the step store (content-addressed build outputs).

use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use commstack_store::{GcOptions, Store};

use commstack_steps::ctx::Ctx;
use commstack_steps::util::human;

#[derive(clap::Subcommand)]
pub enum Command {
    /// List every complete step: name, input hash, size, age, last use, and UNSIGNED for a
    /// step that entered without a trusted signature (a binary cache's output taken with
    /// `build --allow-unsigned`).
    Ls {
        /// Print JSON (one object per step, with the inputs it was built from).
        #[arg(long)]
        json: bool,
    },
    /// Remove abandoned temporary directories, failed attempts and, with --unused-days,
    /// steps not used for that many days; with --unsigned, the steps that entered without a
    /// trusted signature.
    Gc {
        /// Also remove complete steps not used for this many days (0: every step).
        #[arg(long, value_name = "DAYS")]
        unused_days: Option<u64>,
        /// Also remove every step that entered without a trusted signature (taken from a
        /// binary cache with `build --allow-unsigned`): the next build makes them again,
        /// here or pulled signed.
        #[arg(long)]
        unsigned: bool,
        /// Show what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn run(ctx: &Ctx, cmd: Command) -> Result<ExitCode> {
    let store = Store::open(ctx.store_dir())?;
    match cmd {
        Command::Ls { json } => ls(&store, json),
        Command::Gc {
            unused_days,
            unsigned,
            dry_run,
        } => {
            let opts = GcOptions {
                unused_for: unused_days.map(|d| Duration::from_secs(d * 86_400)),
                keep: Vec::new(),
                unsigned,
                dry_run,
            };
            let report = store.gc(&opts)?;
            let verb = if dry_run { "would remove" } else { "removed" };
            for (path, bytes) in &report.removed {
                println!("{verb} {} ({})", path.display(), human(*bytes));
            }
            for path in &report.kept_in_use {
                println!("kept {} (a build is running)", path.display());
            }
            println!(
                "{verb} {} entries, {}",
                report.removed.len(),
                human(report.bytes())
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn ls(store: &Store, json: bool) -> Result<ExitCode> {
    let steps = store.list()?;
    if json {
        let rows: Vec<serde_json::Value> = steps
            .iter()
            .map(|s| {
                serde_json::json!({
                    "path": s.path,
                    "bytes": s.bytes,
                    "meta": s.meta,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    if steps.is_empty() {
        println!("the store {} is empty", store.root().display());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<24} {:<18} {:>10} {:>10} {:>10}",
        "STEP", "INPUTS", "SIZE", "BUILT", "USED"
    );
    let now = SystemTime::now();
    for s in &steps {
        let name = s.path.file_name().unwrap_or_default().to_string_lossy();
        match &s.meta {
            Some(m) => {
                let built = jiff::Timestamp::now().duration_since(m.created);
                let used = s.last_used.and_then(|t| now.duration_since(t).ok());
                println!(
                    "{:<24} {:<18} {:>10} {:>10} {:>10}{}",
                    m.step,
                    &m.hash[..16],
                    human(s.bytes),
                    ago(built.as_secs().max(0) as u64),
                    used.map(|d| ago(d.as_secs())).unwrap_or_else(|| "-".into()),
                    match &m.unsigned {
                        Some(why) => format!("  UNSIGNED: {why}"),
                        None => String::new(),
                    }
                );
            }
            None => println!(
                "{name:<43} {:>10}  (no metadata: damaged; `store gc --unused-days 0` removes it)",
                human(s.bytes)
            ),
        }
    }
    let unsigned = steps
        .iter()
        .filter(|s| s.meta.as_ref().is_some_and(|m| m.unsigned.is_some()))
        .count();
    if unsigned > 0 {
        println!(
            "{unsigned} steps entered without a trusted signature (UNSIGNED): builds reuse them only with --allow-unsigned; `cargo xtask store gc --unsigned` removes them"
        );
    }
    let total: u64 = steps.iter().map(|s| s.bytes).sum();
    println!(
        "{} steps, {} in {}",
        steps.len(),
        human(total),
        store.root().display()
    );
    Ok(ExitCode::SUCCESS)
}

fn ago(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86_400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86_400),
    }
}
