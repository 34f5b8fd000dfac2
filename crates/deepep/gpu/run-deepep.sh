#!/usr/bin/env bash
# DeepEP on the GPU machine's own torch environment (adopt mode), from a bundle: no Rust,
# no network. Run from a checkout of this repository (it reads stacks/gpu-adopt.toml and
# its lock: the GPU machine's stack; the default stack.toml is the Debian image's):
#
#   crates/deepep/gpu/run-deepep.sh BUNDLE OUT [STEP...]
#
# BUNDLE holds (override each with the variable in brackets):
#   bin/xtask                          `cargo xtask` with the `adopt` command      [XTASK]
#   mirror/DeepEP-<rev>.tar.gz         the locked DeepEP source                    [DEEPEP_SOURCE]
#   the stack's NVSHMEM build, the first found of:                                 [NVSHMEM]
#     nvshmem-step/                    a copy of the store step nvshmem-<hash>
#                                      (.step.json, build-report.json, nvshmem/)
#     nvshmem-install.tgz.NN | .tgz    that step as gpu/run.sh's nvshmem step writes it
#     (none: built here from mirror/nvshmem_src_*.tar.gz, about 4 minutes)
#   nvidia_nvshmem_cu*+commstack*.whl  optional: the drop-in wheel (else made from the step)
#
# Steps (default: all, in this order; each logs to OUT/<step>.log with `set -x`, a
# failure never stops the next step; a summary is printed at the end):
#   facts         the machine, CUDA, the torch environment, the bundle
#   prepare       find or unpack NVSHMEM and the DeepEP source; fingerprint the env
#   compare       adopt --dry-run: the environment against the lock and the rules
#   check-before  the runtime check of the environment as it is: must FAIL (NVIDIA's NVSHMEM)
#   build         build deepep --python PY (adopt mode, system CUDA), cold (--force), timed
#   noop          the same command again, timed: target under 1 s
#   documented    DeepEP's documented `python setup.py build` (NVSHMEM_DIR,
#                 TORCH_CUDA_ARCH_LIST=9.0, CPATH=<cuda>/include/cccl), timed: the baseline
#                 (V2: EP_NCCL_ROOT_DIR = the stack's NCCL build, EP_NVSHMEM_ROOT_DIR, fmt filled in)
#   bench         BENCH_TRIALS (default 3) trials of both builds, the order alternating:
#                 commstack's (`build` with the DeepEP store step removed first; NCCL, NVSHMEM
#                 and the toolchain stay) and `documented`; each time, the medians and the
#                 ratio (the 1.0x target); after `build`
#   negative      adopt --only deepep: DeepEP in, NVIDIA's NVSHMEM left: the check must FAIL and say why
#   adopt         adopt: the drop-in too: the check must PASS (one libnvshmem_host, ours, NCCL off;
#                 one libnccl = the lock's pin)
#   verify        xtask verify --level static,runtime against the adopted environment
#   tests         xtask verify --level tests,exit-clean --deepep-source: DeepEP's own tests
#                 through the runner and the exit-clean gate (test_low_latency.py with one
#                 rank per GPU; test_intranode.py needs 2+ GPUs and is reported as not run)
#   undo          adopt --undo: the environment's NVSHMEM and DeepEP files as before `prepare`
#
# With a V2 stack (COMMSTACK_STACK=stacks/gpu-adopt-v2.toml: DeepEP dd758ca, NCCL 2.30.7
# built from source) the default steps are facts prepare compare build adopt v2-tests undo:
# `build` also builds NCCL from the bundle's mirror and its drop-in wheel, `adopt` replaces
# the environment's NCCL too, `v2-tests` runs gpu/v2-probe.sh's import (V2's own
# duplicate-NCCL check), legacy low-latency and elastic tests against the adopted
# environment (V2_TESTS picks among import, legacy, elastic), and `undo` checks the NCCL
# files too.
#
# Environment: PYTHON (default /opt/torch/.venv/bin/python3), CUDA_HOME (/usr/local/cuda),
# JOBS (nproc), WORK (default /tmp/commstack-deepep: reused, so steps can be split over
# several calls), KEEP_ADOPTED=1 (skip undo), COMMSTACK_STACK (default: the checkout's
# stacks/gpu-adopt.toml).

set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,53p' "$0"; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
# The GPU machine's stack, for every xtask command below (xtask reads COMMSTACK_STACK as
# --stack): without it they would find the default stack.toml, the Debian image's.
export COMMSTACK_STACK="${COMMSTACK_STACK:-$repo/stacks/gpu-adopt.toml}"
bundle="$(cd "$1" && pwd)" || exit 2
out="$2"
shift 2
steps=("$@")
v2=0
grep -qE '^api *= *"v2"' "$COMMSTACK_STACK" && v2=1
if [ ${#steps[@]} -eq 0 ]; then
    if [ $v2 = 1 ]; then steps=(facts prepare compare build adopt v2-tests undo)
    else steps=(facts prepare compare check-before build noop documented negative adopt verify tests undo); fi
fi

mkdir -p "$out" && out="$(cd "$out" && pwd)" || exit 2
work="${WORK:-/tmp/commstack-deepep}"
mkdir -p "$work" || exit 2
export COMMSTACK_HOME="$work/home"
# Shared multi-GPU hosts must keep NVLink multicast off; harmless on one GPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
X="${XTASK:-$bundle/bin/xtask}"
PY="${PYTHON:-/opt/torch/.venv/bin/python3}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
JOBS="${JOBS:-$(nproc)}"
cd "$repo" || exit 2
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)"
[ -d "$site" ] || { echo "cannot find site-packages of $PY (set PYTHON)"; exit 2; }
summary="$out/summary.tsv"
: >"$summary"
vars="$work/inputs.sh" # what `prepare` found, for the later steps (each runs in a subshell)

# step NAME EXPECTED: runs step_NAME with `set -x` into OUT/NAME.log; records rc and time.
step() {
    local name="$1" expected="$2" t0 rc
    t0=$(date +%s.%N)
    echo "::: $name" >&2
    ( set -x; [ -f "$vars" ] && source "$vars"; "step_${name//-/_}" ) >"$out/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\t%.1f\n' "$name" "$rc" "$expected" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" >>"$summary"
    tail -n 12 "$out/$name.log" | sed "s/^/  [$name] /" >&2
}

seconds_of() { # seconds_of CMD...: runs it, prints "SECONDS <s>" after, returns its status
    local t0 rc
    t0=$(date +%s.%N)
    "$@"
    rc=$?
    echo "SECONDS $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.3f", a-b}') rc=$rc"
    return $rc
}

fingerprint() { # the files adopt may touch, with their sha256
    (cd "$site" && find nvidia/nvshmem nvidia/nccl deep_ep deep_ep_cpp* deep_ep-*.dist-info deep_ep.egg-info \
        nvidia_nvshmem_cu*.dist-info nvidia_nccl_cu*.dist-info -type f 2>/dev/null | LC_ALL=C sort | xargs -r sha256sum)
    "$PY" -c 'import importlib.metadata as m; [print(n, v) for n, v in sorted((d.metadata["Name"], d.version) for d in m.distributions())]'
}

step_facts() {
    nvidia-smi || true
    "$CUDA_HOME/bin/nvcc" --version
    cmake --version | head -1; ninja --version; gcc --version | head -1; nproc; free -g | head -2
    "$PY" -c 'import sys; print(sys.version)'
    "$PY" -c 'import importlib.metadata as m
for n in ("torch", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13", "setuptools", "deep_ep", "pip"):
    try: print(n, m.version(n))
    except m.PackageNotFoundError: print(n, "absent")'
    ls -la "$site/nvidia/nvshmem/lib" || true
    "$X" --version
    echo "stack: $COMMSTACK_STACK"
    ls -la "$bundle" "$bundle/mirror" || true
}

step_prepare() {
    local src nv wheel parts
    src="${DEEPEP_SOURCE:-$(ls "$bundle"/mirror/DeepEP-*.tar.gz 2>/dev/null | head -1)}"
    [ -f "$src" ] || { echo "no DeepEP source archive in $bundle/mirror (set DEEPEP_SOURCE)"; return 1; }
    nv="${NVSHMEM:-}"
    if [ -z "$nv" ] && [ -d "$bundle/nvshmem-step" ]; then nv="$bundle/nvshmem-step"; fi
    if [ -z "$nv" ]; then
        parts=$(ls "$bundle"/nvshmem-install.tgz.* 2>/dev/null)
        [ -z "$parts" ] && [ -f "$bundle/nvshmem-install.tgz" ] && parts="$bundle/nvshmem-install.tgz"
        if [ -n "$parts" ]; then
            rm -rf "$work/nvshmem-step" && mkdir -p "$work/nvshmem-step"
            # gpu/run.sh writes the step directory itself (nvshmem-<hash>/...).
            # shellcheck disable=SC2086
            cat $parts | tar -xzf - -C "$work/nvshmem-step" --strip-components=1 || return 1
            nv="$work/nvshmem-step"
        fi
    fi
    if [ -z "$nv" ]; then
        echo "no NVSHMEM build in the bundle: building it here from the locked source"
        "$X" fetch --only sources --offline --mirror "$bundle/mirror" --accept-tree-match || return 1
        local archive nsrc rdma=()
        archive="$(find "$COMMSTACK_HOME/cache" -name 'nvshmem_src_*.tar.gz' | head -1)"
        nsrc="$work/nvshmem-src"
        rm -rf "$nsrc" && mkdir -p "$nsrc" && tar -xzf "$archive" -C "$nsrc" --strip-components=1 || return 1
        [ -d "$bundle/rdma-core" ] && rdma=(--rdma-core "$bundle/rdma-core")
        seconds_of "$X" build nvshmem --source "$nsrc" --system --cuda-home "$CUDA_HOME" --jobs "$JOBS" \
            "${rdma[@]}" --python3 "$(command -v python3)" || return 1
        nv="$(find "$COMMSTACK_HOME/store/steps" -maxdepth 1 -name 'nvshmem-*' ! -name 'nvshmem-wheel-*' | head -1)"
    fi
    [ -d "$nv" ] || { echo "no NVSHMEM at '$nv'"; return 1; }
    wheel="${NVSHMEM_WHEEL:-$(ls "$bundle"/nvidia_nvshmem_cu*+commstack*.whl 2>/dev/null | head -1)}"
    local prefix="$nv"
    [ -d "$nv/nvshmem/lib" ] && prefix="$nv/nvshmem"
    ls -la "$prefix/lib"
    {
        echo "src=$(printf %q "$src")"
        echo "nv=$(printf %q "$nv")"
        echo "nvprefix=$(printf %q "$prefix")"
        echo "wheel_args=(${wheel:+--nvshmem-wheel $(printf %q "$wheel")})"
    } >"$vars"
    cat "$vars"
    # What the environment's NVSHMEM and DeepEP files are before anything: `undo` compares.
    [ -f "$work/before.txt" ] || fingerprint >"$work/before.txt"
    cp "$work/before.txt" "$out/env-before.txt"
    wc -l "$work/before.txt"
}

# bench_one commstack|documented TRIAL: one timed build; prints its seconds (the whole
# command) and, for commstack, the step's own from its build report.
bench_one() {
    local log="$out/bench-$1-$2.log" step
    if [ "$1" = commstack ]; then
        # The DeepEP step only (not deepep-venv, not NCCL): built again from its inputs.
        find "$COMMSTACK_HOME/store/steps" -maxdepth 1 -name 'deepep-*' ! -name 'deepep-venv-*' \
            -exec rm -rf {} + || return
        build_deepep -- >"$log" 2>&1 || return 1
        step="$(ls -td "$COMMSTACK_HOME"/store/steps/deepep-* | grep -v deepep-venv | head -1)"
        "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); print("STEP", round(sum(s for _, s in r["phase_seconds"]), 3), r["wheel"]["sha256"], " ".join("%s=%.2f" % (n, s) for n, s in r["phase_seconds"]))' \
            "$step/build-report.json" >>"$log" || return 1
    else
        step_documented >"$log" 2>&1 || return 1
    fi
    grep -h '^SECONDS\|^STEP' "$log" | tr '\n' ' '
    echo
}

step_bench() {
    local n="${BENCH_TRIALS:-3}" i way
    for i in $(seq 1 "$n"); do
        # Odd trials commstack first, even ones documented first: neither always warm.
        local order=(commstack documented)
        [ $((i % 2)) = 0 ] && order=(documented commstack)
        for way in "${order[@]}"; do
            local r
            r="$(bench_one "$way" "$i")" || { echo "BENCH trial $i $way FAILED (its log: $out/bench-$way-$i.log)"; exit 1; }
            echo "BENCH trial $i $way $r"
        done
    done | tee "$out/bench.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || return 1
    # The medians of the whole commands' seconds, and their ratio.
    "$PY" - "$out/bench.txt" <<'PYEOF'
import re, statistics, sys
trials = {}
for line in open(sys.argv[1]):
    m = re.match(r"BENCH trial (\d+) (\w+) SECONDS ([\d.]+) rc=0", line)
    if m:
        trials.setdefault(int(m.group(1)), {})[m.group(2)] = float(m.group(3))
both = [t for _, t in sorted(trials.items()) if len(t) == 2]
if not both or len(both) != len(trials):
    sys.exit("BENCH incomplete: %r" % trials)
c, d = [t["commstack"] for t in both], [t["documented"] for t in both]
ratios = [a / b for a, b in zip(c, d)]
print("BENCH commstack %s median %.1f s; documented %s median %.1f s; ratios %s; median ratio %.3fx (target <= 1.0x)" % (
    c, statistics.median(c), d, statistics.median(d), ["%.3f" % r for r in ratios], statistics.median(ratios)))
PYEOF
}

step_compare() {
    "$X" adopt --python "$PY" --dry-run
}

step_check_before() {
    "$X" adopt --python "$PY" --check
}

build_deepep() { # build_deepep [GLOBAL FLAGS...] -- [BUILD FLAGS...]: the adopt-mode build, timed
    local global=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do global+=("$1"); shift; done
    shift
    # NVSHMEM's IBGDA headers include infiniband/mlx5dv.h: the bundle's rdma-core tree
    # (the machine has no libibverbs-dev).
    local rdma=()
    [ -d "$bundle/rdma-core" ] && rdma=(--rdma-core "$bundle/rdma-core")
    # V2: the locked DeepEP, fmt and NCCL sources from the bundle's mirror (V1: the archive).
    local sources=(--source "$src")
    if [ $v2 = 1 ]; then
        sources=(--offline --mirror "$bundle/mirror" --accept-tree-match)
        "$X" fetch --only sources "${sources[@]}" || return
    fi
    seconds_of "$X" "${global[@]}" build deepep --python "$PY" --system --cuda-home "$CUDA_HOME" \
        --nvshmem "$nv" "${sources[@]}" --jobs "$JOBS" "${rdma[@]}" "${wheel_args[@]}" "$@"
}

step_build() {
    # Cold already on a fresh machine; V2's --force would also rebuild NCCL (3 minutes).
    local force=(--force)
    [ $v2 = 1 ] && force=()
    build_deepep -- "${force[@]}" || return
    local step
    step="$(ls -td "$COMMSTACK_HOME"/store/steps/deepep-* 2>/dev/null | grep -v deepep-venv | head -1)"
    cp "$step/build-report.json" "$out/deepep-build-report.json"
    cp "$step/logs/build.log" "$out/deepep-build.log"
    ls -la "$step/dist"
    find "$COMMSTACK_HOME/store/steps" -maxdepth 2 -name wheelhouse.json -exec cp {} "$out/" \;
    "$X" store ls
}

step_noop() {
    local i
    for i in 1 2 3; do
        build_deepep --quiet -- || return
    done
}

# V2's documented build (setup.py build) on the same inputs as `build`: the NCCL the
# stack built (its store step), our NVSHMEM, fmt in third-party/fmt, the system g++.
documented_v2() {
    local dir="$work/documented" nccl cpath="$CUDA_HOME/include/cccl"
    nccl="$(ls -d "$COMMSTACK_HOME"/store/steps/nccl-*/nccl 2>/dev/null | head -1)"
    [ -d "$nccl" ] || { echo "no NCCL build in the store: run the build step first"; return 1; }
    rm -rf "$dir" && mkdir -p "$dir" && tar -xzf "$src" -C "$dir" --strip-components=1 || return 1
    tar -xzf "$(ls "$bundle"/mirror/fmt-*.tar.gz)" -C "$dir/third-party/fmt" --strip-components=1 || return 1
    [ -d "$bundle/rdma-core/usr/include" ] && cpath="$cpath:$bundle/rdma-core/usr/include"
    cd "$dir" || return 1
    seconds_of env CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ EP_NCCL_ROOT_DIR="$nccl" \
        EP_NVSHMEM_ROOT_DIR="$nvprefix" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$JOBS" CPATH="$cpath" \
        CUDA_HOME="$CUDA_HOME" "$PY" setup.py build
}

step_documented() {
    if [ $v2 = 1 ]; then documented_v2; return; fi
    local dir="$work/documented"
    rm -rf "$dir" && mkdir -p "$dir" && tar -xzf "$src" -C "$dir" --strip-components=1 || return 1
    cd "$dir" || return 1
    # DeepEP's README: NVSHMEM_DIR=/path/to/installed/nvshmem python setup.py build, with
    # the settings CUDA 13 + H200 + an IBGDA NVSHMEM need (measured by hand: 81 s, 16 cores).
    local cpath="$CUDA_HOME/include/cccl"
    [ -d "$bundle/rdma-core/usr/include" ] && cpath="$cpath:$bundle/rdma-core/usr/include"
    seconds_of env NVSHMEM_DIR="$nvprefix" TORCH_CUDA_ARCH_LIST=9.0 CPATH="$cpath" \
        CUDA_HOME="$CUDA_HOME" "$PY" setup.py build
}

# --force: install even if `compare` found a mismatch (it is in compare.log); the runtime
# check is what these steps prove.
step_negative() {
    "$X" adopt --python "$PY" --only deepep --force
    local rc=$?
    # Expected: status 1 *because* NVIDIA's NVSHMEM is still mapped; any other failure is
    # reported as status 3, which reads UNEXPECTED.
    if grep -q "NVIDIA's nvidia-nvshmem wheel is still installed" "$out/negative.log"; then
        echo "NEGATIVE CASE: the check failed and named NVIDIA's NVSHMEM (expected)"
        return $rc
    fi
    return 3
}

step_adopt() {
    "$X" adopt --python "$PY" --force
}

step_verify() {
    "$X" verify --python "$PY" --level static,runtime --expect-nccl 2.28.9 --expect-nvshmem 3.4.5 \
        --nvshmem-prefix "$site/nvidia/nvshmem" --nvshmem-option NVSHMEM_IBGDA_SUPPORT=ON --cuda-arch 90 \
        --target-glibc 2.39 --target-glibcxx 3.4.33 --report "$out/verify-adopted"
}

step_tests() {
    local dir="$work/deepep-tests"
    rm -rf "$dir" && mkdir -p "$dir" && tar -xzf "$src" -C "$dir" --strip-components=1 || return 1
    "$X" verify --python "$PY" --level tests,exit-clean --deepep-source "$dir" --report "$out/verify-tests"
}

# V2 against the adopted environment: V2's own duplicate-NCCL check at import, the legacy
# low-latency test and the elastic test, one process each (gpu/v2-probe.sh's steps, on
# the bundle's archives; nothing built or swapped there).
step_v2_tests() {
    PYTHON="$PY" CUDA_HOME="$CUDA_HOME" WORK="$work/v2probe" BUDGET_S="${V2_BUDGET_S:-300}" \
        "$repo/gpu/v2-probe.sh" "$bundle/mirror" "$out/v2" unpack ${V2_TESTS:-import legacy elastic}
    grep -q '^legacy .*rc=0 ' "$out/v2/summary.txt" && grep -q '^import .*rc=0 ' "$out/v2/summary.txt"
}

step_undo() {
    if [ "${KEEP_ADOPTED:-0}" = 1 ]; then echo "KEEP_ADOPTED=1: left adopted"; return 0; fi
    "$X" adopt --python "$PY" --undo || return
    fingerprint >"$out/env-after-undo.txt"
    if diff -u "$work/before.txt" "$out/env-after-undo.txt"; then
        echo "UNDO EXACT: the environment's NVSHMEM and DeepEP files and its distributions are as before"
    else
        echo "UNDO DIFFERS (see the diff above)"
        return 1
    fi
}

for s in "${steps[@]}"; do
    case "$s" in
        # Before: FAIL (torch maps NVIDIA's NVSHMEM), or "not run" (2) if torch alone maps none.
        check-before) step "$s" '1|2' ;;
        negative) step "$s" 1 ;;
        # 2: everything that ran passed; the intranode tests need more GPUs than one.
        tests) step "$s" '0|2' ;;
        *) step "$s" 0 ;;
    esac
done

cp -r "$COMMSTACK_HOME"/adopt "$out/adopt-records" 2>/dev/null
{
    echo
    printf '%-13s %4s %9s %9s  %s\n' step rc expected seconds verdict
    while IFS=$'\t' read -r name rc expected secs; do
        case "|$expected|" in *"|$rc|"*) verdict=ok ;; *) verdict=UNEXPECTED ;; esac
        printf '%-13s %4s %9s %9s  %s\n' "$name" "$rc" "$expected" "$secs" "$verdict"
    done <"$summary"
    echo
    grep -h '^SECONDS' "$out/build.log" 2>/dev/null | sed 's/^/cold build (xtask build deepep --force): /'
    grep -h '^SECONDS' "$out/noop.log" 2>/dev/null | sed 's/^/no-op xtask build deepep: /'
    grep -h '^SECONDS' "$out/documented.log" 2>/dev/null | sed 's/^/documented python setup.py build: /'
    grep -h '^BENCH' "$out/bench.log" 2>/dev/null
    grep -h 'NEGATIVE CASE\|UNDO EXACT\|UNDO DIFFERS' "$out"/*.log 2>/dev/null
    # DeepEP's tests and their exit-clean verdicts, every check with its status.
    for report in "$out"/verify-tests/verify-*.json; do
        [ -f "$report" ] && "$PY" - "$report" <<'PYEOF'
import json, sys
for level in json.load(open(sys.argv[1]))["levels"]:
    for c in level.get("checks", []):
        if "deepep-" in c["name"]:
            print(f"DeepEP test: {c['name']}: {c['status']}: {c.get('detail', '')}")
PYEOF
    done
    grep -h '=> ' "$out/check-before.log" "$out/negative.log" "$out/adopt.log" 2>/dev/null | sed 's/^ */runtime check: /'
} | tee "$out/summary.txt"
# The run's own status: 1 when any step's verdict is UNEXPECTED.
! grep -q ' UNEXPECTED$' "$out/summary.txt"
