#!/usr/bin/env bash
# Compile-only check of the CUDA kernels (no GPU needed): configures CMake in a temporary build folder for the
# portable tier on sm_80 and sm_90a and the Hopper tier on sm_90a, builds the object libraries (portable kernels, Hopper
# kernels, CUDA bindings) and prints the ptxas registers / stack / spills of every sm_90a function. Fails on any
# compile error and when a Hopper function spills, has its wgmma serialized or its setmaxnreg dropped
# (tools/check/ptxas_report.py). Needs nvcc (on PATH or in /usr/local/cuda/bin) and the
# project's venv (torch headers; set PYTHON to use another interpreter).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-$repo_root/.venv/bin/python}
jobs=${MAX_JOBS:-2}

fail() { echo "cuda_compile_check: $*" >&2; exit 1; }

nvcc=$(command -v nvcc || true)
if [[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]]; then nvcc=/usr/local/cuda/bin/nvcc; fi
[[ -n $nvcc ]] || fail "no nvcc on PATH or in /usr/local/cuda/bin: install the CUDA toolkit to run this check"
[[ -x $python ]] || fail "no Python at $python (run 'make test' first or set PYTHON)"
export PATH="$(dirname "$python"):$PATH"  # the venv's cmake and ninja
command -v cmake >/dev/null && command -v ninja >/dev/null || fail "cmake and ninja are needed (pip install cmake ninja)"

build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT

# Prints a step's log only when it fails.
run_logged() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log" >&2; return 1; }
}

sm90=ON
[[ -n $(find "$repo_root/csrc/cuda/sm90" -name '*.cu' -print -quit 2>/dev/null) ]] || sm90=OFF
[[ $sm90 == ON ]] || echo "cuda_compile_check: no csrc/cuda/sm90/**/*.cu yet: Hopper tier skipped"

run_logged "$build/configure.log" cmake -S "$repo_root" -B "$build" -G Ninja \
  -DDSV4_PYTHON="$python" -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DDSV4_ENABLE_CUDA=ON -DDSV4_CUDA_COMPILE_ONLY=ON "-DDSV4_CUDA_ARCHS=80;90a" \
  -DDSV4_CUDA_SM90=$sm90 -DDSV4_CUDA_PTXAS_REPORT=ON || fail "CMake configure failed"
echo "cuda_compile_check: nvcc $("$nvcc" --version | grep -o "release [0-9.]*")"

run_logged "$build/portable.log" cmake --build "$build" --parallel "$jobs" \
  --target dsv4_cuda_portable dsv4_cuda_bindings || fail "portable tier or bindings do not compile"
grep -i "warning" "$build/portable.log" >&2 || true
echo "cuda_compile_check: portable tier (sm_80, sm_90a) and bindings compile"

[[ $sm90 == ON ]] || exit 0
# The Hopper tier on its own, so its log holds only sm_90a ptxas reports.
run_logged "$build/sm90.log" cmake --build "$build" --parallel "$jobs" --target dsv4_cuda_sm90 ||
  fail "Hopper tier (sm_90a) does not compile"
grep -i "warning" "$build/sm90.log" | grep -v "ptxas info" >&2 || true
"$python" "$repo_root/tools/check/ptxas_report.py" "$build/sm90.log" --arch sm_90a ||
  fail "a Hopper kernel spills, serializes its wgmma or loses its setmaxnreg"

# The torch-free decode harness (tools/perf/decode_bench.cu) links against both tiers' decode kernels: keep it building.
PATH="$(dirname "$nvcc"):$PATH" DECODE_BENCH_BUILD_ONLY=1 "$repo_root/tools/perf/decode_bench.sh" > "$build/decode_bench.log" 2>&1 ||
  { cat "$build/decode_bench.log" >&2; fail "the decode harness (tools/perf/decode_bench.cu) does not build"; }
echo "cuda_compile_check: decode harness builds"
