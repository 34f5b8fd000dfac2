#!/usr/bin/env bash
# The project's test command (the README names it; .ci/run calls it). Runs on a CPU
# machine with Rust, Python 3 and gcc; installs what else it needs (uv, the pinned CUDA
# compiler wheels) under .tools/ (git-ignored). GPU tests are not here: see gpu/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
# Each step names the disk left, so a run that runs out says where it went.
step() {
    printf '\n::: [%4ds, %s free] %s\n' "$((SECONDS - started))" \
        "$(df -Ph . | awk 'NR==2 {print $4}')" "$*"
}
# CI compiles each crate once: cargo's incremental caches (4 GB of a 14 GB target/) only
# cost disk here. Developers keep them.
export CARGO_INCREMENTAL=0

step "formatting (cargo fmt --check): run \`cargo fmt\` to fix"
cargo fmt --all --check

step "build and test every crate (the kernel crate without its CUDA parts: they need nvcc, last step); the tidy tests (xtask/tests/tidy*.rs, flow_order.rs) run here; the signature tests verify with .tools/bin/cosign and push to .tools/bin/refreg (ci/cosign-tools.sh)"
cargo test --locked --workspace

step "deploy's renders (the golden fixtures, 1 and 2 nodes, k8s and slurm) validated by others: kubernetes-validate against Kubernetes 1.33's OpenAPI schema, jsonschema against the pinned LeaderWorkerSet and JobSet CRDs (ci/validate_deploy.py)"
if ! .tools/deploy-validate-venv/bin/python -c 'import kubernetes_validate' 2>/dev/null; then
    python3 -m venv .tools/deploy-validate-venv
    .tools/deploy-validate-venv/bin/pip install --quiet --disable-pip-version-check kubernetes-validate==1.37.0
fi
renders=$(mktemp -d)
COMMSTACK_DEPLOY_RENDER_TO="$renders" cargo test --locked --quiet --workspace --test golden
.tools/deploy-validate-venv/bin/python ci/validate_deploy.py 1.33 crates/deploy/schemas "$renders"
rm -rf "$renders"

step "the image step with the network cut: the fixture image tests again in a new network namespace (unshare -n; Docker is reached through its socket)"
unshare -n cargo test --locked --offline --workspace --test image_step

step "clippy, warnings as errors (the kernel crate's CUDA parts: with their build, last step)"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "every shipped stack (stack.toml, stacks/*.toml): its lock matches its manifest and the rules, and the build plans every step (offline: lock --check and build --dry-run read only the lock and the caches)"
for manifest in stack.toml stacks/*.toml; do
    echo "--- $manifest"
    cargo xtask --quiet --stack "$manifest" lock --check
    cargo xtask --quiet --stack "$manifest" build --dry-run
done

step "the locked closures equal uv's for the same targets (live PyPI; uv is the oracle)"
if [ ! -x .tools/uv-venv/bin/uv ]; then
    python3 -m venv .tools/uv-venv
    .tools/uv-venv/bin/pip install --quiet --disable-pip-version-check uv==0.13.9
fi
COMMSTACK_UV="$PWD/.tools/uv-venv/bin/uv" cargo test --locked --workspace --test uv_oracle -- --ignored

step "the [nccl] override against live PyPI: torch 2.11.0 with nvidia-nccl-cu13 2.30.7 in place of its 2.28.9 pin"
cargo test --locked --workspace --test live_nccl -- --ignored

step "the kernel crate with its feature cuda: the default stack's locked CUDA toolchain (provisioned from its wheels) compiles it against NVIDIA's NVSHMEM wheel of torch's pin, then its CPU tests and clippy run"
cargo xtask --quiet fetch --only toolchain,replaced
cargo xtask toolchain
cargo xtask build kernels --nvshmem-from nvidia-wheel --test

step "fuzzing, 60 s each (cargo fuzz, nightly): the archive unpacker, the stack.toml/stack.lock parsers and wheel installs, from the committed corpora in fuzz/corpus"
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz@0.13.2
for target in unpack stack_parsers wheel_install; do
    (cd fuzz && cargo +nightly fuzz run "$target" -O -- -max_total_time=60 -rss_limit_mb=2048 2>&1 | grep -E '^(Done|#[0-9]+ +DONE)|panicked|ERROR|SUMMARY')
done

step "all tests passed in $((SECONDS - started)) s"
