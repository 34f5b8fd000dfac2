//! What the deploy tests share: the fixture stacks, the image, and NVSHMEM's variables
//! from testkit's NVSHMEM-shaped source (`commstack_testkit::nvshmem`: an env_defs header
//! in NVSHMEM 3.x's exact macro shape, the variables the fixtures and the render set, and
//! an IBGDA-guarded one).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use commstack_deploy::ImageRef;
use commstack_envlint::NvshmemTables;
use commstack_stack::Stack;

pub const DIGEST: &str = "390fb29b8501aa6f0e8ef8d0c2b9d0f6a1b3c5d7e9f1a3b5c7d9e1f3a5b7c9d1";

pub use commstack_testkit::nvshmem::{ENV_DEFS, ENV_DEFS_PATH};

pub fn tables() -> NvshmemTables {
    commstack_envlint::source::tables(
        Path::new("fixture-nvshmem_src"),
        vec![(ENV_DEFS_PATH.into(), ENV_DEFS.into())],
    )
    .unwrap()
}

/// An NVSHMEM-shaped source tree under `dir` with [`ENV_DEFS`], and its .tar.gz: what
/// `--nvshmem-source` takes.
pub fn nvshmem_source(dir: &Path) -> (PathBuf, PathBuf) {
    use std::io::Write;
    let src = commstack_testkit::nvshmem::source_tree(dir);
    let archive = dir.join("nvshmem_src_cuda12-all-all-3.4.5.tar.gz");
    let gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&archive).unwrap(),
        flate2::Compression::default(),
    );
    let mut tar = tar::Builder::new(gz);
    tar.append_dir_all("nvshmem_src", &src).unwrap();
    tar.into_inner().unwrap().finish().unwrap().flush().unwrap();
    (src, archive)
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture(name: &str) -> Stack {
    let path = crate_dir().join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    // The path as the golden headers print it: the file name only.
    Stack::parse(Path::new(name), &text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The fixture image's environment, as the image step writes it for a lock of `stack`
/// (DeepEP V2: its JIT toolchain, of torch's CUDA major as the lock's nvcc is).
pub fn image_env(stack: &Stack) -> Vec<String> {
    let v2 = stack.deepep.api == commstack_stack::manifest::DeepEpApi::V2;
    commstack_image::assemble::env_with_jit(v2.then_some(stack.torch.cuda_major))
}

/// `stack_path` with a lock beside it that is fresh for it: the shipped stack.lock's
/// resolution (DeepEP V1) under the stack's echo and fingerprint.
pub fn fresh_lock(stack_path: &Path) -> PathBuf {
    let shipped = crate_dir().join("../../stack.lock");
    let mut lock =
        commstack_stack::Lock::parse(&shipped, &std::fs::read_to_string(&shipped).unwrap())
            .unwrap();
    let text = std::fs::read_to_string(stack_path).unwrap();
    let stack = Stack::parse(stack_path, &text).unwrap();
    assert_eq!(stack.deepep.api, lock.resolved.deepep_api);
    lock.inputs.stack = stack.fingerprint();
    lock.manifest = stack.echo();
    let path = stack_path.with_extension("lock");
    std::fs::write(&path, lock.render(None)).unwrap();
    assert_eq!(lock.staleness(&stack), Vec::<String>::new());
    path
}

pub fn image() -> ImageRef {
    ImageRef::parse(&format!(
        "registry.example.com:5000/commstack/debian-12@sha256:{DIGEST}"
    ))
    .unwrap()
}
