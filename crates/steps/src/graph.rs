//! The stack's build graph: its steps and what each reads. The engine that keys, plans and
//! runs them is commstack-graph; the recipes are [`crate::stack_steps::StackSteps`].
//!
//! Three steps are not in the store because what they make lives elsewhere: `lock` (the
//! stack.lock file, handled before the graph by its caller), `fetch` (the download cache)
//! and `load` (the Docker engine). Verify and load run at the same time: verify reads the
//! image's layer tars on this machine while Docker loads the same image.

use serde::{Deserialize, Serialize};

pub use commstack_graph::{
    Change, Decision, Pulled, RESULT_FILE, Record, Selection as GraphSelection, Shipped, Status,
    StepResult, StoredResult, not_shipped, stored_result,
};

/// The engine's types over the stack's steps.
pub type Done = commstack_graph::Done<StepId>;
pub type Plan = commstack_graph::Plan<StepId>;
pub type Planned = commstack_graph::Planned<StepId>;
pub type Ran = commstack_graph::Ran<StepId>;
pub type RunReport = commstack_graph::RunReport<StepId>;
pub type Selection = commstack_graph::Selection<StepId>;
pub type Engine<'a> = commstack_graph::Engine<'a, StepId>;
pub use commstack_graph::Steps;

/// The steps, in an order where each comes after those it depends on ([`StepId::about`]
/// says what each does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepId {
    Lock,
    Fetch,
    Toolchain,
    NvshmemSource,
    Nvshmem,
    Dropin,
    Kernels,
    Deepep,
    Wheelhouse,
    Base,
    Image,
    Verify,
    Load,
    Runtime,
}

impl StepId {
    pub const ALL: [StepId; 14] = [
        StepId::Lock,
        StepId::Fetch,
        StepId::Toolchain,
        StepId::NvshmemSource,
        StepId::Nvshmem,
        StepId::Dropin,
        StepId::Kernels,
        StepId::Deepep,
        StepId::Wheelhouse,
        StepId::Base,
        StepId::Image,
        StepId::Verify,
        StepId::Load,
        StepId::Runtime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StepId::Lock => "lock",
            StepId::Fetch => "fetch",
            StepId::Toolchain => "toolchain",
            StepId::NvshmemSource => "nvshmem-source",
            StepId::Nvshmem => "nvshmem",
            StepId::Dropin => "dropin",
            StepId::Kernels => "kernels",
            StepId::Deepep => "deepep",
            StepId::Wheelhouse => "wheelhouse",
            StepId::Base => "base",
            StepId::Image => "image",
            StepId::Verify => "verify",
            StepId::Load => "load",
            StepId::Runtime => "runtime",
        }
    }

    /// What the step does, in a line (`--help` lists the steps with it).
    pub fn about(self) -> &'static str {
        match self {
            StepId::Lock => {
                "stack.toml resolved into stack.lock (resolved again when stale, unless --locked)"
            }
            StepId::Fetch => "Every locked artifact in the download cache",
            StepId::Toolchain => {
                "The locked CUDA toolchain, cmake and ninja, provisioned into the store"
            }
            StepId::NvshmemSource => {
                "NVSHMEM's locked source, unpacked and checked against its tree hash"
            }
            StepId::Nvshmem => "NVSHMEM built with NVSHMEM_USE_NCCL=OFF, proven",
            StepId::Dropin => {
                "The drop-in NVSHMEM wheel (replaces NVIDIA's under torch's pinned version)"
            }
            StepId::Kernels => {
                "The self-test (commstack-selftest) compiled against the stack's NVSHMEM"
            }
            StepId::Deepep => "DeepEP built into a wheel against the stack's NVSHMEM and torch",
            StepId::Wheelhouse => "The wheelhouse: every wheel the image installs",
            StepId::Base => "The image's base from the locked Debian packages (mmdebstrap)",
            StepId::Image => {
                "The image: base, venv, wheels, drop-in, DeepEP, tools, SBOM, provenance"
            }
            StepId::Verify => {
                "verify's static level on this machine, over the image's layer tars (no Docker)"
            }
            StepId::Load => "The image loaded into Docker under its tag",
            StepId::Runtime => {
                "What runs in the loaded image: `import torch` without GPUs; with --gpus, verify's runtime and selftest levels"
            }
        }
    }

    /// The step of this name (`nvshmem-source`), as [`StepId::name`] gives it.
    pub fn from_name(name: &str) -> Option<StepId> {
        StepId::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The steps this one reads the outputs of.
    pub fn deps(self) -> &'static [StepId] {
        use StepId::*;
        match self {
            Lock => &[],
            Fetch => &[Lock],
            Toolchain => &[Fetch],
            NvshmemSource => &[Fetch],
            Nvshmem => &[Toolchain, NvshmemSource],
            Dropin => &[Nvshmem],
            Kernels => &[Toolchain, Nvshmem],
            Deepep => &[Toolchain, Nvshmem, Dropin],
            Wheelhouse => &[Deepep, Dropin],
            Base => &[Fetch],
            Image => &[Base, Wheelhouse, Kernels],
            // The image's layer tars, read on this machine: no Docker, so it runs while
            // the image loads. The base's facts name the image's Python.
            Verify => &[Base, Image],
            Load => &[Image],
            // The image's key, not only Docker's copy: a new image is run again. After
            // verify: a statically broken image is not started.
            Runtime => &[Base, Image, Load, Verify],
        }
    }

    /// Whether the step may run at the same time as another: verify reads tars here while
    /// load is Docker's work. The compiling steps each use every core already (`-j` jobs),
    /// so two at once would gain nothing and mix their output.
    pub fn runs_beside_others(self) -> bool {
        matches!(self, StepId::Verify | StepId::Load)
    }

    /// Whether the step's output is a step of the store (keyed by its inputs).
    pub fn keyed(self) -> bool {
        !matches!(self, StepId::Lock | StepId::Fetch | StepId::Load)
    }

    /// `step` and every step it depends on, directly or not, in graph order.
    pub fn with_ancestors(self) -> Vec<StepId> {
        commstack_graph::with_ancestors(self)
    }
}

impl commstack_graph::StepId for StepId {
    const ALL: &'static [StepId] = &StepId::ALL;
    /// Graph steps are `pipeline-<step>-<hash>` in the store.
    const STORE_PREFIX: &'static str = "pipeline";

    fn name(self) -> &'static str {
        StepId::name(self)
    }
    fn deps(self) -> &'static [StepId] {
        StepId::deps(self)
    }
    fn keyed(self) -> bool {
        StepId::keyed(self)
    }
    fn runs_beside_others(self) -> bool {
        StepId::runs_beside_others(self)
    }
}

impl std::fmt::Display for StepId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
