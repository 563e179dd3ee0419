#!/usr/bin/env bash
# Builds the torch-free decode harness (tools/perf/decode_bench.cu + the Hopper sparse attention kernels and the
# portable ones they fall back to) with nvcc for sm_90a into build/decode_bench/, and runs it when a GPU is present
# (arguments go to the harness).
#   DECODE_BENCH_BUILD_ONLY=1 only builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=build/decode_bench
mkdir -p "$OUT_DIR"
if [ ! -x "$OUT_DIR/decode_bench" ] || [ -n "$(find csrc tools -newer "$OUT_DIR/decode_bench" -name '*.cu*' -o -newer "$OUT_DIR/decode_bench" -name '*.h')" ]; then
  rm -f "$OUT_DIR"/*.o "$OUT_DIR"/*.ptxas  # every object is rebuilt: one left from a renamed source would link twice
  common=(-std=c++17 --expt-relaxed-constexpr -O3 -Icsrc)
  portable=(csrc/cuda/portable/sparse_mla/decode.cu csrc/cuda/portable/sparse_mla/schedule.cu
            csrc/cuda/portable/sparse_mla/combine.cu csrc/cuda/portable/sparse_mla/prefill.cu)
  pids=()
  for src in "${portable[@]}"; do
    nvcc "${common[@]}" --fmad=false -gencode arch=compute_90,code=sm_90 -c "$src" \
      -o "$OUT_DIR/portable_$(basename "$src" .cu).o" & pids+=($!)
  done
  for src in csrc/cuda/sm90/sparse_mla/decode.cu tools/perf/decode_bench.cu; do
    nvcc "${common[@]}" -DDSV4_HAVE_SM90 -Xptxas=-v -gencode arch=compute_90a,code=sm_90a -c "$src" \
      -o "$OUT_DIR/$(basename "$src" .cu).o" 2> "$OUT_DIR/$(basename "$src" .cu).ptxas" & pids+=($!)
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" != 0 ]; then
    grep -h -B2 -A3 "error" "$OUT_DIR"/*.ptxas >&2
    rm -f "$OUT_DIR/decode_bench"
    exit 1
  fi
  nvcc -gencode arch=compute_90a,code=sm_90a "$OUT_DIR"/*.o -o "$OUT_DIR/decode_bench"
  grep -hE "registers|spill|error|warning" "$OUT_DIR"/*.ptxas | grep -v "0 bytes spill" || true
fi
[ "${DECODE_BENCH_BUILD_ONLY:-0}" = 1 ] && exit 0
"$OUT_DIR/decode_bench" "$@"
