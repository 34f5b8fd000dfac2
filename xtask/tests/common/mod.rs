//! What xtask's command-line tests share: the built xtask, run with a home of the test's
//! own and nothing of the environment that runs the tests (its stack, registry and
//! signing settings), and its output read as one text.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use commstack_testkit::pypi::{FixtureIndex, WheelSpec};
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER};

/// The built xtask with `COMMSTACK_HOME=home` and none of the caller's COMMSTACK_STACK,
/// registry credentials, CA or signing key: a test gives it what it needs.
pub fn command(home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command.env("COMMSTACK_HOME", home);
    for name in [
        "COMMSTACK_STACK",
        "COMMSTACK_REGISTRY_USER",
        "COMMSTACK_REGISTRY_PASSWORD",
        "COMMSTACK_REGISTRY_CA",
        "COMMSTACK_SIGNING_KEY",
    ] {
        command.env_remove(name);
    }
    command
}

/// [`command`] for a test registry: no Docker credentials (DOCKER_CONFIG is an empty place
/// under `home`) and, with `login`, the test registry's user and password.
pub fn registry_command(home: &Path, login: bool) -> Command {
    let mut command = command(home);
    command.env("DOCKER_CONFIG", home.join("no-docker-config"));
    if login {
        command
            .env("COMMSTACK_REGISTRY_USER", REGISTRY_USER)
            .env("COMMSTACK_REGISTRY_PASSWORD", REGISTRY_PASSWORD);
    }
    command
}

/// `xtask ARGS` with home `home`, in the tests' working directory.
pub fn xtask(home: &Path, args: &[&str]) -> Output {
    command(home).args(args).output().unwrap()
}

/// `xtask ARGS` in `cwd` (whose stack.toml it reads) with home `home`.
pub fn xtask_in(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    command(home).current_dir(cwd).args(args).output().unwrap()
}

/// The repository's root (its stack.toml, stacks/ and docs/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// stdout then stderr, as one text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A PyPI index with torch 2.11.0 and what it pins (CUDA 13.0.2, NCCL 2.28.9, NVSHMEM
/// `nvshmem`), nvcc, cmake and ninja: the closure `lock` resolves for the tests' stacks.
pub fn torch_index(nvshmem: &str) -> FixtureIndex {
    let mut ix = FixtureIndex::new();
    let linux = "; platform_system == \"Linux\"";
    ix.add(
        WheelSpec::new("torch", "2.11.0")
            .tags("cp312-cp312-manylinux_2_28_x86_64")
            .requires(&format!("cuda-toolkit[cudart]==13.0.2{linux}"))
            .requires(&format!("nvidia-nccl-cu13==2.28.9{linux}"))
            .requires(&format!("nvidia-nvshmem-cu13=={nvshmem}{linux}")),
    );
    ix.add(
        WheelSpec::new("cuda-toolkit", "13.0.2")
            .extra("cudart")
            .requires("nvidia-cuda-runtime==13.0.96.*; extra == 'cudart'")
            .extra("nvcc")
            .requires("nvidia-cuda-nvcc==13.0.88.*; extra == 'nvcc'"),
    );
    for (name, v) in [
        ("nvidia-cuda-runtime", "13.0.96"),
        ("nvidia-nccl-cu13", "2.28.9"),
        ("nvidia-nvshmem-cu13", nvshmem),
        ("nvidia-cuda-nvcc", "13.0.88"),
        ("cmake", "3.31.6"),
        ("ninja", "1.13.0"),
    ] {
        ix.add(WheelSpec::new(name, v).tags("py3-none-manylinux2014_x86_64"));
    }
    ix
}
