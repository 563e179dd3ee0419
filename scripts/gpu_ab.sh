#!/usr/bin/env bash
# Same-run A/B of the CUDA attention ops across builds of this tree that differ by compile-time switches: each
# "name:nvcc flags" argument is built into build/ab_NAME (the first one completely, the others only _C_cuda, sharing
# its _C), then the builds are timed alternately for GPU_AB_ROUNDS rounds (default 2) with tools/gpu_ab_time.py,
# each run under a GPU_AB_TIMEOUT-second limit (default 180). The log goes to $OUT/ab.txt (default build/gpu_ab) and
# a table (medians against the first build, and whether the outputs are the same bits) to stdout.
#   scripts/gpu_ab.sh "base:" "variant:-DSOME_SWITCH=1" ...   GPU_AB_CASES="pf64 B128 ..." (tools/gpu_ab_time.py)
set -uo pipefail
[ "$#" -ge 1 ] || { echo "usage: $0 name:flags..." >&2; exit 2; }
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu_ab}
mkdir -p "$OUT"
. scripts/gpu_env.sh
names=()
pids=()
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
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || { echo "a build failed: see $OUT/build_*.txt" >&2; exit 1; }
for name in "${names[@]}"; do
  for arch in "sm_$ARCH" sm_90a; do  # the compile check's filter: spills, serialized wgmma, a dropped setmaxnreg
    echo "$name: $("$PY" scripts/ptxas_report.py "$OUT/build_$name.txt" --arch "$arch" 2>&1 | grep "^ptxas_report:")"
  done
  [ "$name" = "${names[0]}" ] || cp "build/ab_${names[0]}/python/dsv4/_C.abi3.so" "build/ab_$name/python/dsv4/"
done
: > "$OUT/ab.txt"
for round in $(seq 1 "${GPU_AB_ROUNDS:-2}"); do
  for name in "${names[@]}"; do
    # shellcheck disable=SC2086
    timeout "${GPU_AB_TIMEOUT:-180}" "$PY" tools/gpu_ab_time.py time "build/ab_$name/python" "$name" "$round" \
      ${GPU_AB_CASES:-} >> "$OUT/ab.txt" 2>&1 || echo "=== $name round $round: exit $?" >> "$OUT/ab.txt"
  done
done
"$PY" tools/gpu_ab_time.py table "$OUT/ab.txt"
