#!/usr/bin/env bash
# Runs commstack-selftest from a GPU bundle (no Rust, no network needed) and writes
# its results into an output directory.
#
#   run-selftest.sh [OUT_DIR] [-- extra commstack-selftest arguments]
#
# Bundle layout it expects (override with the variables in brackets):
#   <bundle>/bin/commstack-selftest           [COMMSTACK_SELFTEST]
#   <bundle>/lib/nvshmem/libnvshmem_host.so.3 [COMMSTACK_NVSHMEM_LIB = the directory]
#   <bundle>/lib/nvshmem/nvshmem_bootstrap_uid.so.3
#   <bundle>/kernels/gpu/run-selftest.sh      (this script; <bundle> = two levels up,
#                                              or COMMSTACK_BUNDLE)
# Environment: GPUS (default 1), SEED (default: fresh, recorded in the JSON),
# REQUIRE_PUT_COPY_RATIO (default 0.85, the self-test's benchmark bar; empty to skip),
# and any NVSHMEM_* variable (passed through; e.g. NVSHMEM_DEBUG=INFO).
#
# Writes OUT_DIR/selftest-<N>gpu.{json,txt,log,exit}; exits with the selftest's status:
# 0 ok, 1 wrong data, 2 error, 3 put/copy ratio below the bar.

set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle="${COMMSTACK_BUNDLE:-$(cd "$here/../.." && pwd)}"
bin="${COMMSTACK_SELFTEST:-$bundle/bin/commstack-selftest}"
nvshmem_lib="${COMMSTACK_NVSHMEM_LIB:-$bundle/lib/nvshmem}"
gpus="${GPUS:-1}"
ratio="${REQUIRE_PUT_COPY_RATIO-0.85}"

out="${1:-$PWD/selftest-results}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift

fail() { echo "run-selftest: $*" >&2; exit 2; }

[ -x "$bin" ] || fail "no executable at $bin (set COMMSTACK_SELFTEST)"
for f in libnvshmem_host.so.3 nvshmem_bootstrap_uid.so.3; do
    [ -f "$nvshmem_lib/$f" ] || fail "missing $nvshmem_lib/$f (set COMMSTACK_NVSHMEM_LIB)"
done
mkdir -p "$out" || fail "cannot create $out"

# The binary's RUNPATH already has $ORIGIN/../lib/nvshmem; this also covers other layouts.
export LD_LIBRARY_PATH="$nvshmem_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Shared multi-GPU machines need NVLink multicast off (the selftest defaults it too).
export NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"

resolved="$(ldd "$bin" 2>&1 | awk '/libnvshmem_host/ {print $3}')"
case "$resolved" in
    "$nvshmem_lib"/*) ;;
    *) fail "libnvshmem_host.so.3 resolves to '${resolved:-nothing}', not $nvshmem_lib: $(ldd "$bin" 2>&1 | grep -i 'not found')" ;;
esac

base="$out/selftest-${gpus}gpu"
args=(--gpus "$gpus" --json "$base.json")
[ -n "${SEED:-}" ] && args+=(--seed "$SEED")
[ -n "$ratio" ] && args+=(--require-put-copy-ratio "$ratio")

{
    echo "host: $(hostname)  date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
    echo "binary: $bin"
    echo "libnvshmem_host: $resolved"
    echo "command: $bin ${args[*]} $*"
} >"$base.log" 2>&1

"$bin" "${args[@]}" "$@" >"$base.txt" 2>>"$base.log"
status=$?
echo "$status" >"$base.exit"
cat "$base.txt"
echo "run-selftest: exit status $status; results in $out" >&2
exit "$status"
