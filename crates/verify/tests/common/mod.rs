//! Test fixtures built from real parts (gcc-built shared objects from testkit's `native`):
//! fake site-packages trees holding torch, NCCL, NVSHMEM and DeepEP look-alikes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub use commstack_testkit::native::*;

/// A fake site-packages: nvidia/nccl/lib/libnccl.so.2 answering `nccl_code`,
/// nvidia/nvshmem/lib/libnvshmem_host.so.3 with `NVSHMEM_USE_NCCL=<use_nccl>`, and a
/// `torch` package whose torch/lib/libtorch_fake.so needs both through an RPATH like
/// torch's wheel, loaded by torch/__init__.py.
pub fn fake_site(root: &Path, use_nccl: &str, nccl_code: u32) -> PathBuf {
    let site = root.join("site-packages");
    nccl_lib(&site.join("nvidia/nccl/lib"), nccl_code);
    shared_lib(
        &site.join("nvidia/nvshmem/lib"),
        "libnvshmem_host.so.3",
        "libnvshmem_host.so.3",
        &nvshmem_like_source(use_nccl, "3.4.5", ""),
        &[],
    );
    let torch_lib = site.join("torch/lib");
    let nccl_dir = site.join("nvidia/nccl/lib");
    let nvshmem_dir = site.join("nvidia/nvshmem/lib");
    let l_nccl = format!("-L{}", nccl_dir.display());
    let l_nvshmem = format!("-L{}", nvshmem_dir.display());
    shared_lib(
        &torch_lib,
        "libtorch_fake.so",
        "libtorch_fake.so",
        "int torch_fake(void) { return 0; }",
        &[
            &l_nccl,
            &l_nvshmem,
            "-Wl,--no-as-needed",
            "-l:libnccl.so.2",
            "-l:libnvshmem_host.so.3",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib:$ORIGIN/../../nvidia/nvshmem/lib",
        ],
    );
    std::fs::write(
        site.join("torch/__init__.py"),
        r#"
import ctypes as _ctypes, os as _os
_ctypes.CDLL(_os.path.join(_os.path.dirname(__file__), "lib", "libtorch_fake.so"), mode=_ctypes.RTLD_GLOBAL)
__version__ = "2.11.0+fake"
class version:
    cuda = "13.0"
class cuda:
    class nccl:
        @staticmethod
        def version():
            return (2, 28, 9)
"#,
    )
    .unwrap();
    site
}

/// An NCCL look-alike answering `ncclGetVersion` with `code`, with the version string
/// NCCL's own library carries in .rodata (`NCCL version 2.28.9+cuda13.0`).
pub fn nccl_lib(dir: &Path, code: u32) -> PathBuf {
    let v = commstack_verify::NcclVersion::from_code(code.into()).unwrap();
    shared_lib(
        dir,
        "libnccl.so.2",
        "libnccl.so.2",
        &format!(
            "int ncclGetVersion(int *v) {{ *v = {code}; return 0; }}\n\
             __attribute__((used)) const char nccl_version_string[] = \"NCCL version {v}+cuda13.0\";"
        ),
        &[],
    )
}

/// `deep_ep` that loads `lib` (absolute path) when imported.
pub fn fake_deep_ep(site: &Path, lib: Option<&Path>) {
    let dir = site.join("deep_ep");
    std::fs::create_dir_all(&dir).unwrap();
    let load = match lib {
        Some(l) => format!(
            "import ctypes\nctypes.CDLL({:?}, mode=ctypes.RTLD_GLOBAL)\n",
            l.display().to_string()
        ),
        None => String::new(),
    };
    std::fs::write(
        dir.join("__init__.py"),
        format!("import torch\n{load}__version__ = '1.2.1+fake'\n"),
    )
    .unwrap();
}
