#!/usr/bin/env bash
# Same-run A/B of fp8_paged_mqa_logits on the GPU bench's cases across whole source trees: builds each tree's
# extension in place (scripts/gpu_check.sh without tests or bench, one tree after another), then times the trees
# alternately for LOGITS_AB_ROUNDS rounds (default 3) so that machine drift hits every tree alike. Prints one line
# per (tree, round) with the median microseconds of each batch (LOGITS_AB_BATCHES, default "64 128"; 64K context).
#   scripts/logits_ab.sh TREE...   (a tree is a copy of this repository)
set -uo pipefail
[ "$#" -ge 1 ] || { echo "usage: $0 TREE..." >&2; exit 2; }
OUT=${OUT:-build/logits_ab}
mkdir -p "$OUT"
for tree in "$@"; do
  name=$(basename "$tree")
  (cd "$tree" && OUT="$OUT/build_$name" GPU_CHECK_TESTS=0 GPU_CHECK_BENCH=0 bash scripts/gpu_check.sh > /dev/null) ||
    { echo "$name: build failed, see $OUT/build_$name" >&2; exit 1; }
done
for round in $(seq 1 "${LOGITS_AB_ROUNDS:-3}"); do
  for tree in "$@"; do
    PYTHONPATH="$tree/python" python3 - "$(basename "$tree")" "$round" ${LOGITS_AB_BATCHES:-64 128} <<'PY'
import sys

from dsv4.bench import gpu

name, round_, *batches = sys.argv[1:]
times = [gpu.time_cold(gpu.logits_case(int(b), 65536), 30) for b in batches]
print(f"{name:>12} round {round_}: " + "  ".join(f"B={b} {t:8.1f} us" for b, t in zip(batches, times)), flush=True)
PY
  done
done
