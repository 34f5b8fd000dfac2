//! The CMake `-D` list and the options JSON (part of the step key) that the shipped stacks
//! produce, pinned byte for byte in tests/golden/stack-defines.txt, so that a change in
//! how stack.toml's options reach CMake cannot alter a shipped build unnoticed. To accept
//! an intended change: `COMMSTACK_BLESS=1 cargo test -p commstack-nvshmem --test
//! stack_defines`, and review the diff.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use commstack_nvshmem::{NvshmemOptions, RdmaCore, cmake_defines};
use commstack_stack::Stack;
use commstack_toolchain::{ToolVersions, Toolchain, ToolchainSource};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Fixed paths: the defines only format them.
fn toolchain() -> Toolchain {
    let p = |s: &str| PathBuf::from(s);
    Toolchain {
        source: ToolchainSource::System,
        cuda_home: p("/cuda"),
        nvcc: p("/cuda/bin/nvcc"),
        cuda_include_dirs: vec![],
        cudart_lib_dir: p("/cuda/lib"),
        cuda_stubs_dir: None,
        cmake: p("/tools/cmake"),
        ninja: p("/tools/ninja"),
        cc: p("/usr/bin/cc"),
        cxx: p("/usr/bin/c++"),
        versions: ToolVersions {
            nvcc: "13.0".into(),
            cuda: "13.0".into(),
            cmake: "4.4.3".into(),
            ninja: "1.13.0".into(),
            cc: "cc".into(),
            cxx: "c++".into(),
        },
    }
}

fn rdma() -> RdmaCore {
    RdmaCore {
        prefix: "/rdma".into(),
        include_dir: "/rdma/usr/include".into(),
        lib_dir: "/rdma/usr/lib".into(),
        libmlx5: "/rdma/usr/lib/libmlx5.so".into(),
        mlx5dv_h_sha256: "0".repeat(64),
    }
}

fn render(name: &str, text: &str, homes: &BTreeMap<String, PathBuf>) -> String {
    let stack = Stack::parse(Path::new(name), text).unwrap();
    let opts = NvshmemOptions::from_stack(&stack.nvshmem, homes, Some("/rdma".into())).unwrap();
    let defines = cmake_defines(
        &opts,
        &toolchain(),
        Path::new("/usr/bin/python3"),
        Path::new("/src"),
        Some(&rdma()),
    )
    .unwrap();
    let mut out = format!("== {name}\n");
    for (k, v) in defines {
        writeln!(out, "-D{k}={v}").unwrap();
    }
    let json = serde_json::to_value(&opts).unwrap();
    writeln!(out, "options {json}").unwrap();
    out
}

#[test]
fn shipped_stacks_render_the_pinned_defines() {
    let mut out = String::new();
    for name in ["stack.toml", "stacks/gpu-adopt.toml"] {
        let text = std::fs::read_to_string(root().join(name)).unwrap();
        out += &render(name, &text, &BTreeMap::new());
    }
    // Every transport on, to pin the order and the *_HOME paths of the ON side too.
    let text = std::fs::read_to_string(root().join("stack.toml")).unwrap();
    let mut homes = BTreeMap::new();
    for key in [
        "ibrc",
        "ibdevx",
        "ucx",
        "libfabric",
        "gdrcopy",
        "mpi",
        "shmem",
        "pmix",
    ] {
        let line = format!("\n{key} = false");
        assert!(text.contains(&line), "stack.toml has no {line:?}");
        homes.insert(key.to_string(), PathBuf::from(format!("/opt/{key}")));
    }
    let mut all_on = text.clone();
    for key in homes.keys() {
        all_on = all_on.replace(&format!("\n{key} = false"), &format!("\n{key} = true"));
    }
    out += &render("stack.toml (all on)", &all_on, &homes);

    let golden = root().join("crates/nvshmem/tests/golden/stack-defines.txt");
    if std::env::var_os("COMMSTACK_BLESS").is_some() {
        std::fs::write(&golden, &out).unwrap();
    }
    let want = std::fs::read_to_string(&golden).unwrap_or_default();
    assert!(
        out == want,
        "the rendered defines differ from {}; if intended, rerun with COMMSTACK_BLESS=1 and review the diff",
        golden.display()
    );
}
