#!/usr/bin/env bash
# Every GPU check of the stack, on a GPU machine with no Rust and no network, from a
# bundle made by `cargo xtask --stack stacks/gpu-adopt.toml gpu-bundle BUNDLE` and a
# checkout of this repository. The machine's environment is stacks/gpu-adopt.toml (adopt
# mode), not the default stack.toml (the Debian image): every xtask command here reads it.
#
#   gpu/run.sh BUNDLE OUT [STEP...]
#
# Steps (default: all, in this order; each logs to WORK/<step>.log and never stops the
# others):
#   facts          the machine: GPU, driver, CUDA, torch, NCCL/NVSHMEM wheels, tools
#   doctor         `xtask doctor` (text + JSON)
#   gate           the exit-clean gate on a real NCCL process group (world size 1):
#                  crates/verify/gpu/pg_exit.py test_dirty must fail, test_clean pass
#   selftest-nvidia  commstack-selftest (1 GPU) against NVIDIA's NVSHMEM of the torch env
#   nvshmem        `xtask build nvshmem` from the locked source (bundle mirror), system
#                  CUDA: cold build timed, then the no-op timed; proof report kept
#   nvshmem-static the same with --static-lib (NVSHMEM's whole `all` + install), timed,
#                  and its lib/ and include/ compared with the default's (not in "all")
#   verify-before  static + runtime verify of the torch env as it is (NVIDIA's NVSHMEM)
#   dropin         install our drop-in nvidia-nvshmem wheel into the torch env
#   verify-after   the same verify: torch must now map our libnvshmem_host
#   selftest-ours  commstack-selftest against our NVSHMEM
#   undo-dropin    put the torch env's own NVSHMEM back (the files `dropin` backed up),
#                  and check them byte for byte against the listing taken before
#   plot           `xtask plot selftest` of the self-test reports this run made (NVIDIA's
#                  and ours): OUT/selftest.svg, put/get/copy against size, one line each
#
# OUT receives results.tgz (every log and report) and, from the nvshmem step, the
# install as nvshmem-install.tgz.NN parts (each < 16 MB). The summary table gives each
# step's exit status, the status expected of it and the verdict: verify-before and the
# gate are expected to FAIL (NVIDIA's NVSHMEM is built with NCCL on; test_dirty must fail
# the gate), so their 1 reads "ok", and an unexpected 0 reads "UNEXPECTED".
# Environment: PYTHON (default python3: the torch env), CUDA_HOME (default /usr/local/cuda),
# JOBS (default: all cores), COMMSTACK_STACK (default: the checkout's stacks/gpu-adopt.toml).

set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,35p' "$0"; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The GPU machine's stack, for every xtask command below (xtask reads COMMSTACK_STACK as
# --stack): without it they would find the default stack.toml, the Debian image's.
export COMMSTACK_STACK="${COMMSTACK_STACK:-$repo/stacks/gpu-adopt.toml}"
bundle="$(cd "$1" && pwd)" || exit 2
out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(facts doctor gate selftest-nvidia nvshmem verify-before dropin verify-after selftest-ours undo-dropin plot)

mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d /tmp/commstack-gpu.XXXXXX)"
export COMMSTACK_HOME="$work/home"
# Shared multi-GPU hosts must keep NVLink multicast off; harmless on one GPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
X="$bundle/bin/xtask"
# The settings gpu-bundle resolved (the stack, with its overrides such as --cuda-archs or
# --no-ibgda): what `build nvshmem` builds and what `verify` expects.
for f in build-flags verify-flags; do
    [ -f "$bundle/$f" ] || { echo "$bundle has no $f: make the bundle again with this checkout's \`cargo xtask gpu-bundle\`"; exit 2; }
done
mapfile -t build_flags <"$bundle/build-flags"
mapfile -t verify_flags <"$bundle/verify-flags"
PY="${PYTHON:-python3}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
JOBS="${JOBS:-$(nproc)}"
cd "$repo" || exit 2
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
[ -d "$site" ] || { echo "cannot find site-packages of $PY (set PYTHON)"; exit 2; }
summary="$work/summary.tsv"
: >"$summary"

step() { # step NAME EXPECTED: runs step_NAME, logs, times, records its status and verdict
    local name="$1" expected="$2" t0 rc verdict
    t0=$(date +%s.%N)
    echo "::: $name" >&2
    ( set -x; "step_${name//-/_}" ) >"$work/$name.log" 2>&1
    rc=$?
    case "|$expected|" in *"|$rc|"*) verdict=ok ;; *) verdict=UNEXPECTED ;; esac
    printf '%s\t%s\t%s\t%.1f\t%s\n' "$name" "$rc" "$expected" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" "$verdict" >>"$summary"
    tail -n 15 "$work/$name.log" | sed "s/^/  [$name] /" >&2
}

step_facts() {
    nvidia-smi
    nvidia-smi topo -m
    "$CUDA_HOME/bin/nvcc" --version
    cmake --version; ninja --version; gcc --version | head -1; nproc; free -g; df -h /tmp
    which cargo rustc || echo "no Rust toolchain here (expected)"
    "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl(compiled)", torch.cuda.nccl.version())'
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl|nvidia-nvshmem|cuda-|triton)' || true
    ls -la "$site/nvidia/nvshmem/lib" || true
    cat /proc/driver/nvidia/params 2>/dev/null | grep -E 'EnableStreamMemOPs|RegistryDwords' || true
    "$X" --version
    echo "stack: $COMMSTACK_STACK"
}

step_doctor() {
    "$X" doctor | tee "$work/doctor.txt"
    "$X" doctor --json >"$work/doctor.json"
    true
}

step_gate() {
    "$X" verify --python "$PY" --level tests,exit-clean --report "$work/gate" \
        --test crates/verify/gpu/pg_exit.py:test_dirty --test crates/verify/gpu/pg_exit.py:test_clean
    local rc=$? # 1 expected: test_dirty must fail the gate, test_clean pass
    for f in "$work"/gate/*.log; do echo "== logscan $f"; "$X" logscan "$f"; done
    return $rc
}

selftest_with() { # selftest_with NAME LIBDIR
    COMMSTACK_SELFTEST="$bundle/bin/commstack-selftest" COMMSTACK_NVSHMEM_LIB="$2" \
        bash kernels/gpu/run-selftest.sh "$work/$1"
}

step_selftest_nvidia() { selftest_with selftest-nvidia "$site/nvidia/nvshmem/lib"; }

nvshmem_src() { # the locked NVSHMEM source, unpacked once into $work/nvshmem-src
    local src="$work/nvshmem-src" archive
    if [ ! -d "$src" ]; then
        "$X" fetch --only sources --offline --mirror "$bundle/mirror" --accept-tree-match >&2 || return
        archive="$(find "$COMMSTACK_HOME/cache" -name 'nvshmem_src_*.tar.gz' | head -1)"
        mkdir -p "$src" && tar -xzf "$archive" -C "$src" --strip-components=1 || return
    fi
    echo "$src"
}

nvshmem_build() { # nvshmem_build NAME [xtask build flags]: cold build, then the no-op, timed
    local name="$1"; shift
    local src rdma=() t0 t1 d static=false
    src="$(nvshmem_src)" || return
    [ -d "$bundle/rdma-core" ] && rdma=(--rdma-core "$bundle/rdma-core")
    [[ " $* " == *" --static-lib "* ]] && static=true
    t0=$(date +%s.%N)
    "$X" build nvshmem --source "$src" --system --cuda-home "$CUDA_HOME" --jobs "$JOBS" "${rdma[@]}" --python3 "$(command -v python3)" "${build_flags[@]}" "$@" \
        || { mkdir -p "$work/$name-failed" && find "$COMMSTACK_HOME/store/failed" -path '*/logs/*' -exec cp {} "$work/$name-failed/" \; ; return 1; }
    t1=$(date +%s.%N)
    echo "COLD BUILD SECONDS $(awk -v a="$t1" -v b="$t0" 'BEGIN{print a-b}')"
    t0=$(date +%s.%N)
    "$X" build nvshmem --source "$src" --system --cuda-home "$CUDA_HOME" --jobs "$JOBS" "${rdma[@]}" --python3 "$(command -v python3)" "${build_flags[@]}" "$@" || return
    t1=$(date +%s.%N)
    echo "NO-OP BUILD SECONDS $(awk -v a="$t1" -v b="$t0" 'BEGIN{print a-b}')"
    # This build's step: the one whose report records the static_lib asked for.
    d="$(grep -l "\"static_lib\": $static" "$COMMSTACK_HOME"/store/steps/nvshmem-*/build-report.json 2>/dev/null)"
    [ "$(echo "$d" | grep -c .)" = 1 ] || { echo "cannot tell this build's step (static_lib=$static): ${d:-none}"; return 1; }
    d="$(dirname "$d")/"
    echo "STEP $d"
    cp "$d/build-report.json" "$work/$name-build-report.json"
    cp -r "$d/logs" "$work/$name-logs"
    echo "$d" >"$work/$name.step"
}

step_nvshmem() {
    nvshmem_build nvshmem || return
    local d
    d="$(cat "$work/nvshmem.step")"
    cp "$work/nvshmem-build-report.json" "$work/build-report.json"
    # The whole step (with .step.json): `xtask store import` can bring it into another store.
    tar -C "$(dirname "$d")" -czf "$work/nvshmem-install.tgz" "$(basename "$d")" && split -b 15m -d "$work/nvshmem-install.tgz" "$out/nvshmem-install.tgz."
    "$X" store ls
    for d in "$COMMSTACK_HOME"/store/steps/nvshmem-wheel-*/; do
        [ -f "$d/wheel-report.json" ] && cp "$d/wheel-report.json" "$d"/dist/*.whl "$work/"
    done
    ls -la "$work"/*.whl
}

step_nvshmem_static() { # the same build with the static library (A/B), and what differs
    nvshmem_build nvshmem-static --static-lib || return
    [ -f "$work/nvshmem.step" ] || { echo "run the nvshmem step first to compare"; return 1; }
    local a b f differs
    a="$(cat "$work/nvshmem.step")nvshmem" b="$(cat "$work/nvshmem-static.step")nvshmem"
    echo "== files of the default install that differ from the static-lib install (none expected):"
    while read -r f; do
        if [ -L "$a/$f" ]; then [ "$(readlink "$a/$f")" = "$(readlink "$b/$f")" ] && continue
        else cmp -s "$a/$f" "$b/$f" && continue; fi
        echo "DIFFERS $f"
        # What differs: the embedded build variables, the dynamic section, the members.
        case "$f" in
            *.so*) diff <(strings "$a/$f" | grep -m1 NVSHMEM_USE_NCCL | tr ' ' '\n') \
                        <(strings "$b/$f" | grep -m1 NVSHMEM_USE_NCCL | tr ' ' '\n') | sed -n '1,20p'
                   diff <(readelf -dW "$a/$f") <(readelf -dW "$b/$f") | sed -n '1,20p' ;;
            *.a) diff <(ar t "$a/$f") <(ar t "$b/$f") | sed -n '1,20p'
                 cmp "$a/$f" "$b/$f" | sed -n '1p' ;;
        esac
    done < <(cd "$a" && find lib include \( -type f -o -type l \) | sort) | tee "$work/static-vs-default.txt"
    differs="$(grep -c '^DIFFERS' "$work/static-vs-default.txt")"
    echo "== only in the static-lib install:"
    # sed, not head: head closing the pipe early would fail the step (SIGPIPE, status 141).
    { diff <(cd "$a" && find . | sort) <(cd "$b" && find . | sort) || true; } | grep '^>' | sed -n '1,50p'
    # The verdict: the static-lib build adds files and changes none of the default's.
    [ "$differs" = 0 ] || { echo "$differs files of the default install differ"; return 1; }
}

verify_env() { # verify_env NAME [extra args]
    local name="$1"; shift
    "$X" verify --python "$PY" --level static,runtime "${verify_flags[@]}" \
        --report "$work/$name" "$@"
}

# Expected to FAIL: NVIDIA's NVSHMEM wheel is built with NVSHMEM_USE_NCCL=ON.
step_verify_before() { verify_env verify-before --nvshmem-prefix "$site/nvidia/nvshmem"; }

step_dropin() {
    local wheel
    wheel="$(ls "$work"/nvidia_nvshmem_cu*.whl | head -1)"
    [ -n "$wheel" ] || { echo "no drop-in wheel: the nvshmem step failed"; return 1; }
    # The env's own NVSHMEM files (and their listing), for undo-dropin; once per machine.
    if [ ! -f "$backup" ]; then
        # Written whole or not at all: a half backup must never be taken for a good one.
        nvshmem_files >"$backup.list.tmp" &&
            (cd "$site" && tar -czf "$backup.tmp" nvidia/nvshmem nvidia_nvshmem_cu*.dist-info) &&
            mv "$backup.list.tmp" "$backup.list" && mv "$backup.tmp" "$backup" || return 1
    fi
    "$PY" -m pip install --no-index --no-deps --force-reinstall "$wheel"
    "$PY" -m pip show nvidia-nvshmem-cu13
    "$PY" -m pip check || true
}

step_verify_after() { verify_env verify-after --nvshmem-prefix "$site/nvidia/nvshmem"; }

# Outside $work, so that a second run on the same machine does not back up our drop-in
# as "theirs"; one per environment (keyed by its site-packages path).
backup="/tmp/commstack-gpu-nvshmem-backup-$(printf %s "$site" | sha256sum | cut -c1-12).tgz"
nvshmem_files() { # the env's NVSHMEM files with their sha256
    (cd "$site" && find nvidia/nvshmem nvidia_nvshmem_cu*.dist-info -type f 2>/dev/null | LC_ALL=C sort | xargs -r sha256sum)
}

step_undo_dropin() {
    [ -f "$backup" ] || { echo "no backup at $backup: dropin did not run on this machine"; return 1; }
    "$PY" -m pip uninstall -y nvidia-nvshmem-cu13 || return
    (cd "$site" && tar -xzf "$backup") || return
    "$PY" -m pip show nvidia-nvshmem-cu13 | head -3
    if nvshmem_files | diff -u "$backup.list" -; then
        echo "UNDO EXACT: the env's NVSHMEM files are as before dropin"; rm -f "$backup" "$backup.list"
    else
        echo "UNDO DIFFERS (see the diff above)"; return 1
    fi
}

step_selftest_ours() { selftest_with selftest-ours "$site/nvidia/nvshmem/lib"; }

step_plot() {
    local reports=("$work"/selftest-nvidia/selftest-*gpu.json "$work"/selftest-ours/selftest-*gpu.json)
    local found=()
    for r in "${reports[@]}"; do [ -f "$r" ] && found+=("$r"); done
    [ ${#found[@]} -gt 0 ] || { echo "no self-test report in $work: run the selftest-nvidia or selftest-ours step"; return 1; }
    "$X" plot selftest "${found[@]}" -o "$work/selftest.svg" && cp "$work/selftest.svg" "$out/selftest.svg"
}

for s in "${steps[@]}"; do
    case "$s" in
        gate | verify-before) step "$s" 1 ;;
        # 2 (not run) when deep_ep is absent: DeepEP is run-deepep.sh's; 1 is a failure.
        verify-after) step "$s" '0|2' ;;
        *) step "$s" 0 ;;
    esac
done

tar -C "$work" --exclude=home --exclude=nvshmem-src --exclude='nvshmem-install.tgz' -czf "$out/results.tgz" .
echo
echo "step              rc  expected   seconds  verdict"
awk -F'\t' '{ printf "%-16s %3s %9s %9s  %s\n", $1, $2, $3, $4, $5 }' "$summary"
ls -la "$out"
# The run's own status: 1 when any step's verdict is UNEXPECTED.
! grep -q 'UNEXPECTED' "$summary"
