//! The NVSHMEM build options, one field per CMake option (as Spack's package does), and
//! their mapping to `-D` arguments. The lead maps stack.toml onto [`NvshmemOptions`].

use std::path::PathBuf;

use anyhow::{Result, bail};
use commstack_stack::CudaArch;
use commstack_stack::switches::SWITCHES;
use serde::{Deserialize, Serialize};

use crate::switches::Switches;

/// Every NVSHMEM option a stack can choose. The defaults are DeepEP's documented flags
/// (IBGDA on; SHMEM, UCX, NCCL, PMIX, GDRCOPY, IBRC, MPI off) with sm_90.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvshmemOptions {
    /// Must stay false: torch loads one NVSHMEM per process, and an NCCL-enabled one
    /// dlopens libnccl.so.2, pulling a second NCCL next to torch's.
    pub use_nccl: bool,
    /// `CMAKE_CUDA_ARCHITECTURES` entries, e.g. `["90"]` or `["90-real", "100-real"]`
    /// (the grammar is [`commstack_stack::arch`]'s, as in stack.toml).
    pub cuda_archs: Vec<CudaArch>,
    /// The ON/OFF options (IBGDA, the transports and bootstraps with their prefixes,
    /// MLX5DV, NVTX, the device-ABI and debug options), one per row of the stack's
    /// switch table; flattened, so the JSON has one field per option as before. It also
    /// refuses unknown fields, which `deny_unknown_fields` cannot do beside a flatten.
    #[serde(flatten)]
    pub switches: Switches,
    /// A prefix holding rdma-core's headers and libmlx5 (`/`, `/usr`, or a `dpkg -x`
    /// tree of libibverbs-dev + ibverbs-providers). Needed by IBGDA, IBRC and IBDEVX.
    pub rdma_core: Option<PathBuf>,
    /// Build libnvshmem_device.bc (torch's Triton NVSHMEM kernels load it). Needs an LLVM
    /// with clang, opt, llvm-dis, llvm-as and ClangConfig.cmake: its install prefix here.
    pub bitcode_llvm: Option<PathBuf>,
    /// Also build the static `libnvshmem.a`, `nvshmem-info` and the CMake package, with
    /// NVSHMEM's own install rules. NVIDIA's wheel ships none of them, and the static
    /// library compiles every source a second time (about a third of the build), so the
    /// default builds only the wheel's set (see `wheelset`). Not a CMake option.
    pub static_lib: bool,
}

impl Default for NvshmemOptions {
    fn default() -> Self {
        NvshmemOptions {
            use_nccl: false,
            cuda_archs: vec!["90".parse().expect("90 is a CUDA arch")],
            switches: Switches::default(),
            rdma_core: None,
            bitcode_llvm: None,
            static_lib: false,
        }
    }
}

pub use commstack_stack::switches::FIXED_OFF;

/// Where the unused `*_HOME` paths point: nothing, visibly.
pub const UNUSED_HOME: &str = "/nonexistent/commstack-unused";

fn on(b: bool) -> String {
    if b { "ON" } else { "OFF" }.to_string()
}

impl NvshmemOptions {
    /// Refuse what the stack must never build, with the reason.
    pub fn validate(&self) -> Result<()> {
        if self.use_nccl {
            bail!(
                "NVSHMEM_USE_NCCL=ON is refused: an NVSHMEM built with NCCL dlopens libnccl.so.2 at run time, \
                 which loads a second NCCL beside torch's (or the wrong one) in the same process, and torch maps one \
                 NVSHMEM per process. DeepEP does not need NVSHMEM's NCCL collectives; set use_nccl = false"
            );
        }
        if self.cuda_archs.is_empty() {
            bail!(
                "cuda_archs is empty: name the GPUs to build for (90 for H100/H200); NVSHMEM's own default builds 6 archs and takes many times longer"
            );
        }
        let on = |key| self.switches.is_on(key);
        if on("ibgda-gpumem-only") && !on("ibgda") {
            bail!("ibgda_gpumem_only needs ibgda = true");
        }
        if on("shmem") && !on("mpi") {
            bail!(
                "the SHMEM bootstrap needs MPI (NVSHMEM's SHMEM_HOME defaults to MPI_HOME): set mpi too"
            );
        }
        Ok(())
    }

    /// The CMAKE_CUDA_ARCHITECTURES value.
    pub fn cuda_architectures(&self) -> String {
        let entries: Vec<String> = self.cuda_archs.iter().map(CudaArch::cmake).collect();
        entries.join(";")
    }

    /// The architectures that get SASS (every entry but `-virtual`), as numbers.
    pub fn sass_archs(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .cuda_archs
            .iter()
            .filter(|a| a.has_sass())
            .map(CudaArch::sm)
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn needs_rdma_core(&self) -> bool {
        ["ibgda", "ibrc", "ibdevx"]
            .into_iter()
            .any(|key| self.switches.is_on(key))
    }

    /// Every NVSHMEM_* option of NVSHMEM's CMake, ON or OFF, in one map: what the
    /// build-variable string must show and what is passed with `-D`.
    pub fn nvshmem_switches(&self) -> Vec<(String, String)> {
        let mut v: Vec<(&str, bool)> = vec![("NVSHMEM_USE_NCCL", self.use_nccl)];
        v.extend(
            SWITCHES
                .iter()
                .map(|s| (s.cmake, self.switches.is_on(s.key))),
        );
        v.push(("NVSHMEM_BUILD_BITCODE_LIBRARY", self.bitcode_llvm.is_some()));
        v.extend(FIXED_OFF.iter().map(|k| (*k, false)));
        v.into_iter().map(|(k, b)| (k.to_string(), on(b))).collect()
    }

    /// The `*_HOME` paths: the given prefix when the transport is on, else
    /// [`UNUSED_HOME`]`/<name>` so the build-variable string shows nothing was used.
    pub fn homes(&self) -> Vec<(String, String)> {
        let unused = |name: &str| {
            let package = name.trim_end_matches("_HOME").to_ascii_lowercase();
            format!("{UNUSED_HOME}/{package}")
        };
        let mut v: Vec<(String, String)> = SWITCHES
            .iter()
            .filter_map(|s| {
                let name = s.home?;
                let value = match self.switches.home(s.key) {
                    Some(p) => p.display().to_string(),
                    None => unused(name),
                };
                Some((name.to_string(), value))
            })
            .collect();
        // NCCL is never built against (NVSHMEM_USE_NCCL is refused) but has a home too.
        v.push(("NCCL_HOME".into(), unused("NCCL_HOME")));
        v.sort();
        v
    }
}

impl NvshmemOptions {
    /// stack.toml's `[nvshmem]` section, option by option. The transports and bootstraps
    /// that build against another installed package (UCX, libfabric, GDRCopy, MPI, SHMEM,
    /// PMIx) need that package's prefix: `homes` maps the stack key (`"ucx"`) to it.
    /// `rdma_core` is where rdma-core's headers are (IBGDA, IBRC, IBDEVX).
    pub fn from_stack(
        n: &commstack_stack::manifest::Nvshmem,
        homes: &std::collections::BTreeMap<String, PathBuf>,
        rdma_core: Option<PathBuf>,
    ) -> Result<NvshmemOptions> {
        let home = |key: &str, on: bool| -> Result<Option<PathBuf>> {
            match (on, homes.get(key)) {
                (false, _) => Ok(None),
                (true, Some(p)) => Ok(Some(p.clone())),
                (true, None) => bail!(
                    "stack.toml sets nvshmem.{key} = true, which builds against an installed {key}: \
                     give its prefix with `--with {key}=PREFIX`, or set nvshmem.{key} = false \
                     (commstack does not provision {key} itself)"
                ),
            }
        };
        let mut switches = Switches::default();
        for (s, on) in n.transports.iter() {
            match s.home {
                None => switches.set(s.key, on),
                Some(_) => switches.set_home(s.key, home(s.key, on)?),
            }
        }
        Ok(NvshmemOptions {
            cuda_archs: n.cuda_archs.clone(),
            switches,
            rdma_core,
            static_lib: n.static_lib,
            ..NvshmemOptions::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_on_is_refused_with_the_reason() {
        let o = NvshmemOptions {
            use_nccl: true,
            ..Default::default()
        };
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.contains("libnccl.so.2") && e.contains("use_nccl = false"),
            "{e}"
        );
    }

    #[test]
    fn defaults_are_deepeps_flags() {
        let o = NvshmemOptions::default();
        o.validate().unwrap();
        let s: std::collections::BTreeMap<_, _> = o.nvshmem_switches().into_iter().collect();
        assert_eq!(s["NVSHMEM_USE_NCCL"], "OFF");
        assert_eq!(s["NVSHMEM_IBGDA_SUPPORT"], "ON");
        for off in [
            "NVSHMEM_SHMEM_SUPPORT",
            "NVSHMEM_UCX_SUPPORT",
            "NVSHMEM_PMIX_SUPPORT",
            "NVSHMEM_USE_GDRCOPY",
            "NVSHMEM_IBRC_SUPPORT",
            "NVSHMEM_MPI_SUPPORT",
            "NVSHMEM_BUILD_TESTS",
            "NVSHMEM_BUILD_EXAMPLES",
            "NVSHMEM_BUILD_PYTHON_LIB",
            "NVSHMEM_BUILD_HYDRA_LAUNCHER",
            "NVSHMEM_BUILD_TXZ_PACKAGE",
        ] {
            assert_eq!(s[off], "OFF", "{off}");
        }
        assert_eq!(o.cuda_architectures(), "90");
        assert!(
            o.homes()
                .iter()
                .any(|(k, v)| k == "NCCL_HOME" && v == "/nonexistent/commstack-unused/nccl")
        );
    }

    /// The switches read back from JSON as the named fields were: missing ones keep
    /// their default, a prefix turns a home switch on, unknown (or fixed) keys fail.
    #[test]
    fn switches_json_reads_like_the_named_fields() {
        let o: NvshmemOptions = serde_json::from_str(
            r#"{"ucx": "/opt/ucx", "nvtx": false, "ibgda_gpumem_only": true}"#,
        )
        .unwrap();
        assert!(o.switches.is_on("ibgda") && o.switches.is_on("ibgda-gpumem-only"));
        assert!(o.switches.is_on("ucx") && !o.switches.is_on("nvtx"));
        assert_eq!(
            o.switches.home("ucx"),
            Some(std::path::Path::new("/opt/ucx"))
        );
        let back: NvshmemOptions =
            serde_json::from_value(serde_json::to_value(&o).unwrap()).unwrap();
        assert_eq!(back, o);
        for bad in [r#"{"bogus": true}"#, r#"{"default_pmix": false}"#] {
            let e = serde_json::from_str::<NvshmemOptions>(bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("unknown field"), "{bad}: {e}");
        }
    }

    /// The shared grammar's pinned entries, as CMAKE_CUDA_ARCHITECTURES and as the SASS
    /// the proof expects; "9x0" cannot even be an option (the type refuses it).
    #[test]
    fn archs_render_for_cmake_and_the_proof() {
        let archs =
            |list: &[&str]| -> Vec<CudaArch> { list.iter().map(|a| a.parse().unwrap()).collect() };
        let o = NvshmemOptions {
            cuda_archs: archs(&["90", "90a", "100f", "90-real"]),
            ..Default::default()
        };
        o.validate().unwrap();
        assert_eq!(o.cuda_architectures(), "90;90a;100f;90-real");
        assert_eq!(o.sass_archs(), vec![90, 100]);
        let o = NvshmemOptions {
            cuda_archs: archs(&["90-real", "100-virtual", "120"]),
            ..Default::default()
        };
        assert_eq!(o.sass_archs(), vec![90, 120]);
        let json = r#"{"cuda_archs": ["9x0"]}"#;
        let e = serde_json::from_str::<NvshmemOptions>(json).unwrap_err();
        assert!(
            e.to_string().contains("\"9x0\" is not a CUDA architecture"),
            "{e}"
        );
    }
}
