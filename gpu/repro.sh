#!/usr/bin/env bash
# Issue 17's proof on the GPU machine: two cold builds of the same step keys in two homes
# give the same bytes. From a bundle made by `cargo xtask --stack stacks/gpu-adopt.toml
# gpu-bundle BUNDLE ...` and a checkout of this repository; no Rust, no network.
#
#   gpu/repro.sh BUNDLE OUT [STEP...]     (default: nvshmem deepep)
#
#   nvshmem-a        `xtask build nvshmem`, cold, in home a: all cores, TZ=UTC, umask 022,
#                    the source unpacked at one path
#   nvshmem-b        the same in home b: half the cores, TZ=NPT-5:45, LC_ALL=C, umask 027,
#                    the source at another path
#   nvshmem-compare  the sha256 of every file of both installs' lib/ and include/ and of
#                    both drop-in wheels
#   nvshmem          the three above (one call can outlast a 10-minute limit: then call
#                    them one by one, with the same WORK)
#   deepep           `xtask build deepep --python PY` (adopt mode) in each home against
#                    that home's NVSHMEM and drop-in wheel, with the same variations;
#                    compares the wheels, and names the files inside that differ
#
# WORK (default: scratch/gpu-repro in the checkout, kept between calls) holds the homes;
# OUT gets repro.txt (the verdicts and every sha256; each call appends) and the logs.
# Exit status 1 when any pair differs. Environment: PYTHON (default python3), CUDA_HOME
# (default /usr/local/cuda).

set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,24p' "$0"; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export COMMSTACK_STACK="${COMMSTACK_STACK:-$repo/stacks/gpu-adopt.toml}"
bundle="$(cd "$1" && pwd)" || exit 2
mkdir -p "$2" && out="$(cd "$2" && pwd)" || exit 2
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(nvshmem deepep)
work="${WORK:-$repo/scratch/gpu-repro}"
mkdir -p "$work" && work="$(cd "$work" && pwd)" || exit 2
X="$bundle/bin/xtask"
PY="${PYTHON:-$(command -v python3)}"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
rdma=()
[ -d "$bundle/rdma-core" ] && rdma=(--rdma-core "$bundle/rdma-core")
report="$out/repro.txt"
status=0

# in_home H CMD...: CMD with home H's settings (the variations of home b).
in_home() {
    local h="$1"; shift
    if [ "$h" = a ]; then
        (umask 022; export COMMSTACK_HOME="$work/home-a" TZ=UTC; "$@")
    else
        (umask 027; export COMMSTACK_HOME="$work/home-b" TZ=NPT-5:45 LC_ALL=C LANG=C; "$@")
    fi
}
jobs_of() { if [ "$1" = a ]; then nproc; else n=$(( $(nproc) / 2 )); [ "$n" -ge 2 ] || n=2; echo "$n"; fi; }
timed() { local t0; t0=$(date +%s.%N); "$@"; local rc=$?; echo "SECONDS $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{print a-b}')"; return $rc; }
nvshmem_step() { find "$work/home-$1/store/steps" -maxdepth 1 -name 'nvshmem-*' ! -name 'nvshmem-wheel-*' ! -name 'nvshmem-source-*' | head -1; }
dropin_wheel() { ls "$work/home-$1"/store/steps/nvshmem-wheel-*/dist/*.whl 2>/dev/null | head -1; }
deepep_wheel() { ls "$work/home-$1"/store/steps/deepep-*/dist/*.whl 2>/dev/null | grep -v deepep-venv | head -1; }

# compare NAME FILE_A FILE_B: one verdict line in the report.
compare() {
    local sa sb
    sa="$(sha256sum "$2" | cut -d' ' -f1)" sb="$(sha256sum "$3" | cut -d' ' -f1)"
    if [ "$sa" = "$sb" ]; then echo "IDENTICAL $1 sha256 $sa" | tee -a "$report"
    else echo "DIFFERS $1: $sa ($2) vs $sb ($3)" | tee -a "$report"; status=1; fi
}

# The files inside two wheels whose bytes differ (zip CRC and size), named.
wheel_diff() {
    "$PY" - "$1" "$2" <<'EOF'
import sys, zipfile
a, b = (zipfile.ZipFile(p) for p in sys.argv[1:3])
ia = {i.filename: (i.CRC, i.file_size, i.date_time, i.external_attr) for i in a.infolist()}
ib = {i.filename: (i.CRC, i.file_size, i.date_time, i.external_attr) for i in b.infolist()}
print("entry order equal:", [i.filename for i in a.infolist()] == [i.filename for i in b.infolist()])
for n in sorted(set(ia) | set(ib)):
    if ia.get(n) != ib.get(n):
        print("  differs:", n, ia.get(n), ib.get(n))
EOF
}

# build_nvshmem H: a cold NVSHMEM build (and its drop-in wheel) in home H, from nothing.
build_nvshmem() {
    local h="$1" src="$work/src-$1"
    "$X" --version
    rm -rf "$work/home-$h" "$src"
    mkdir -p "$work/home-$h"
    in_home "$h" "$X" fetch --only sources --offline --mirror "$bundle/mirror" --accept-tree-match || return 1
    mkdir -p "$src" && tar -xzf "$(find "$work/home-$h/cache" -name 'nvshmem_src_*.tar.gz' | head -1)" -C "$src" --strip-components=1 || return 1
    echo "== home $h: $(jobs_of "$h") jobs, source at $src"
    in_home "$h" timed "$X" build nvshmem --source "$src" --system --cuda-home "$CUDA_HOME" \
        --jobs "$(jobs_of "$h")" "${rdma[@]}" --python3 "$(command -v python3)"
}
step_nvshmem-a() { build_nvshmem a; }
step_nvshmem-b() { build_nvshmem b; }
step_nvshmem() { step_nvshmem-a && step_nvshmem-b && step_nvshmem-compare; }

step_nvshmem-compare() {
    local h
    for h in a b; do
        [ -n "$(nvshmem_step "$h")" ] || { echo "no NVSHMEM in home $h: run step nvshmem-$h first"; return 1; }
    done
    local a b n
    a="$(nvshmem_step a)/nvshmem" b="$(nvshmem_step b)/nvshmem"
    echo "== NVSHMEM: $a vs $b" | tee -a "$report"
    [ "$(basename "$(dirname "$a")")" = "$(basename "$(dirname "$b")")" ] \
        && echo "same step key: $(basename "$(dirname "$a")")" | tee -a "$report" \
        || { echo "DIFFERS: the step keys differ" | tee -a "$report"; status=1; }
    (cd "$a" && find lib include -type f | sort | xargs sha256sum) >"$out/nvshmem-a.sha256"
    (cd "$b" && find lib include -type f | sort | xargs sha256sum) >"$out/nvshmem-b.sha256"
    n="$(wc -l <"$out/nvshmem-a.sha256")"
    if diff "$out/nvshmem-a.sha256" "$out/nvshmem-b.sha256" >"$out/nvshmem.diff"; then
        echo "IDENTICAL nvshmem lib/ and include/: all $n files" | tee -a "$report"
    else
        echo "DIFFERS nvshmem lib/ or include/ ($n files):" | tee -a "$report"; cat "$out/nvshmem.diff" | tee -a "$report"; status=1
    fi
    (cd "$a" && find lib -type l | sort | while read -r l; do echo "$l -> $(readlink "$l")"; done) >"$out/links-a.txt"
    (cd "$b" && find lib -type l | sort | while read -r l; do echo "$l -> $(readlink "$l")"; done) >"$out/links-b.txt"
    diff -q "$out/links-a.txt" "$out/links-b.txt" >/dev/null || { echo "DIFFERS the symlinks" | tee -a "$report"; status=1; }
    grep -E 'libnvshmem_host.so.3\.|libnvshmem_device.a' "$out/nvshmem-a.sha256" | tee -a "$report"
    compare "drop-in wheel $(basename "$(dropin_wheel a)")" "$(dropin_wheel a)" "$(dropin_wheel b)"
    cp "$(nvshmem_step a)/build-report.json" "$out/nvshmem-a-build-report.json"
    cp "$(nvshmem_step b)/build-report.json" "$out/nvshmem-b-build-report.json"
}

step_deepep() {
    local h src
    src="$(ls "$bundle"/mirror/DeepEP-*.tar.gz | head -1)"
    for h in a b; do
        [ -n "$(nvshmem_step "$h")" ] || { echo "no NVSHMEM in home $h: run the nvshmem step first"; return 1; }
        echo "== home $h: DeepEP, $(jobs_of "$h") jobs"
        in_home "$h" timed "$X" build deepep --python "$PY" --system --cuda-home "$CUDA_HOME" \
            --nvshmem "$(nvshmem_step "$h")" --nvshmem-wheel "$(dropin_wheel "$h")" --source "$src" \
            --jobs "$(jobs_of "$h")" "${rdma[@]}" --force || return 1
    done
    local wa wb
    wa="$(deepep_wheel a)" wb="$(deepep_wheel b)"
    compare "DeepEP wheel $(basename "$wa")" "$wa" "$wb"
    wheel_diff "$wa" "$wb" | tee -a "$report"
    "$PY" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); print("\n".join(i.filename for i in z.infolist()))' "$wa" >"$out/deepep-wheel-files.txt"
    local so
    so="$(mktemp -d)"
    (cd "$so" && "$PY" -m zipfile -e "$wa" . && readelf -d deep_ep_cpp*.so | grep -E 'RUNPATH|RPATH|NEEDED') | tee -a "$report"
}

echo "== $(date -u +%FT%TZ) $(hostname): ${steps[*]}" >>"$report"
for s in "${steps[@]}"; do
    declare -F "step_$s" >/dev/null || { echo "no step $s (see: $0 with no arguments)"; exit 2; }
    echo "::: $s" >&2
    ( set -x; "step_$s" ) >"$out/$s.log" 2>&1 || { echo "FAILED step $s (see $s.log)" | tee -a "$report"; status=1; }
    tail -n 25 "$out/$s.log" | sed "s/^/  [$s] /" >&2
done
echo "== verdicts" >&2
cat "$report" >&2
exit $status
