#!/usr/bin/env bash
# Nsight Compute profile of one cold launch of the Hopper sparse decode on the torch-free harness
# (tools/perf/decode_bench.cu): warp-state sampling per SASS instruction, with the report, its SASS export, the details
# page and a stall summary by code region (tools/perf/ncu_stalls.py) under $OUT (default build/decode_profile).
#   tools/perf/decode_profile.sh [batch heads compressed window]   (default: V4-Flash B=128, 128 + 512)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/decode_profile}
mkdir -p "$OUT"
DECODE_BENCH_BUILD_ONLY=1 bash tools/perf/decode_bench.sh
# shellcheck disable=SC2206
shape=(${*:-128 64 512 128})
# The harness launches each tier reps times after a cold flush; the second sm90 launch is profiled.
tools/perf/ncu_profile.sh "$OUT" decode sparse_mla_decode_sm90 build/decode_bench/decode_bench "${shape[@]}" 3
