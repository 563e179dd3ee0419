#!/usr/bin/env bash
# Nsight Compute profile of one launch of a CUDA attention kernel through the ops: one case of
# tools/perf/gpu_ab_time.py (default pf64, the bf16 prefill at h = 64), run three times with the second launch of the
# kernel matching GPU_PROFILE_KERNEL (default the Hopper attention kernel) profiled with warp-state samples per
# SASS instruction and a cold cache; writes the SASS export, the details page and a stall summary by code region
# (tools/perf/ncu_stalls.py) under $OUT (default build/gpu_profile; tools/perf/ncu_profile.sh). Builds this tree into
# build/profile first.
#   tools/perf/gpu_profile.sh [CASE]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu_profile}
mkdir -p "$OUT"
. tools/gpu/gpu_env.sh
case_name=${1:-pf64}
build_package build/profile "" > "$OUT/build.txt" 2>&1
pkg="$PWD/build/profile/python"
tools/perf/ncu_profile.sh "$OUT" profile "${GPU_PROFILE_KERNEL:-sparse_mla_decode_sm90}" \
  "$PY" tools/perf/gpu_ab_time.py run "$pkg" "$case_name" 3
rm -f "$OUT/profile.ncu-rep"  # large; the exports hold what the summary reads
