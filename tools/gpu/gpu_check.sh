#!/usr/bin/env bash
# GPU check (run on a machine with an NVIDIA GPU, nvcc and a CUDA torch): builds dsv4._C and dsv4._C_cuda in
# place, runs every CUDA test (the CPU test grids on the "cuda" tiers, opcheck on CUDA, graphs, compile) and the
# GPU bench, and writes logs plus a summary under $OUT (default build/gpu_check).
#   GPU_CHECK_TESTS=0 skips the tests, GPU_CHECK_BENCH=0 the bench, GPU_CHECK_QUICK=1 runs the quick bench,
#   GPU_CHECK_FULL_GRID=1 adds the full FlashMLA-style attention grids, PYTEST_ARGS adds pytest arguments,
#   GPU_CHECK_TEST_TIMEOUT (seconds, default 420) bounds the tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu_check}
mkdir -p "$OUT"
. tools/gpu/gpu_env.sh
summary() { echo "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"
summary "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)  torch $($PY -c 'import torch; print(torch.__version__)')  nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"

start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DDSV4_PYTHON="$(command -v "$PY")" -DDSV4_OUTPUT_DIR="$PWD/python/dsv4" \
  -DDSV4_ENABLE_CUDA=ON -DDSV4_CUDA_ARCHS="$ARCH" -DDSV4_CUDA_PTXAS_REPORT=ON > "$OUT/build.log" 2>&1 &&
  cmake --build build/gpu --parallel "$JOBS" >> "$OUT/build.log" 2>&1
build_rc=$?
grep -E "Compiling entry function|Used [0-9]+ registers|spill" "$OUT/build.log" > "$OUT/ptxas.txt"
summary "build: rc=$build_rc in $(( $(date +%s) - start )) s (portable tier for sm_$ARCH + Hopper tier sm_90a)"
if [ "$build_rc" -ne 0 ]; then
  grep -E "error|FAILED" "$OUT/build.log" | head -40
  exit 1
fi
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import dsv4; assert dsv4.cuda_available(), dsv4.build_info()['cuda_load_error']" || exit 1

rc=0
if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
  start=$(date +%s)
  [ "${GPU_CHECK_FULL_GRID:-0}" = 1 ] && export DSV4_FULL_GRID=1
  # A pytest worker per two cores, two intra-op threads each: the references' CPU work sets the pace, and workers
  # with a thread per core each would oversubscribe the cores many times over.
  workers=$(( JOBS > 3 ? JOBS / 2 : 1 ))
  xdist=$($PY -c "import xdist" 2>/dev/null && echo "-n $workers")
  [ -n "$xdist" ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
  # Under a time limit (GPU_CHECK_TEST_TIMEOUT seconds, default 420), so that a slow or stuck test still leaves the
  # bench its turn; -v logs each test as it ends (a cut run shows which had not), --durations the slowest of a run.
  # shellcheck disable=SC2086
  timeout "${GPU_CHECK_TEST_TIMEOUT:-420}" $PY -m pytest -v -rfE -p no:cacheprovider --durations=15 $xdist -k cuda \
    tests ${PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1
  rc=$?
  [ "$rc" = 124 ] && echo "cut at ${GPU_CHECK_TEST_TIMEOUT:-420} s (GPU_CHECK_TEST_TIMEOUT)" >> "$OUT/tests.log"
  summary "tests: rc=$rc in $(( $(date +%s) - start )) s: $(tail -1 "$OUT/tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -60
fi
if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  start=$(date +%s)
  quick=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && quick=(--quick)
  $PY -m dsv4 bench --op gpu "${quick[@]}" > "$OUT/bench.txt" 2>&1
  bench_rc=$?
  summary "bench: rc=$bench_rc in $(( $(date +%s) - start )) s"
  cat "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
  [ "$bench_rc" -ne 0 ] && rc=1
fi
exit $rc
