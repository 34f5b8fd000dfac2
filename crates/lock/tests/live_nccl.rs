//! The `[nccl]` override against the real PyPI: torch 2.11.0 pins nvidia-nccl-cu13==2.28.9,
//! the stack asks for 2.30.7 (what DeepEP V2 needs). Needs the network:
//! `cargo test -p commstack-lock --test live_nccl -- --ignored` (ci/test.sh runs it).

use std::path::Path;

use commstack_stack::Stack;
use commstack_stack::rules::Status;

/// The GPU machine's shipped stack (no [image]: no Debian mirror needed) with `version`.
fn gpu_adopt_with_nccl(version: &str) -> Stack {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../stacks/gpu-adopt.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // [nccl]'s line: [nvshmem]'s `version = "match-torch"` has a comment after it.
    let old = "\nversion = \"match-torch\"\n";
    assert_eq!(text.matches(old).count(), 1, "the shipped stack's [nccl]");
    let text = text.replace(old, &format!("\nversion = \"{version}\"\n"));
    Stack::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "needs network access to pypi.org"]
async fn torch_2_11_locks_with_nccl_2_30_7() {
    let stack = gpu_adopt_with_nccl("2.30.7");
    let lock = commstack_lock::lock(&stack, None, None, &|_: &str| {})
        .await
        .unwrap()
        .lock;
    let nccl: Vec<String> = lock
        .packages
        .iter()
        .filter(|p| p.name.starts_with("nvidia-nccl"))
        .map(|p| format!("{}=={}", p.name, p.version))
        .collect();
    assert_eq!(nccl, ["nvidia-nccl-cu13==2.30.7"]);
    let r = &lock.resolved;
    assert_eq!(r.nccl.to_string(), "nvidia-nccl-cu13==2.30.7");
    let o = r.nccl_override.as_ref().unwrap();
    assert_eq!(o.torch_pin.to_string(), "nvidia-nccl-cu13==2.28.9");
    assert_eq!(
        o.replaces,
        "nvidia-nccl-cu13==2.28.9 ; platform_system == 'Linux'"
    );
    let soname = lock.rules.iter().find(|r| r.id == "nccl-soname").unwrap();
    assert_eq!(soname.status, Status::Ok);
    assert_eq!(
        soname.detail,
        "nvidia_nccl_cu13-2.30.7-py3-none-manylinux_2_18_x86_64.whl ships nvidia/nccl/lib/libnccl.so.2 (its zip directory, read at lock time)"
    );

    // 2.27.7 is on PyPI too, and older than torch's pin.
    let err = commstack_lock::lock(&gpu_adopt_with_nccl("2.27.7"), None, None, &|_: &str| {})
        .await
        .err()
        .unwrap();
    let err = format!("{err:#}");
    assert!(err.contains("[rule nccl-not-older-than-torch]"), "{err}");
}
