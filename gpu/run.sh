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
#   doctor         `xtask doctor` (text + JSON), then the image's preflight (the bundle's
#                  commstack-doctor with its preflight.json) against this host: with the
#                  fabric the image's NVSHMEM is built for (says what IBGDA lacks here;
#                  its verdict is kept, not judged), then `--network none` (one node),
#                  whose verdict is the step's status: it must pass on the H200
#   gate           the exit-clean gate on a real NCCL process group (world size 1):
#                  crates/verify/gpu/pg_exit.py test_dirty must fail, test_clean pass
#   selftest-nvidia  commstack-selftest (1 GPU) against NVIDIA's NVSHMEM of the torch env
#   selftest-mps   the same self-test with 2 PEs on GPU 0 under a CUDA MPS daemon of the
#                  step's own (pipe/log dirs in WORK/mps; stopped after): `--gpus 1
#                  --pes-per-gpu 2`; then two ranks started by hand as a launcher would
#                  (RANK 0/1, LOCAL_RANK 0, rendezvous on loopback): only rank 0 given
#                  --seed (the other takes it: must pass), then different seeds (both must
#                  refuse, exit 2, "disagree on the seed"); then `xtask verify --level
#                  selftest --selftest-pes-per-gpu 2`, which starts and stops its own daemon
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
[ $# -ge 2 ] || { sed -n '2,46p' "$0"; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The GPU machine's stack, for every xtask command below (xtask reads COMMSTACK_STACK as
# --stack): without it they would find the default stack.toml, the Debian image's.
export COMMSTACK_STACK="${COMMSTACK_STACK:-$repo/stacks/gpu-adopt.toml}"
bundle="$(cd "$1" && pwd)" || exit 2
out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(facts doctor gate selftest-nvidia selftest-mps nvshmem verify-before dropin verify-after selftest-ours undo-dropin plot)

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
    local pf=("$bundle/bin/commstack-doctor" preflight --expectations "$bundle/preflight.json")
    [ -x "${pf[0]}" ] || { echo "no ${pf[0]}: make the bundle again with this checkout's \`cargo xtask gpu-bundle\`"; return 1; }
    cat "$bundle/preflight.json"
    "${pf[@]}" --json "$work/preflight-fabric.json"
    echo "PREFLIGHT (the image's fabric) EXIT $?"
    "${pf[@]}" --network none --json "$work/preflight-one-node.json"
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

step_selftest_mps() {
    local mps="$work/mps" rc
    mkdir -p "$mps/pipe" "$mps/log"
    export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
    nvidia-cuda-mps-control -d || { echo "cannot start the CUDA MPS daemon"; return 1; }
    mps_runs
    rc=$?
    echo quit | nvidia-cuda-mps-control
    cat "$mps/log/control.log" 2>/dev/null | tail -n 20
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    # verify's option: it starts a daemon of its own for the selftest level and stops it.
    "$X" verify --python "$PY" --level selftest --selftest "$bundle/bin/commstack-selftest" \
        --selftest-pes-per-gpu 2 --nvshmem-prefix "$site/nvidia/nvshmem" --report "$work/verify-mps" ||
        { echo "verify --selftest-pes-per-gpu 2 failed"; rc=1; }
    return $rc
}

mps_runs() { # the runs of selftest-mps, under the daemon step_selftest_mps started
    local bin="$bundle/bin/commstack-selftest" small=(--max-bytes 16M --pingpong-rounds 1000)
    local port=$((29000 + RANDOM % 1000)) ok=0 a b
    export LD_LIBRARY_PATH="$site/nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    "$bin" --gpus 1 --pes-per-gpu 2 --json "$work/selftest-mps.json"
    a=$?; echo "SELFTEST-MPS --gpus 1 --pes-per-gpu 2: exit $a (must be 0)"
    [ "$a" = 0 ] || ok=1
    # As a launcher starts them: RANK/WORLD_SIZE/LOCAL_RANK, the MPS variables by hand.
    local launcher=(WORLD_SIZE=2 LOCAL_RANK=0 COMMSTACK_RDZV_ADDR="127.0.0.1:$port"
        NVSHMEM_REMOTE_TRANSPORT=none NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME=lo
        NVSHMEM_IGNORE_CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1 CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50)
    env "${launcher[@]}" RANK=0 "$bin" --seed 7 "${small[@]}" --json "$work/mps-agreed.json" >"$work/mps-agreed-0.txt" 2>&1 &
    a=$!
    env "${launcher[@]}" RANK=1 "$bin" "${small[@]}" --json "$work/mps-agreed.json" >"$work/mps-agreed-1.txt" 2>&1
    b=$?; wait "$a"; a=$?
    echo "SEED AGREED: rank 0 exit $a, rank 1 exit $b (both must be 0)"; cat "$work/mps-agreed-1.txt" | tail -n 30
    [ "$a$b" = 00 ] || ok=1
    port=$((port + 1)); launcher[2]="COMMSTACK_RDZV_ADDR=127.0.0.1:$port"
    env "${launcher[@]}" RANK=0 "$bin" --seed 7 "${small[@]}" >"$work/mps-refused-0.txt" 2>&1 &
    a=$!
    env "${launcher[@]}" RANK=1 "$bin" --seed 8 "${small[@]}" >"$work/mps-refused-1.txt" 2>&1
    b=$?; wait "$a"; a=$?
    echo "SEEDS DIFFER: rank 0 exit $a, rank 1 exit $b (both must be 2, refused)"
    tail -n 3 "$work/mps-refused-0.txt" "$work/mps-refused-1.txt"
    [ "$a$b" = 22 ] && grep -q 'disagree on the seed' "$work/mps-refused-0.txt" &&
        grep -q 'disagree on the seed' "$work/mps-refused-1.txt" || ok=1
    return $ok
}

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

# The shape of an ELF file with nvcc's per-build ids taken out: its sections and their
# sizes, and its symbols with every 8-hex module id (nvcc hashes the source file's physical
# path into `__fatbinwrap_<id>_...`, `__nv_static_NN__<id>_...`) replaced by ID. The device
# code containers (*fatbin*) are compared by name only: they hold the device ELF with those
# ids, compressed, so their size moves with the ids (seen: the same .cu compiled -rdc in two
# directories gives __nv_relfatbin of 0x608 and 0x600 bytes, all else equal).
elf_shape() {
    readelf -SW "$1" | awk '/^ *\[ *[0-9]+\]/ {sub(/^ *\[ *[0-9]+\] */, ""); print $1, ($1 ~ /fatbin/ ? "-" : $5)}'
    nm -a "$1" 2>/dev/null | awk '{print $NF}' | sed -E 's/[0-9a-f]{8}/ID/g' | sort
}

# same_but_ids A B: 0 when two ELF files or ar archives of ELF members differ only in nvcc's
# module ids (the same sections of the same sizes, the same symbols but for the ids).
same_but_ids() {
    local a="$1" b="$2" t
    case "$a" in
        *.a) t="$(mktemp -d)"; mkdir "$t/a" "$t/b"
             (cd "$t/a" && ar x "$a") && (cd "$t/b" && ar x "$b") || { rm -rf "$t"; return 1; }
             [ "$(ar t "$a")" = "$(ar t "$b")" ] || { echo "  members differ"; rm -rf "$t"; return 1; }
             local m bad=0
             for m in $(ar t "$a" | sort -u); do
                 cmp -s "$t/a/$m" "$t/b/$m" && continue
                 diff -q <(elf_shape "$t/a/$m") <(elf_shape "$t/b/$m") >/dev/null \
                     || { echo "  member $m differs beyond module ids:"; diff <(elf_shape "$t/a/$m") <(elf_shape "$t/b/$m") | sed -n '1,10p'; bad=1; }
             done
             rm -rf "$t"; [ $bad = 0 ] || return 1 ;;
        *) diff -q <(elf_shape "$a") <(elf_shape "$b") >/dev/null \
               || { diff <(elf_shape "$a") <(elf_shape "$b") | sed -n '1,10p'; return 1; } ;;
    esac
    same_device_code "$a" "$b"
}

# The device code itself, where CUDA's disassembler is at hand (the GPU machine's
# /usr/local/cuda/bin): the SASS of both files with the module ids taken out.
same_device_code() {
    local cuobjdump="${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump"
    [ -x "$cuobjdump" ] || { echo "  device code not compared: no $cuobjdump"; return 0; }
    local sa sb
    sa="$("$cuobjdump" -sass "$1" 2>&1)" sb="$("$cuobjdump" -sass "$2" 2>&1)"
    case "$sa$sb" in *fatal*) echo "  device code not compared: $(echo "$sa$sb" | grep -m1 fatal)"; return 0 ;; esac
    if [ "$(sed -E 's/[0-9a-f]{8}/ID/g' <<<"$sa")" = "$(sed -E 's/[0-9a-f]{8}/ID/g' <<<"$sb")" ]; then
        echo "  device code (SASS, ids taken out) the same"
    else
        echo "  device code (SASS) differs beyond module ids"; return 1
    fi
}

step_nvshmem_static() { # the same build with the static library (A/B), and what differs
    nvshmem_build nvshmem-static --static-lib || return
    [ -f "$work/nvshmem.step" ] || { echo "run the nvshmem step first to compare"; return 1; }
    local a b f differs beyond
    a="$(cat "$work/nvshmem.step")nvshmem" b="$(cat "$work/nvshmem-static.step")nvshmem"
    # Each build runs in a directory named by its step key (static_lib is in the key), and
    # nvcc -rdc names device symbols by a hash of the source's path: so the two builds'
    # device code is expected to differ in those ids, and in nothing else.
    echo "== files of the default install that differ from the static-lib install:"
    while read -r f; do
        if [ -L "$a/$f" ]; then [ "$(readlink "$a/$f")" = "$(readlink "$b/$f")" ] && continue
        else cmp -s "$a/$f" "$b/$f" && continue; fi
        echo "DIFFERS $f ($(cmp -l "$a/$f" "$b/$f" 2>/dev/null | wc -l) bytes of $(stat -c %s "$a/$f"))"
        case "$f" in
            *.so*|*.a) if same_but_ids "$a/$f" "$b/$f"; then echo "  ONLY-MODULE-IDS $f: same sections and sizes, same symbols but for nvcc's module ids"
                       else echo "BEYOND-IDS $f"; fi
                       # A few of the strings that differ, for the record.
                       diff <(strings -n 12 "$a/$f" | sort -u) <(strings -n 12 "$b/$f" | sort -u) | sed -n '1,8p' ;;
            *) echo "BEYOND-IDS $f (not an ELF file)"; diff "$a/$f" "$b/$f" | sed -n '1,10p' ;;
        esac
    done < <(cd "$a" && find lib include \( -type f -o -type l \) | sort) | tee "$work/static-vs-default.txt"
    differs="$(grep -c '^DIFFERS' "$work/static-vs-default.txt")"
    beyond="$(grep -c '^BEYOND-IDS' "$work/static-vs-default.txt")"
    echo "== only in the static-lib install:"
    # sed, not head: head closing the pipe early would fail the step (SIGPIPE, status 141).
    { diff <(cd "$a" && find . | sort) <(cd "$b" && find . | sort) || true; } | grep '^>' | sed -n '1,50p'
    # The verdict: the static-lib build adds files and changes none of the default's beyond
    # nvcc's module ids.
    echo "$differs files differ, $beyond of them beyond nvcc's module ids"
    [ "$beyond" = 0 ]
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
