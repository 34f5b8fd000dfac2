#!/usr/bin/env bash
# DeepEP V2 (dd758ca) on the GPU machine, by script: the evidence issue 29 needs.
# Builds NCCL 2.30.7 (sm_90 only) and DeepEP dd758ca (+ fmt a4c7e171 in third-party/fmt)
# from the mirror's archives, swaps the torch env's libnccl.so.2 for the 2.30.7 build
# (backed up, sha256 listed, ALWAYS restored by an EXIT trap and checked equal), then runs
# `import deep_ep`, the legacy low-latency test and the elastic test (1 process) with the
# evidence a crash needs (faulthandler, CUDA_LAUNCH_BLOCKING=1, NCCL_DEBUG=INFO, a native
# SIGSEGV backtrace from an LD_PRELOADed handler, cuda-gdb/gdb batch backtrace,
# compute-sanitizer), and records the JIT cache and the extension's links.
#
#   gpu/v2-probe.sh SCRATCH OUT [STEP...]
#
# SCRATCH holds the three archives, as in ../shared/mirror:
#   nccl-2.30.7-1.tar.gz, DeepEP-dd758caf451848bd150e1046af3d0a73e5fff38d.tar.gz,
#   fmt-a4c7e17133ee9cb6a2f45545f6e974dd3c393efa.tar.gz
# (the device tool sends the session's checkout, not a helper's worktree: copy them to an
# ignored dir of that checkout such as scratch/v2 and `run` with carry=["scratch/v2"],
# command `gpu/v2-probe.sh scratch/v2 $OUT`; docs/deepep-v2.md has the full command).
#
# Steps (default: all, in this order; each logs to WORK/logs/<step>.log, a failing step
# never stops the others; builds are skipped when WORK already holds them):
#   facts     GPU, driver, nvidia-smi nvlink -s, nvcc, torch, the env's NCCL/NVSHMEM, tools
#   nccl      NCCL 2.30.7: make -j$JOBS src.build NVCC_GENCODE=sm_90 (timed)
#   deepep    DeepEP dd758ca: setup.py build into WORK/deepep-build-<cxx> (timed), with
#             EP_NCCL_ROOT_DIR=<nccl build>, EP_NVSHMEM_ROOT_DIR=<env's nvidia/nvshmem>,
#             TORCH_CUDA_ARCH_LIST=9.0, EP_JIT_CACHE_DIR=WORK/jit-cache (both baked in envs.py),
#             CC/CXX per DEEPEP_CXX; then checks that _C NEEDs libstdc++.so.6 and carries no
#             libstdc++ of its own (a static copy crashes V2's JIT: docs/deepep-v2.md)
#   unpack    only unpack DeepEP (+ fmt) for the tests: `import`, `legacy` and `elastic` then
#             run the DeepEP installed in the environment (e.g. by `xtask adopt`)
#   links     ldd / readelf -d of deep_ep/_C*.so (which libnccl, libnvshmem)
#   swap      back up the env's libnccl.so.2 (sha256 listing), put the 2.30.7 build there
#   import    import deep_ep (V2's check_nccl_so), the libnccl mapped
#   elastic   tests/elastic/test_ep.py --num-processes 1 (faulthandler, CUDA_LAUNCH_BLOCKING=1,
#             NCCL_DEBUG=INFO, EP_BUFFER_DEBUG/EP_JIT_DEBUG, SIGSEGV backtrace)
#   elastic-owncomm  the same test, in-process (spawn replaced by a direct call), first case
#             only, with EP_REUSE_NCCL_COMM=0 (DeepEP makes its own NCCL comm, not torch's)
#   legacy    tests/legacy/test_low_latency.py --num-processes 1
#   jit       the JIT cache's files (names, sizes) and a recompile of one cached kernel.cu
#             in another directory: is the cubin byte-identical (reproducible AOT)?
#   gdb       the elastic test in-process (torch's comm reused, as by default) under gdb
#             (or cuda-gdb, which debugs host code too) -batch: every thread's backtrace
#   sanitizer the elastic test in-process under compute-sanitizer (memcheck)
#   cxx       the C++ toolchain torch's BuildExtension picks (CC/CXX), and a minimal A/B with
#             no GPU: DeepEP's JIT include regex in a tiny .so built like _C.so by that g++
#             and by the system g++, called after `import torch` and without it
# "swap" is undone by the EXIT trap whatever happens: the backup is copied back and its
# sha256 compared with the listing; the output says "RESTORE OK" or "RESTORE FAILED".
#
# Environment: PYTHON (default python3: the torch env), CUDA_HOME (default /usr/local/cuda),
# JOBS (default nproc), WORK (default /tmp/v2probe: builds kept there between runs),
# BUDGET_S (default 540: steps after this many seconds are skipped, timeouts shrink to fit),
# ELASTIC_ARGS (default none: the test as it is; e.g. --test-first-only --skip-perf-test),
# DEEPEP_CXX: system (default: CC=/usr/bin/gcc CXX=/usr/bin/g++, linked against the process's
# libstdc++.so.6) or env (the environment's CC/CXX as they are: on the GPU machine
# /opt/gcc/bin/g++, which links libstdc++.a into _C and reproduces the elastic SIGSEGV).
# OUT receives summary.txt, logs.tgz (every log) and the main logs as plain files.

set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,/^$/p' "$0"; exit 2; }
T_START=$(date +%s)
scratch="$(cd "$1" && pwd)" || exit 2
mkdir -p "$2" && out="$(cd "$2" && pwd)" || exit 2
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(facts cxx nccl deepep links swap import elastic elastic-owncomm legacy jit gdb sanitizer)

NCCL_TGZ="$scratch/nccl-2.30.7-1.tar.gz"
DEEPEP_REV=dd758caf451848bd150e1046af3d0a73e5fff38d
FMT_REV=a4c7e17133ee9cb6a2f45545f6e974dd3c393efa
DEEPEP_TGZ="$scratch/DeepEP-$DEEPEP_REV.tar.gz"
FMT_TGZ="$scratch/fmt-$FMT_REV.tar.gz"
for f in "$NCCL_TGZ" "$DEEPEP_TGZ" "$FMT_TGZ"; do
    [ -f "$f" ] || { echo "missing $f: copy it from ../shared/mirror into $scratch"; exit 2; }
done

PY="${PYTHON:-python3}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
JOBS="${JOBS:-$(nproc)}"
WORK="${WORK:-/tmp/v2probe}"
BUDGET_S="${BUDGET_S:-540}"
DEEPEP_CXX="${DEEPEP_CXX:-system}"
case "$DEEPEP_CXX" in system|env) ;; *) echo "DEEPEP_CXX must be system or env, not $DEEPEP_CXX"; exit 2;; esac
LOGS="$WORK/logs"
mkdir -p "$WORK" "$LOGS"
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
# Shared multi-GPU hosts must keep NVLink multicast off; harmless on one GPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1

NCCL_SRC="$WORK/nccl-2.30.7-1"
NCCL_BUILD="$NCCL_SRC/build"
EP_SRC="$WORK/DeepEP-$DEEPEP_REV"
EP_BUILD="$WORK/deepep-build-$DEEPEP_CXX"
JIT_CACHE="$WORK/jit-cache"
SUMMARY="$WORK/summary.txt"
: >"$SUMMARY"

nvidia_dir() { # nvidia_dir nccl|nvshmem: the env's nvidia/<name> package directory
    "$PY" -c "import nvidia.$1 as m; print(list(m.__path__)[0])" 2>/dev/null
}
ENV_NCCL="$(nvidia_dir nccl)"
ENV_NVSHMEM="$(nvidia_dir nvshmem)"
ENV_LIBNCCL="$ENV_NCCL/lib/libnccl.so.2"
BACKUP="$WORK/nccl-backup"

note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((BUDGET_S - ($(date +%s) - T_START))); }
cap() { # cap SECONDS: a step's timeout, shrunk to what the budget leaves (minus 25 s for the end)
    local l; l=$(( $(left) - 25 )); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}

step() { # step NAME: runs step_NAME into logs/NAME.log, records status and seconds
    local name="$1" t0 rc
    if [ "$(left)" -lt 40 ]; then note "$(printf '%-16s SKIPPED (budget of %ss spent)' "$name" "$BUDGET_S")"; return; fi
    t0=$(date +%s.%N)
    echo "::: $name ($(left)s of budget left)" >&2
    ( set -x; "step_${name//-/_}" ) >"$LOGS/$name.log" 2>&1
    rc=$?
    note "$(printf '%-16s rc=%-4s %6.1fs' "$name" "$rc" "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')")"
    tail -n 12 "$LOGS/$name.log" | sed "s/^/  [$name] /" >&2
}

# ---- restore: always, whatever happened ----------------------------------------------
restore() {
    [ -f "$BACKUP/libnccl.so.2" ] || return 0
    cp -f "$BACKUP/libnccl.so.2" "$ENV_LIBNCCL"
    if (cd "$(dirname "$ENV_LIBNCCL")" && sha256sum -c --quiet "$BACKUP/SHA256SUMS"); then
        note "RESTORE OK: $ENV_LIBNCCL is byte for byte the backup ($(cut -c1-16 "$BACKUP/SHA256SUMS")...)"
        rm -rf "$BACKUP"
    else
        note "RESTORE FAILED: $ENV_LIBNCCL differs from $BACKUP/SHA256SUMS; the backup stays in $BACKUP"
    fi
}
finish() {
    restore
    note "total ${SECONDS}s (budget ${BUDGET_S}s)"
    cp "$SUMMARY" "$out/summary.txt"
    for f in elastic elastic-owncomm import facts legacy; do
        [ -f "$LOGS/$f.log" ] && cp "$LOGS/$f.log" "$out/$f.log"
    done
    tar -C "$WORK" -czf "$out/logs.tgz" logs summary.txt 2>/dev/null
    echo "===== summary"; cat "$SUMMARY"
}
trap finish EXIT
trap 'exit 130' INT TERM

# ---- helpers --------------------------------------------------------------------------
ep_pythonpath() { ls -d "$EP_BUILD"/lib.*/ 2>/dev/null | head -1; }

segv_handler() { # a SIGSEGV/SIGABRT/SIGBUS handler printing the native backtrace (no gdb here)
    local so="$WORK/segv_bt.so"
    [ -f "$so" ] && { echo "$so"; return; }
    cat >"$WORK/segv_bt.c" <<'EOF'
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static char altstack[1 << 16];
static void on_signal(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    void *frames[64];
    char head[160];
    int n = snprintf(head, sizeof head, "\n=== segv_bt: signal %d (%s) at address %p, pid %d, native backtrace:\n",
                     sig, strsignal(sig), si ? si->si_addr : 0, (int)getpid());
    write(2, head, n);
    int depth = backtrace(frames, 64);
    backtrace_symbols_fd(frames, depth, 2);
    write(2, "=== segv_bt: end\n", 17);
    signal(sig, SIG_DFL);
    raise(sig);
}
__attribute__((constructor)) static void install(void) {
    stack_t ss = { .ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0 };
    sigaltstack(&ss, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, 0);
    sigaction(SIGBUS, &sa, 0);
    sigaction(SIGABRT, &sa, 0);
}
EOF
    gcc -shared -fPIC -O1 -o "$so" "$WORK/segv_bt.c" >&2 && echo "$so"
}

symbolize() { # symbolize LOG: addr2line for frames "lib.so(+0xOFF)" of segv_bt's backtraces
    command -v addr2line >/dev/null || { echo "no addr2line"; return; }
    sed -n '/=== segv_bt: signal/,/=== segv_bt: end/p' "$1" | grep -oE '^[^ (]+\((\+0x[0-9a-f]+|[^)+]*\+0x[0-9a-f]+)\)' |
        while IFS= read -r fr; do
            local lib="${fr%%(*}" off="${fr#*(}"; off="${off%)}"
            case "$off" in +0x*) echo "$fr -> $(addr2line -f -C -e "$lib" "${off#+}" 2>/dev/null | paste -sd' ')";;
                           *) echo "$fr -> $(echo "$off" | sed 's/+0x.*//' | c++filt 2>/dev/null)";; esac
        done
}

inproc_driver() { # test_ep.py's test_loop in this process (spawn replaced by a direct call)
    cat >"$WORK/inproc_test_ep.py" <<'EOF'
import runpy, sys, torch.multiprocessing as mp
def spawn(fn, args=(), nprocs=1, **kw):
    assert nprocs == 1, nprocs
    fn(0, *args)
mp.spawn = spawn
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')
EOF
    echo "$WORK/inproc_test_ep.py"
}

ep_env() { # the environment every DeepEP run gets
    PYTHONPATH="$(ep_pythonpath)"
    export PYTHONPATH EP_JIT_CACHE_DIR="$JIT_CACHE"
    export MASTER_ADDR=127.0.0.1 MASTER_PORT="${1:-8361}"
}

# ---- steps ----------------------------------------------------------------------------
step_facts() {
    nvidia-smi
    nvidia-smi topo -m
    echo "== nvidia-smi nvlink -s (what DeepEP's get_nvlink_gbs parses):"
    nvidia-smi nvlink -s; echo "(exit $?)"
    nvidia-smi nvlink -s | od -c | head -20
    "$CUDA_HOME/bin/nvcc" --version
    gcc --version | head -1; nproc; free -g; df -h /tmp "$WORK"
    "$PY" -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl(compiled)", torch.cuda.nccl.version())'
    "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-nccl|nvidia-nvshmem|numpy|setuptools|ninja)' || true
    echo "env NCCL: $ENV_NCCL"; ls -la "$ENV_NCCL" "$ENV_NCCL/lib" "$ENV_NCCL/include" 2>&1
    find "$ENV_NCCL/include" -maxdepth 2 | head -30
    echo "env NVSHMEM: $ENV_NVSHMEM"; ls -la "$ENV_NVSHMEM/lib" 2>&1
    for t in gdb cuda-gdb compute-sanitizer addr2line c++filt nvcc cuobjdump; do
        printf '%-18s %s\n' "$t" "$(command -v "$t" || ls "$CUDA_HOME/bin/$t" 2>/dev/null || echo MISSING)"
    done
    echo "== cuda.h: driver entry points DeepEP dlsym()s by name (lazy_driver.hpp) that cuda.h #defines to a versioned symbol:"
    grep -nE '#define (cuModuleLoad|cuModuleGetFunction|cuLaunchKernelEx|cuStreamBatchMemOp|cuMemGetAddressRange|cuMemCreate|cuMemMap|cuMemSetAccess|cuFuncSetAttribute|cuDeviceGetAttribute|cuMemAddressReserve|cuGetErrorString)\b' "$CUDA_HOME/include/cuda.h"
    uname -a; cat /proc/version
}

step_nccl() {
    if [ -f "$NCCL_BUILD/lib/libnccl.so.2.30.7" ]; then echo "kept from an earlier run: $NCCL_BUILD"; return 0; fi
    rm -rf "$NCCL_SRC"; tar -xzf "$NCCL_TGZ" -C "$WORK" || return
    local t0; t0=$(date +%s.%N)
    make -C "$NCCL_SRC" -j"$JOBS" src.build CUDA_HOME="$CUDA_HOME" \
        NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 >"$LOGS/nccl-make.log" 2>&1 || { tail -40 "$LOGS/nccl-make.log"; return 1; }
    echo "NCCL BUILD SECONDS $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" | tee -a "$SUMMARY"
    ls -la "$NCCL_BUILD/lib"; find "$NCCL_BUILD/include" | head -40
}

step_unpack() { # the DeepEP source (with fmt) for the tests, without building it: for an
    # environment where DeepEP is installed already (crates/deepep/gpu/run-deepep.sh's V2 steps)
    [ -f "$EP_SRC/setup.py" ] && { echo "kept: $EP_SRC"; return 0; }
    tar -xzf "$DEEPEP_TGZ" -C "$WORK" && tar -xzf "$FMT_TGZ" -C "$EP_SRC/third-party/fmt" --strip-components=1
}

step_deepep() {
    if [ -n "$(ls "$EP_BUILD"/lib.*/deep_ep/_C*.so 2>/dev/null)" ]; then echo "kept from an earlier run: $EP_BUILD"; return 0; fi
    [ -f "$NCCL_BUILD/lib/libnccl.so.2.30.7" ] || { echo "no NCCL build: run the nccl step"; return 1; }
    rm -rf "$EP_SRC" "$EP_BUILD"
    tar -xzf "$DEEPEP_TGZ" -C "$WORK" && tar -xzf "$FMT_TGZ" -C "$EP_SRC/third-party/fmt" --strip-components=1 || return
    ls "$EP_SRC/third-party/fmt/include/fmt" | head
    local t0; t0=$(date +%s.%N)
    if [ "$DEEPEP_CXX" = system ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
    echo "compilers: CC=${CC:-} CXX=${CXX:-} CUDAHOSTCXX=${CUDAHOSTCXX:-} ($DEEPEP_CXX)" | tee -a "$SUMMARY"
    ( cd "$EP_SRC" && GIT_DIR=/nonexistent EP_NCCL_ROOT_DIR="$NCCL_BUILD" EP_NVSHMEM_ROOT_DIR="$ENV_NVSHMEM" \
        EP_JIT_CACHE_DIR="$JIT_CACHE" TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS="$JOBS" \
        "$PY" setup.py build --build-base "$EP_BUILD" ) >"$LOGS/deepep-build.log" 2>&1 || { tail -60 "$LOGS/deepep-build.log"; return 1; }
    echo "DEEPEP BUILD SECONDS $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')" | tee -a "$SUMMARY"
    grep -A12 '^Build summary' "$LOGS/deepep-build.log"
    cat "$(ep_pythonpath)/deep_ep/envs.py"
    find "$(ep_pythonpath)/deep_ep" -maxdepth 1 -type f -exec ls -la {} +
    stdcxx_check
}

stdcxx_check() { # _C must use the process's libstdc++.so.6, not carry a copy of its own
    local so n own; so="$(ls "$(ep_pythonpath)"/deep_ep/_C*.so)" || return
    n="$(readelf -dW "$so" | grep -c 'NEEDED.*libstdc++\.so')"
    own="$(nm -D --defined-only "$so" | grep -c -E ' _ZNSt6locale|_ZNKSt[0-9]+__codecvt')"
    if [ "$n" -ge 1 ] && [ "$own" = 0 ]; then note "LIBSTDC++ OK: _C NEEDs libstdc++.so.6 and defines none of its internals"
    else note "LIBSTDC++ BAD: _C NEEDs libstdc++.so.6: $n; libstdc++ internals it defines: $own (static copy: std::regex in V2's JIT will crash after import torch)"; return 1; fi
}

step_links() {
    local so; so="$(ls "$(ep_pythonpath)"/deep_ep/_C*.so)" || return
    ls -la "$so"
    readelf -dW "$so" | grep -E 'NEEDED|RPATH|RUNPATH'
    ldd "$so"
    echo "== undefined nccl/nvshmem symbols (first 40):"
    nm -D --undefined-only "$so" | grep -iE 'nccl|nvshmem' | head -40
    stdcxx_check
}

step_swap() {
    [ -f "$ENV_LIBNCCL" ] || { echo "no $ENV_LIBNCCL"; return 1; }
    [ -f "$NCCL_BUILD/lib/libnccl.so.2.30.7" ] || { echo "no NCCL build"; return 1; }
    if [ ! -f "$BACKUP/libnccl.so.2" ]; then
        mkdir -p "$BACKUP" && cp -p "$ENV_LIBNCCL" "$BACKUP/libnccl.so.2" || return
        (cd "$(dirname "$ENV_LIBNCCL")" && sha256sum libnccl.so.2) >"$BACKUP/SHA256SUMS"
    fi
    echo "backup listing:"; cat "$BACKUP/SHA256SUMS" | tee -a "$SUMMARY"
    cp -f "$NCCL_BUILD/lib/libnccl.so.2.30.7" "$ENV_LIBNCCL" || return
    sha256sum "$ENV_LIBNCCL" "$NCCL_BUILD/lib/libnccl.so.2.30.7"
}

step_import() {
    ep_env
    "$PY" - <<'EOF'
import deep_ep, torch
print("deep_ep", deep_ep.__version__, deep_ep.__file__)
from deep_ep.utils.find_pkgs import find_nccl_root, find_nvshmem_root
print("find_nccl_root", find_nccl_root(), "find_nvshmem_root", find_nvshmem_root())
print("cuda_home", deep_ep.find_cuda_home())
import ctypes; v = ctypes.c_int(); ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(v)); print("ncclGetVersion", v.value)
print("".join(sorted({l.split()[-1] + "\n" for l in open("/proc/self/maps") if "libnccl" in l or "nvshmem" in l or "_C." in l})))
EOF
}

elastic_env() {
    ep_env "$1"
    export PYTHONFAULTHANDLER=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL \
        EP_BUFFER_DEBUG=1 EP_JIT_DEBUG=1 EP_JIT_PRINT_COMPILER_COMMAND=1 TORCH_SHOW_CPP_STACKTRACES=1 \
        CUDA_LAUNCH_BLOCKING=1
}

step_elastic() {
    local so rc; so="$(segv_handler)"
    elastic_env 8361
    ( cd "$EP_SRC" && LD_PRELOAD="$so" timeout -k 5 "$(cap 200)" \
        "$PY" -X faulthandler tests/elastic/test_ep.py --num-processes 1 ${ELASTIC_ARGS:-} )
    rc=$?
    echo "EXIT STATUS $rc"
    symbolize "$LOGS/elastic.log"
    return $rc
}

step_elastic_owncomm() {
    local so rc; so="$(segv_handler)"
    elastic_env 8362
    export EP_REUSE_NCCL_COMM=0
    ( cd "$EP_SRC" && LD_PRELOAD="$so" timeout -k 5 "$(cap 150)" \
        "$PY" -X faulthandler "$(inproc_driver)" tests/elastic/test_ep.py --num-processes 1 --test-first-only --skip-perf-test )
    rc=$?
    echo "EXIT STATUS $rc"
    symbolize "$LOGS/elastic-owncomm.log"
    return $rc
}

step_legacy() {
    ep_env 8363
    ( cd "$EP_SRC" && timeout -k 5 "$(cap 150)" "$PY" -X faulthandler tests/legacy/test_low_latency.py --num-processes 1 )
}

step_jit() {
    echo "== $JIT_CACHE (EP_JIT_CACHE_DIR): files, sizes"
    find "$JIT_CACHE" -type f -printf '%10s  %P\n' 2>/dev/null | sort -k2
    du -sh "$JIT_CACHE"
    # Recompile one cached kernel elsewhere with the flags the JIT printed: same cubin bytes?
    local cmd dir flags src
    cmd="$(grep -h -m1 '^Running NVCC command:' "$LOGS"/elastic*.log)" || { echo "no NVCC command logged"; return 1; }
    echo "$cmd"
    flags="${cmd#* -cubin -o }"; flags="${flags#* }"
    dir="$(ls -d "$JIT_CACHE"/cache/kernel.barrier.* "$JIT_CACHE"/cache/kernel.* 2>/dev/null | head -1)"
    [ -n "$dir" ] || { echo "no cache entry"; return 1; }
    head -3 "$dir/kernel.cu"
    src="$WORK/jit-repro/elsewhere"; rm -rf "$src"; mkdir -p "$src"; cp "$dir/kernel.cu" "$src/"
    local t0; t0=$(date +%s.%N)
    (cd "$WORK/jit-repro" && eval "nvcc $src/kernel.cu -cubin -o $src/kernel.cubin $flags") || return
    echo "RECOMPILE SECONDS $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}') for $(basename "$dir")"
    sha256sum "$dir/kernel.cubin" "$src/kernel.cubin"
    if cmp -s "$dir/kernel.cubin" "$src/kernel.cubin"; then note "JIT REPRO: $(basename "$dir") recompiled elsewhere: cubin byte-identical"
    else note "JIT REPRO: $(basename "$dir") recompiled elsewhere: cubin DIFFERS"; cmp "$dir/kernel.cubin" "$src/kernel.cubin" | head -3; fi
}

step_gdb() {
    local dbg; dbg="$(command -v gdb || command -v cuda-gdb || ls "$CUDA_HOME/bin/cuda-gdb" 2>/dev/null)" || { echo "no gdb, no cuda-gdb"; return 1; }
    echo "debugger: $dbg"
    elastic_env 8364
    unset PYTHONFAULTHANDLER EP_JIT_DEBUG
    ( cd "$EP_SRC" && timeout -k 5 "$(cap 180)" "$dbg" -batch -nx -ex 'set pagination off' -ex 'set confirm off' \
        -ex 'handle SIGPIPE SIGUSR1 SIGUSR2 nostop noprint' -ex run -ex 'info signal' -ex 'thread apply all bt 25' -ex 'bt full 12' \
        --args "$PY" "$(inproc_driver)" tests/elastic/test_ep.py --num-processes 1 --test-first-only --skip-perf-test )
}

step_sanitizer() {
    local cs; cs="$(command -v compute-sanitizer || ls "$CUDA_HOME/bin/compute-sanitizer" 2>/dev/null)" || { echo "no compute-sanitizer"; return 1; }
    ep_env 8365
    ( cd "$EP_SRC" && timeout -k 5 "$(cap 180)" "$cs" --tool memcheck --print-limit 20 \
        "$PY" "$(inproc_driver)" tests/elastic/test_ep.py --num-processes 1 --test-first-only --skip-perf-test )
}

step_cxx() {
    env | grep -E '^(CC|CXX|CUDAHOSTCXX|LDSHARED|CFLAGS|CXXFLAGS|LDFLAGS)=' || echo "no CC/CXX/LDSHARED in the environment"
    "$PY" -c 'import sysconfig as s; print("sysconfig CC", s.get_config_var("CC"), "| CXX", s.get_config_var("CXX"), "| LDSHARED", s.get_config_var("LDSHARED"))'
    local gxx cxx="${CXX:-c++}" so rc
    for gxx in "$cxx" /usr/bin/g++; do
        echo "== $gxx: $(command -v "$gxx") $("$gxx" --version | head -1)"
        echo "   libstdc++.so: $("$gxx" -print-file-name=libstdc++.so)  libstdc++.a: $("$gxx" -print-file-name=libstdc++.a)"
        "$gxx" -dumpspecs | grep -n -i -E 'static-libstdc|static-libgcc' | head -5
        "$gxx" -v 2>&1 | grep -o -E -- '--(with|enable|disable)-[a-z-]*(static|shared|libstdcxx)[a-z=-]*' | sort -u
    done
    cat >"$WORK/regex_probe.cpp" <<'EOF2'
#include <regex>
#include <string>
// DeepEP's JIT include parser (csrc/jit/include_parser.hpp get_includes): this regex, at the first dispatch
extern "C" int probe() {
    const std::regex pattern(R"(#\s*include\s*[<"][^>"]+[>"])");
    const std::string code = "#include <deep_ep/impls/dispatch.cuh>";
    return std::regex_search(code, pattern) ? 1 : 0;
}
EOF2
    so="$(segv_handler)"
    for gxx in "$cxx" /usr/bin/g++; do
        local tag; tag="$(basename "$(dirname "$(dirname "$(command -v "$gxx")")")")-$(basename "$gxx")"
        # linked as BuildExtension links deep_ep/_C (deepep-build.log): -shared -Wl,-O1 -Wl,-Bsymbolic-functions
        "$gxx" -O3 -fPIC -std=c++17 -shared -Wl,-O1 -Wl,-Bsymbolic-functions "$WORK/regex_probe.cpp" -o "$WORK/regex_probe.$tag.so" || continue
        echo "== regex_probe.$tag.so NEEDED: $(readelf -dW "$WORK/regex_probe.$tag.so" | grep NEEDED | grep -o '\[.*\]' | paste -sd' ')"
        echo "   libstdc++ internals it exports: $(nm -D --defined-only "$WORK/regex_probe.$tag.so" | grep -c -E '_ZNKSt20__codecvt|_ZNSt6locale')"
        for pre in "import torch" "pass"; do
            LD_PRELOAD="$so" "$PY" -c "$pre
import ctypes; print('probe() =', ctypes.CDLL('$WORK/regex_probe.$tag.so').probe())" >"$WORK/probe.out" 2>&1
            rc=$?
            note "CXX A/B: $tag, after '$pre': exit $rc ($(grep -m1 -E 'probe\(\) =|signal' "$WORK/probe.out"))"
            grep -E '_C|regex|locale|facet|codecvt' "$WORK/probe.out" | head -8
        done
    done
    echo "== deep_ep/_C: NEEDED libstdc++? exported libstdc++ internals:"
    local c; c="$(ls "$(ep_pythonpath)"/deep_ep/_C*.so 2>/dev/null)" && {
        readelf -dW "$c" | grep -c 'libstdc++' ; nm -D --defined-only "$c" | grep -c -E '_ZNKSt20__codecvt|_ZNSt6locale'; }
    true
}

for s in "${steps[@]}"; do
    declare -F "step_${s//-/_}" >/dev/null || { note "unknown step $s"; continue; }
    step "$s"
done
