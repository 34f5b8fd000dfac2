# Development environment for commstack-kernels on a machine without a system CUDA.
#
#   source kernels/dev-env.sh        # first time: installs the pinned wheels (~165 MB)
#   cargo build -p commstack-kernels --features cuda
#   cargo test  -p commstack-kernels --features cuda
#
# It installs NVIDIA's CUDA 13.0.2 compiler wheels (the set torch 2.11.0 pins through
# cuda-toolkit 13.0.2) and the NVSHMEM 3.4.5 wheel into <repo>/.tools (git-ignored),
# then exports what kernels/build.rs reads:
#   COMMSTACK_NVCC        the real nvcc binary inside the wheel tree (not a symlink:
#                         nvcc reads nvcc.profile beside itself)
#   NVSHMEM_HOME          NVSHMEM prefix: include/, lib/libnvshmem_device.a,
#                         lib/libnvshmem_host.so.3
#   COMMSTACK_CUDA_ARCHS  kept if set, else 90 (H100/H200)
# `cargo xtask toolchain` + `cargo xtask build kernels` do the same from the step store.
# Override the install place with COMMSTACK_TOOLS=/some/dir.

_commstack_kernels_dev_env() {
    local root tools req
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    tools="${COMMSTACK_TOOLS:-$root/.tools}"
    req="$(mktemp)" || return 1

    if [ ! -x "$tools/cuda/nvidia/cu13/bin/nvcc" ] || [ ! -f "$tools/cuda/nvidia/cu13/lib/libcudart_static.a" ]; then
        cat >"$req" <<'PINS'
nvidia-cuda-nvcc==13.0.88 --hash=sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03
nvidia-cuda-runtime==13.0.96 --hash=sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
nvidia-cuda-crt==13.0.88 --hash=sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4
nvidia-nvvm==13.0.88 --hash=sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0
nvidia-cuda-cccl==13.0.85 --hash=sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649
PINS
        echo "dev-env: installing CUDA 13.0.2 compiler wheels into $tools/cuda" >&2
        python3 -m pip install --quiet --no-deps --require-hashes --only-binary=:all: \
            --target "$tools/cuda" -r "$req" || { rm -f "$req"; return 1; }
    fi
    if [ ! -f "$tools/nvshmem/nvidia/nvshmem/lib/libnvshmem_device.a" ]; then
        cat >"$req" <<'PINS'
nvidia-nvshmem-cu13==3.4.5 --hash=sha256:290f0a2ee94c9f3687a02502f3b9299a9f9fe826e6d0287ee18482e78d495b80
PINS
        echo "dev-env: installing NVSHMEM 3.4.5 (nvidia-nvshmem-cu13) into $tools/nvshmem" >&2
        python3 -m pip install --quiet --no-deps --require-hashes --only-binary=:all: \
            --target "$tools/nvshmem" -r "$req" || { rm -f "$req"; return 1; }
    fi
    rm -f "$req"

    export COMMSTACK_NVCC="$tools/cuda/nvidia/cu13/bin/nvcc"
    export NVSHMEM_HOME="$tools/nvshmem/nvidia/nvshmem"
    export COMMSTACK_CUDA_ARCHS="${COMMSTACK_CUDA_ARCHS:-90}"
    echo "dev-env: COMMSTACK_NVCC=$COMMSTACK_NVCC" >&2
    echo "dev-env: NVSHMEM_HOME=$NVSHMEM_HOME" >&2
    echo "dev-env: COMMSTACK_CUDA_ARCHS=$COMMSTACK_CUDA_ARCHS" >&2
}

_commstack_kernels_dev_env
