//! The one settings resolver: the stack, its lock (refused when stale) and the command
//! line's overrides, merged once for every build command and every step of the graph.

use std::path::PathBuf;

use anyhow::{Context, Result};
use commstack_nvshmem::NvshmemOptions;
use commstack_stack::rules::{self, RuleId};
use commstack_stack::{CudaArch, Lock, Stack};

use crate::ctx::Ctx;
use crate::options::BuildOptions;

/// What a build is asked to do, resolved.
pub struct Settings {
    pub stack: Stack,
    pub lock: Lock,
    /// sha256 of stack.lock's bytes (the image records it; its tag is made from it).
    pub lock_sha256: String,
    /// CUDA archs for NVSHMEM, the self-test and DeepEP: `--cuda-archs`, else stack.toml's.
    pub cuda_archs: Vec<CudaArch>,
    /// Parallel compile jobs: `--jobs`, else the CPU count.
    pub jobs: usize,
    /// NVSHMEM's options: stack.toml's, with `--cuda-archs`, `--no-ibgda`, `--static-lib`,
    /// `--rdma-core` and `--with` applied.
    pub nvshmem: NvshmemOptions,
    /// The environment variables NVSHMEM's build keeps (stack.toml's pass-env and
    /// `--keep-env`), with their values.
    pub passthrough: std::collections::BTreeMap<String, String>,
    /// The version torch pins for NVSHMEM (`--torch-pin`, else the lock's).
    pub torch_pin: Option<String>,
    /// The one NCCL the environment and the image must hold: the lock's, torch's pin or
    /// stack.toml's `[nccl] version` override of it (verify's static.nccl.one checks it).
    pub nccl: commstack_stack::Pin,
    /// Waivers: the flag, or the rule's id in stack.toml's `resolve.allow`.
    pub allow_version_mismatch: bool,
    pub allow_missing_rdc_fix: bool,
    pub allow_second_nccl: bool,
    /// What the overrides changed, said once.
    pub notes: Vec<String>,
}

impl Settings {
    /// Reads stack.toml and its lock (a stale lock is an error naming what changed) and
    /// applies the command line's overrides.
    pub fn resolve(ctx: &Ctx, args: &BuildOptions) -> Result<Settings> {
        let stack = crate::util::read_stack(&ctx.stack_path)?;
        let lock = crate::flow::lock::read_lock(ctx)?;
        let lock_path = ctx.lock_path();
        let lock_sha256 = commstack_digest::sha256_file(&lock_path)
            .with_context(|| format!("hashing {}", lock_path.display()))?;
        let mut notes = Vec::new();
        let homes = args.with.iter().cloned().collect();
        let mut nvshmem =
            NvshmemOptions::from_stack(&stack.nvshmem, &homes, args.rdma_core.clone())?;
        let cuda_archs = match args.cuda_archs.is_empty() {
            true => stack.nvshmem.cuda_archs.clone(),
            false => {
                notes.push("--cuda-archs overrides stack.toml's nvshmem.cuda-archs".into());
                args.cuda_archs.clone()
            }
        };
        nvshmem.cuda_archs = cuda_archs.clone();
        if args.no_ibgda {
            notes.push("--no-ibgda overrides stack.toml's nvshmem.ibgda".into());
            nvshmem.switches.set("ibgda", false);
        }
        if args.static_lib && !nvshmem.static_lib {
            notes.push("--static-lib overrides stack.toml's nvshmem.static-lib".into());
            nvshmem.static_lib = true;
        }
        let passthrough = commstack_nvshmem::env::resolve_passthrough(
            &stack
                .nvshmem
                .pass_env
                .iter()
                .chain(&args.keep_env)
                .cloned()
                .collect::<Vec<_>>(),
        )?;
        let torch_pin = args.torch_pin.clone().or_else(|| {
            lock.resolved
                .nvshmem_pin
                .as_ref()
                .map(|p| p.version.to_string())
        });
        let nccl = lock.resolved.nccl.clone();
        if let Some(o) = &lock.resolved.nccl_override {
            notes.push(format!(
                "[nccl] version: the environment holds {nccl}, not torch's pin {} ({})",
                o.torch_pin,
                lock_path.display()
            ));
        }
        let allowed = |rule| stack.is_allowed(rule);
        Ok(Settings {
            allow_version_mismatch: args.allow_version_mismatch
                || allowed(RuleId::NvshmemMatchesTorch),
            allow_missing_rdc_fix: allowed(RuleId::DeepEpV1RdcFix),
            allow_second_nccl: args.deepep.allow_second_nccl || allowed(RuleId::DeepEpV2Nccl),
            jobs: args
                .jobs
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get())),
            stack,
            lock,
            lock_sha256,
            cuda_archs,
            nvshmem,
            passthrough,
            torch_pin,
            nccl,
            notes,
        })
    }

    /// The Python interpreter NVSHMEM's CMake needs: `--python3`, else python3 on PATH.
    pub fn python3(args: &BuildOptions) -> Result<PathBuf> {
        match &args.python3 {
            Some(p) => Ok(p.clone()),
            None => commstack_toolchain::find_in_path("python3", None).context(
                "NVSHMEM's CMake requires a Python interpreter: no python3 on PATH (pass --python3)",
            ),
        }
    }

    /// Prints the notes (once per command).
    pub fn print_notes(&self) {
        for note in &self.notes {
            crate::out!("note: {note}");
        }
    }

    /// Refuses, before anything is built, a DeepEP build on an NVSHMEM without IBGDA
    /// (`--no-ibgda`; stack.toml's own `ibgda = false` is refused by `lock`): rule
    /// `deepep-needs-ibgda`, unless `resolve.allow` names it.
    pub fn check_deepep_needs(&self) -> Result<()> {
        let rule = RuleId::DeepEpNeedsIbgda;
        if self.nvshmem.switches.is_on("ibgda") || self.stack.is_allowed(rule) {
            return Ok(());
        }
        anyhow::bail!(
            "{} [rule {}]. Ways out: {}. Why: {}",
            rules::deepep_without_ibgda(&self.stack.deepep.rev),
            rule.as_str(),
            rules::ibgda_ways_out(),
            rule.reason()
        )
    }

    /// What the drop-in NVSHMEM wheel is named and versioned as, for torch's pin `pin`:
    /// one place for the build command and the graph's steps.
    pub fn dropin_spec(&self, pin: String) -> commstack_nvshmem::DropInSpec {
        commstack_nvshmem::DropInSpec {
            cuda_major: self.stack.torch.cuda_major as u32,
            torch_pin: pin,
            allow_version_mismatch: self.allow_version_mismatch,
        }
    }
}
