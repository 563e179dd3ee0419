#!/usr/bin/env bash
# Same-run A/B of the decode harness (tools/decode_bench.cu) across source trees: builds each tree's harness with its
# own scripts/decode_bench.sh (in parallel), then runs the trees alternately for DECODE_AB_ROUNDS rounds (default 2)
# so that machine drift hits every tree alike, each run under a DECODE_AB_TIMEOUT-second limit (default 60: a hung
# variant costs one run, not the call). The raw log goes to $OUT/ab.txt (default build/decode_ab) and a table of the
# Hopper tier's medians to stdout.
#   scripts/decode_ab.sh TREE...   (a tree is a copy of this repository's csrc, tools and scripts)
#   DECODE_AB_CASES="batch heads compressed window reps ..." replaces the default V4-Flash / V4-Pro grid.
set -uo pipefail
[ "$#" -ge 1 ] || { echo "usage: $0 TREE..." >&2; exit 2; }
OUT=${OUT:-build/decode_ab}
mkdir -p "$OUT"
cases=${DECODE_AB_CASES:-"1 64 512 128 30 128 64 512 128 30 256 64 512 128 30 512 64 512 128 30 128 128 1024 128 30
  128 16 512 128 30"}
here=$(cd "$(dirname "$0")/.." && pwd)
pids=()
for tree in "$@"; do
  (cd "$tree" && DECODE_BENCH_BUILD_ONLY=1 bash scripts/decode_bench.sh > "$OUT/build_$(basename "$tree").txt" 2>&1) &
  pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "a build failed: see $OUT/build_*.txt" >&2; exit 1; }
: > "$OUT/ab.txt"
for round in $(seq 1 "${DECODE_AB_ROUNDS:-2}"); do
  for tree in "$@"; do
    name=$(basename "$tree")
    echo "=== $name round $round" >> "$OUT/ab.txt"
    # shellcheck disable=SC2086
    timeout "${DECODE_AB_TIMEOUT:-60}" "$tree/build/decode_bench/decode_bench" $cases >> "$OUT/ab.txt" 2>&1
    status=$?
    [ "$status" = 0 ] || echo "=== $name round $round: exit $status" >> "$OUT/ab.txt"
  done
done
python3 "$here/tools/decode_ab_table.py" "$OUT/ab.txt"
