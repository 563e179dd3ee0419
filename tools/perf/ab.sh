#!/usr/bin/env bash
# Same-run A/B of CUDA kernel variants: builds every variant first, then runs them alternately for a number of rounds
# so that machine drift hits every variant alike. $OUT (default build/MODE_ab) holds the build logs and the raw log.
#
#   tools/perf/ab.sh decode TREE...
#     The torch-free decode harness (tools/perf/decode_bench.cu) across source trees (a tree is a copy of this
#     repository's csrc and tools): builds each tree's harness with the tree's own decode_bench.sh (in parallel), then
#     runs the trees for DECODE_AB_ROUNDS rounds (default 2), each run under a DECODE_AB_TIMEOUT-second limit (default
#     60: a hung variant costs one run, not the call). DECODE_AB_CASES="batch heads compressed window reps ..."
#     replaces the default V4-Flash / V4-Pro grid. The raw log goes to $OUT/ab.txt and a table of the Hopper tier's
#     medians (tools/perf/decode_ab_table.py) to stdout.
#   tools/perf/ab.sh gpu "base:" "variant:-DSOME_SWITCH=1" ...
#     The CUDA attention ops across builds of this tree that differ by compile-time switches: each "name:nvcc flags"
#     argument is built into build/ab_NAME (the first one completely, the others only _C_cuda, sharing its _C) and
#     reported through the compile check's ptxas filter, then the builds are timed for GPU_AB_ROUNDS rounds (default 2)
#     with tools/perf/gpu_ab_time.py (GPU_AB_CASES="pf64 B128 ..."), each run under a GPU_AB_TIMEOUT-second limit
#     (default 180). Runs from this tree's root (a relative $OUT is under it). The log goes to $OUT/ab.txt and a table
#     (medians against the first build, and whether the outputs are the same bits) to stdout.
#   tools/perf/ab.sh logits TREE...
#     fp8_paged_mqa_logits on the GPU bench's cases across whole source trees (a tree is a copy of this repository):
#     builds each tree's extension in place (its gpu_check.sh without tests or bench, logs in $OUT/build_NAME, one
#     tree after another), then times the trees for LOGITS_AB_ROUNDS rounds (default 3). Prints one line per (tree,
#     round) with the median microseconds of each batch (LOGITS_AB_BATCHES, default "64 128"; 64K context).
#
# A tree that has these scripts under scripts/ (the older layout) runs its scripts/decode_bench.sh or
# scripts/gpu_check.sh instead.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
usage() {
  echo "usage: $0 decode TREE... | gpu NAME:FLAGS... | logits TREE..." >&2
  exit 2
}
[ "$#" -ge 2 ] || usage
mode=$1
shift
case $mode in
  decode | logits) ;;
  gpu) cd "$here" ;;
  *) usage ;;
esac
OUT=${OUT:-build/${mode}_ab}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the same folder from inside a tree

# own_script PATH OLD_PATH (in a tree): the tree's own copy of a script, at PATH or, in an older tree, at OLD_PATH.
own_script() { if [ -f "$1" ]; then echo "$1"; else echo "$2"; fi; }

# wait_builds PID...: waits for the parallel builds; any failure ends the run.
wait_builds() {
  local pid failed=0
  for pid in "$@"; do wait "$pid" || failed=1; done
  [ "$failed" = 0 ] || { echo "a build failed: see $OUT/build_*.txt" >&2; exit 1; }
}

# alternate ROUNDS RUN VARIANT...: `RUN VARIANT ROUND` for every variant in turn, round after round.
alternate() {
  local rounds=$1 run=$2 round variant
  shift 2
  for round in $(seq 1 "$rounds"); do
    for variant in "$@"; do "$run" "$variant" "$round"; done
  done
}

# timed NAME ROUND SECONDS COMMAND...: COMMAND under a time limit, its output into $OUT/ab.txt, and a line there when
# it fails.
timed() {
  local name=$1 round=$2 seconds=$3 status
  shift 3
  timeout "$seconds" "$@" >> "$OUT/ab.txt" 2>&1
  status=$?
  [ "$status" = 0 ] || echo "=== $name round $round: exit $status" >> "$OUT/ab.txt"
}

decode_run() {
  local name
  name=$(basename "$1")
  echo "=== $name round $2" >> "$OUT/ab.txt"
  # shellcheck disable=SC2086
  timed "$name" "$2" "${DECODE_AB_TIMEOUT:-60}" "$1/build/decode_bench/decode_bench" $decode_cases
}

decode_ab() {
  local tree pids=()
  decode_cases=${DECODE_AB_CASES:-"1 64 512 128 30 128 64 512 128 30 256 64 512 128 30 512 64 512 128 30
    128 128 1024 128 30 128 16 512 128 30"}
  for tree in "$@"; do
    (cd "$tree" && DECODE_BENCH_BUILD_ONLY=1 bash "$(own_script tools/perf/decode_bench.sh scripts/decode_bench.sh)" \
      > "$OUT/build_$(basename "$tree").txt" 2>&1) &
    pids+=($!)
  done
  wait_builds "${pids[@]}"
  : > "$OUT/ab.txt"
  alternate "${DECODE_AB_ROUNDS:-2}" decode_run "$@"
  python3 "$here/tools/perf/decode_ab_table.py" "$OUT/ab.txt"
}

gpu_run() {
  # shellcheck disable=SC2086
  timed "$1" "$2" "${GPU_AB_TIMEOUT:-180}" "$PY" tools/perf/gpu_ab_time.py time "build/ab_$1/python" "$1" "$2" \
    ${GPU_AB_CASES:-}
}

gpu_ab() {
  local spec name flags arch names=() pids=() target
  . tools/gpu/gpu_env.sh
  for spec in "$@"; do
    name=${spec%%:*}
    flags=${spec#*:}
    [ "$spec" = "$name" ] && flags=""
    target=()
    [ "${#names[@]}" -gt 0 ] && target=(--target _C_cuda)
    names+=("$name")
    build_package "build/ab_$name" "$flags" "${target[@]}" > "$OUT/build_$name.txt" 2>&1 &
    pids+=($!)
  done
  wait_builds "${pids[@]}"
  for name in "${names[@]}"; do
    for arch in "sm_$ARCH" sm_90a; do  # the compile check's filter: spills, serialized wgmma, a dropped setmaxnreg
      echo "$name: $("$PY" tools/check/ptxas_report.py "$OUT/build_$name.txt" --arch "$arch" 2>&1 |
        grep "^ptxas_report:")"
    done
    [ "$name" = "${names[0]}" ] || cp "build/ab_${names[0]}/python/dsv4/_C.abi3.so" "build/ab_$name/python/dsv4/"
  done
  : > "$OUT/ab.txt"
  alternate "${GPU_AB_ROUNDS:-2}" gpu_run "${names[@]}"
  "$PY" tools/perf/gpu_ab_time.py table "$OUT/ab.txt"
}

logits_run() {
  # shellcheck disable=SC2086
  PYTHONPATH="$1/python" python3 - "$(basename "$1")" "$2" ${LOGITS_AB_BATCHES:-64 128} <<'PY'
import sys

from dsv4.bench import gpu

name, round_, *batches = sys.argv[1:]
times = [gpu.time_cold(gpu.logits_case(int(b), 65536), 30) for b in batches]
print(f"{name:>12} round {round_}: " + "  ".join(f"B={b} {t:8.1f} us" for b, t in zip(batches, times)), flush=True)
PY
}

logits_ab() {
  local tree name
  for tree in "$@"; do
    name=$(basename "$tree")
    (cd "$tree" && OUT="$OUT/build_$name" GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 \
      bash "$(own_script tools/gpu/gpu_check.sh scripts/gpu_check.sh)" > /dev/null) ||
      { echo "$name: build failed, see $OUT/build_$name" >&2; exit 1; }
  done
  alternate "${LOGITS_AB_ROUNDS:-3}" logits_run "$@"
}

"${mode}_ab" "$@"
