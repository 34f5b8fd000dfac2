//! `cargo xtask envlint FILE...`: any env file, script or manifest checked against the
//! stack's build (its `[nvshmem]` switches and the locked NVSHMEM source), as `render`
//! checks its own output.

use std::path::PathBuf;

use anyhow::{Context, Result};
use commstack_envlint::{Build, Catalog, Finding};
use commstack_stack::Stack;

pub struct LintRequest {
    pub stack_path: PathBuf,
    pub lock_path: PathBuf,
    pub cache_dir: PathBuf,
    pub nvshmem_source: Option<PathBuf>,
    pub files: Vec<PathBuf>,
    pub stack_flag: String,
}

pub struct LintReport {
    pub findings: Vec<Finding>,
    pub settings: usize,
    pub nvshmem_source: PathBuf,
}

pub fn lint_files(req: &LintRequest) -> Result<LintReport> {
    let text = std::fs::read_to_string(&req.stack_path).with_context(|| {
        format!(
            "cannot read the stack manifest {} (pick one with --stack FILE)",
            req.stack_path.display()
        )
    })?;
    let stack = Stack::parse(&req.stack_path, &text).map_err(|d| anyhow::anyhow!("{d}"))?;
    let source = match &req.nvshmem_source {
        Some(p) => p.clone(),
        None => {
            let lock = crate::read_fresh_lock(&req.lock_path, &stack, &req.stack_flag)?;
            crate::locate::locked_nvshmem_archive(&lock, &req.lock_path, &req.cache_dir)?
        }
    };
    let tables = commstack_envlint::source::read(&source)
        .with_context(|| format!("reading NVSHMEM's variables from {}", source.display()))?;
    let catalog = Catalog::new(&tables, Build::from_transports(&stack.nvshmem.transports));
    let mut settings = Vec::new();
    for f in &req.files {
        settings.extend(commstack_envlint::read_file(f)?);
    }
    Ok(LintReport {
        findings: commstack_envlint::lint(&catalog, &settings),
        settings: settings.len(),
        nvshmem_source: source,
    })
}
