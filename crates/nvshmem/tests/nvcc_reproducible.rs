//! nvcc's module id (issue 17). cudafe++ names a unit's module id after its first
//! host-visible external function or variable; NVSHMEM's `transfer_device.cu` has none
//! (templates, and definitions under `#ifdef __CUDA_ARCH__`), so without a seed the id is
//! a hash of the time and the process id and no two builds of it are the same. This
//! compiles such a unit twice at one path with the recipe's flags (identical objects) and
//! with `-objtemp` alone (different objects: the seed is what fixes it).
//!
//! It needs nvcc, so it is ignored in the plain workspace run; `cargo xtask build kernels
//! --test` (CI's CUDA step) runs it with COMMSTACK_NVCC set to the locked toolchain's nvcc.

use std::path::Path;
use std::process::Command;

use commstack_nvshmem::REPRODUCIBLE_NVCC_FLAGS;

/// Like transfer_device.cu: nothing the host pass can name the module after.
const UNIT: &str = r#"
#ifdef __CUDA_ARCH__
__device__ __noinline__ void update_mem() { __threadfence(); }
#endif
template <typename T> __device__ __noinline__ T rma_g(const T *p) { return *p; }
template __device__ int rma_g<int>(const int *);
"#;

/// Compiles `unit.cu` in `dir` to `unit.o` with NVCC_APPEND_FLAGS set to `flags`; the
/// object's bytes and its `__fatbinwrap_` symbol (where the module id shows).
fn compile(nvcc: &Path, dir: &Path, flags: &str) -> (Vec<u8>, String) {
    let out = Command::new(nvcc)
        .current_dir(dir)
        .env("NVCC_APPEND_FLAGS", flags)
        .env_remove("NVCC_PREPEND_FLAGS")
        .args(["-rdc=true", "-c", "unit.cu", "-o", "unit.o"])
        .output()
        .expect("run nvcc");
    assert!(
        out.status.success(),
        "nvcc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(dir.join("unit.o")).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let wrap = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|s| s.starts_with("__fatbinwrap_"))
        .unwrap_or_else(|| panic!("no __fatbinwrap_ symbol in the object ({flags})"))
        .to_string();
    (bytes, wrap)
}

#[test]
#[ignore = "needs nvcc: `cargo xtask build kernels --test` runs it with COMMSTACK_NVCC set"]
fn a_unit_with_no_host_entity_gets_a_seeded_module_id() {
    let nvcc = std::env::var_os("COMMSTACK_NVCC")
        .expect("COMMSTACK_NVCC is not set: run this through `cargo xtask build kernels --test`");
    let nvcc = Path::new(&nvcc);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("unit.cu"), UNIT).unwrap();

    let (a, wrap_a) = compile(nvcc, dir.path(), REPRODUCIBLE_NVCC_FLAGS);
    let (b, wrap_b) = compile(nvcc, dir.path(), REPRODUCIBLE_NVCC_FLAGS);
    assert_eq!(wrap_a, wrap_b);
    assert!(
        a == b,
        "same unit, same path, the recipe's flags: objects differ"
    );

    // Without the seed the module id takes the process id: two runs, two ids.
    let (c, wrap_c) = compile(nvcc, dir.path(), "-objtemp");
    let (d, wrap_d) = compile(nvcc, dir.path(), "-objtemp");
    assert_ne!(
        wrap_c, wrap_d,
        "without a seed the module id no longer varies: {wrap_c}"
    );
    assert!(c != d);
}
