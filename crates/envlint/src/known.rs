//! The curated tables: NCCL's variables (made from its source, `nccl-2.30.7.txt`),
//! DeepEP's (its README's list), the launchers', and how NVSHMEM's run-time choices name
//! the build options they need.

/// How a library reads a variable's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reader {
    /// NVSHMEM's `nvshmemi_getenv_bool`: the first character decides.
    NvshmemBool,
    /// `strtol(s, &end, 0)` into an int (NVSHMEM's int).
    NvshmemInt,
    /// `strtol(s, &end, 0)` into a long (NVSHMEM's long).
    NvshmemLong,
    /// NVSHMEM's `nvshmemi_atol_scaled`: a number and a k/m/g/t multiplier.
    NvshmemSize,
    /// NCCL_PARAM: `strtoll(s, NULL, 0)`, silently 0 for text that is not a number.
    NcclInt,
    /// DeepEP's `int(os.environ[...])` / C++ `get_env<int>`: a whole decimal number,
    /// else ValueError at import.
    PythonInt,
    /// Text, optionally one of a list.
    Text,
}

/// Who reads a variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    Nvshmem,
    Nccl,
    DeepEp,
    Torch,
    Launcher,
    Commstack,
}

impl Owner {
    pub fn as_str(self) -> &'static str {
        match self {
            Owner::Nvshmem => "NVSHMEM",
            Owner::Nccl => "NCCL",
            Owner::DeepEp => "DeepEP",
            Owner::Torch => "torch",
            Owner::Launcher => "the launcher",
            Owner::Commstack => "commstack",
        }
    }
}

/// NCCL's table, `NAME KIND` lines (see the file's header for how it was made).
pub const NCCL_TABLE: &str = include_str!("nccl-2.30.7.txt");
pub const NCCL_TABLE_VERSION: &str = "2.30.7";

/// NCCL's variables from [`NCCL_TABLE`].
pub fn nccl() -> impl Iterator<Item = (&'static str, Reader)> {
    NCCL_TABLE
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (name, kind) = l.split_once(' ').expect("nccl table lines are NAME KIND");
            let reader = match kind {
                "int" => Reader::NcclInt,
                _ => Reader::Text,
            };
            (name, reader)
        })
}

/// NCCL_DEBUG's levels (NCCL's documentation; compared case-insensitively).
pub const NCCL_DEBUG_LEVELS: &[&str] = &["VERSION", "WARN", "INFO", "ABORT", "TRACE"];

/// DeepEP's run-time variables: README.md's "Environment variables" list of main
/// (dd758ca, 2.1.0), and what 567632d (V1) reads. (name, reader, what it does.)
pub const DEEPEP: &[(&str, Reader, &str)] = &[
    (
        "EP_BUFFER_DEBUG",
        Reader::PythonInt,
        "0 or 1: print buffer initialization and backend debugging",
    ),
    (
        "EP_SUPPRESS_NCCL_CHECK",
        Reader::PythonInt,
        "0 or 1: skip the check that the loaded libnccl is the one deep_ep was built against",
    ),
    (
        "EP_AVOID_RECORD_STREAM",
        Reader::PythonInt,
        "0 or 1: avoid record_stream on output tensors",
    ),
    (
        "EP_NUM_TOPK_IDX_BITS",
        Reader::PythonInt,
        "bits of the top-k index encoding (0: auto)",
    ),
    (
        "EP_NIC_NAME",
        Reader::Text,
        "the NIC queried for properties (default mlx5_0)",
    ),
    (
        "EP_OVERRIDE_RDMA_SL",
        Reader::PythonInt,
        "the RDMA service level index",
    ),
    (
        "EP_DISABLE_GIN",
        Reader::PythonInt,
        "0 or 1: disable the NCCL Gin backend",
    ),
    (
        "EP_JIT_DEBUG",
        Reader::PythonInt,
        "0 or 1: print JIT debugging information",
    ),
    (
        "EP_JIT_CACHE_DIR",
        Reader::Text,
        "where compiled kernels are cached (default $HOME/.deep_ep)",
    ),
    (
        "EP_JIT_NVCC_COMPILER",
        Reader::Text,
        "the nvcc JIT compiles with",
    ),
    (
        "EP_JIT_CPP_STANDARD",
        Reader::PythonInt,
        "the C++ standard of JIT kernels (20)",
    ),
    (
        "EP_JIT_PRINT_COMPILER_COMMAND",
        Reader::PythonInt,
        "0 or 1: print compile commands",
    ),
    (
        "EP_JIT_PTXAS_VERBOSE",
        Reader::PythonInt,
        "0 or 1: ptxas -v",
    ),
    (
        "EP_JIT_PTXAS_CHECK",
        Reader::PythonInt,
        "0 or 1: refuse kernels that use local memory",
    ),
    (
        "EP_JIT_WITH_LINEINFO",
        Reader::PythonInt,
        "0 or 1: embed line info",
    ),
    (
        "EP_JIT_DUMP_ASM",
        Reader::PythonInt,
        "0 or 1: dump PTX and SASS",
    ),
    ("EP_JIT_DUMP_PTX", Reader::PythonInt, "0 or 1: dump PTX"),
    ("EP_JIT_DUMP_SASS", Reader::PythonInt, "0 or 1: dump SASS"),
    (
        "EP_GIN_GDAKI_DEBUG",
        Reader::PythonInt,
        "0 or 1: NCCL Gin GDAKI debugging",
    ),
    (
        "EP_USE_NVIDIA_TOOLS",
        Reader::PythonInt,
        "0 or 1: skip internal profiling under NVIDIA's tools",
    ),
    (
        "EP_DISABLE_BARRIER_PROFILING",
        Reader::PythonInt,
        "0 or 1: no barrier profiling in benchmarks",
    ),
    (
        "EP_NUM_MAX_LOCAL_RANKS",
        Reader::PythonInt,
        "local ranks of the hybrid mode (16)",
    ),
    (
        "EP_REUSE_NCCL_COMM",
        Reader::PythonInt,
        "0 or 1: reuse torch's NCCL communicator (1)",
    ),
    // Read at import for the JIT's NCCL (a "persistent" variable baked in at build time,
    // overridable at run time).
    (
        "EP_NCCL_ROOT_DIR",
        Reader::Text,
        "the NCCL installation the JIT links against",
    ),
];

/// DeepEP's build-time variables: setup.py reads them while compiling; at run time they
/// do nothing.
pub const DEEPEP_BUILD: &[(&str, &str)] = &[
    (
        "NVSHMEM_DIR",
        "DeepEP's setup.py: the NVSHMEM to build against",
    ),
    (
        "EP_NVSHMEM_ROOT_DIR",
        "DeepEP's setup.py: the NVSHMEM to build against",
    ),
    (
        "DISABLE_SM90_FEATURES",
        "DeepEP's setup.py: compile without SM90 features",
    ),
    (
        "DISABLE_AGGRESSIVE_PTX_INSTRS",
        "DeepEP's setup.py: compile without the aggressive PTX loads",
    ),
    (
        "TOPK_IDX_BITS",
        "DeepEP's setup.py: the legacy name of EP_NUM_TOPK_IDX_BITS at build time",
    ),
];

/// What launchers and torch read (and `deploy render` sets), so they are known, not
/// "unknown": (name, owner, reader).
pub const OTHERS: &[(&str, Owner, Reader)] = &[
    ("MASTER_ADDR", Owner::Launcher, Reader::Text),
    ("MASTER_PORT", Owner::Launcher, Reader::PythonInt),
    ("WORLD_SIZE", Owner::Launcher, Reader::PythonInt),
    ("RANK", Owner::Launcher, Reader::PythonInt),
    ("LOCAL_RANK", Owner::Launcher, Reader::PythonInt),
    ("LOCAL_WORLD_SIZE", Owner::Launcher, Reader::PythonInt),
    ("NNODES", Owner::Launcher, Reader::PythonInt),
    ("NODE_RANK", Owner::Launcher, Reader::PythonInt),
    ("NPROC_PER_NODE", Owner::Launcher, Reader::PythonInt),
    ("PET_NNODES", Owner::Launcher, Reader::Text),
    ("PET_NODE_RANK", Owner::Launcher, Reader::PythonInt),
    ("PET_NPROC_PER_NODE", Owner::Launcher, Reader::Text),
    ("PET_MASTER_ADDR", Owner::Launcher, Reader::Text),
    ("PET_MASTER_PORT", Owner::Launcher, Reader::PythonInt),
    ("LWS_LEADER_ADDRESS", Owner::Launcher, Reader::Text),
    ("LWS_GROUP_SIZE", Owner::Launcher, Reader::PythonInt),
    ("LWS_WORKER_INDEX", Owner::Launcher, Reader::PythonInt),
    ("COMMSTACK_RDZV_ADDR", Owner::Commstack, Reader::Text),
    ("CUDA_VISIBLE_DEVICES", Owner::Torch, Reader::Text),
    ("CUDA_HOME", Owner::Torch, Reader::Text),
    ("CUDA_PATH", Owner::Torch, Reader::Text),
    ("TORCH_CUDA_ARCH_LIST", Owner::Torch, Reader::Text),
    (
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        Owner::Nvshmem,
        Reader::PythonInt,
    ),
    // torch still reads these old names (with a deprecation warning) as TORCH_NCCL_*.
    ("NCCL_ASYNC_ERROR_HANDLING", Owner::Torch, Reader::PythonInt),
    ("NCCL_BLOCKING_WAIT", Owner::Torch, Reader::PythonInt),
    ("NCCL_DESYNC_DEBUG", Owner::Torch, Reader::PythonInt),
    ("NCCL_ENABLE_TIMING", Owner::Torch, Reader::PythonInt),
    // DeepEP's V2 buffer reads it (elastic.py); NCCL itself does not.
    ("NCCL_GIN_CROSS_NIC", Owner::DeepEp, Reader::PythonInt),
];

/// Prefixes whose names envlint judges: any name under them must be known.
pub const PREFIXES: &[&str] = &["NVSHMEM_", "NCCL_", "EP_", "UCX_"];

/// A run-time choice that needs a build option: `(variable, value, stack.toml [nvshmem]
/// key)`, value compared case-insensitively as NVSHMEM does (strncasecmp in
/// transport.cpp, strcmp_case_insensitive in bootstrap.cpp of 3.4.5).
pub const SELECTORS: &[(&str, &str, &str)] = &[
    ("NVSHMEM_REMOTE_TRANSPORT", "ibrc", "ibrc"),
    ("NVSHMEM_REMOTE_TRANSPORT", "ucx", "ucx"),
    ("NVSHMEM_REMOTE_TRANSPORT", "libfabric", "libfabric"),
    ("NVSHMEM_REMOTE_TRANSPORT", "ibdevx", "ibdevx"),
    ("NVSHMEM_BOOTSTRAP", "MPI", "mpi"),
    ("NVSHMEM_BOOTSTRAP", "SHMEM", "shmem"),
    ("NVSHMEM_BOOTSTRAP_PMI", "PMIX", "pmix"),
];

/// Variables read only by a transport's own library or code: `(exact name, or a prefix
/// ending in '_', stack.toml [nvshmem] key, who reads it)`.
pub const TRANSPORT_VARIABLES: &[(&str, &str, &str)] = &[
    (
        "UCX_",
        "ucx",
        "UCX (its own variables; NVSHMEM's UCX transport loads it)",
    ),
    (
        "NVSHMEM_LIBFABRIC_PROVIDER",
        "libfabric",
        "NVSHMEM's libfabric transport",
    ),
];
