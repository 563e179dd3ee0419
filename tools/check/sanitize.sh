#!/usr/bin/env bash
# Builds the CPU extension with ASan + UBSan into build/sanitize (python/dsv4/_C.abi3.so is left alone), then runs
# the CPU test suite and tools/check/fuzz.py against it. Any sanitizer report fails the run.
#
#   PYTHON          interpreter with torch, pytest, cmake and ninja (default .venv/bin/python)
#   CXX             the gcc whose sanitizer runtimes are used (default g++)
#   MAX_JOBS        parallel compile jobs (default 2)
#   FUZZ_SECONDS    fuzzing budget (default 60)
#   DSV4_FULL_GRID  1 adds the slow sparse MLA grid (about 8 more minutes on 2 cores)
#   PYTEST_ARGS     extra pytest arguments, e.g. "-k sparse_mla" to narrow a rerun
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=$(realpath -s "${PYTHON:-.venv/bin/python}")  # absolute for cmake; -s keeps the venv's symlink
CXX=${CXX:-g++}
OUT=build/sanitize
PKG=$OUT/pkg/dsv4
LOG=$OUT/logs
mkdir -p "$OUT/cmake" "$PKG" "$LOG"
export PATH="$(dirname "$PYTHON"):$PATH"  # cmake and ninja from the venv

# RelWithDebInfo: optimized like the release build, with the debug info that puts file:line into the reports.
start=$(date +%s)
CXX=$CXX cmake -S . -B "$OUT/cmake" -G Ninja -DDSV4_PYTHON="$PYTHON" -DDSV4_OUTPUT_DIR="$(realpath "$PKG")" \
  -DDSV4_ENABLE_CUDA=OFF -DDSV4_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$LOG/configure.log"
cmake --build "$OUT/cmake" --parallel "${MAX_JOBS:-2}"
echo "sanitize: build took $(($(date +%s) - start)) s"

# python/dsv4 is staged as symlinks beside the sanitized _C and put first on PYTHONPATH, so `import dsv4` runs the
# checked-out Python code on the instrumented library (and never on the normal one).
find "$PKG" -maxdepth 1 -type l -delete
for entry in python/dsv4/*; do
  case "$(basename "$entry")" in _C*.so | __pycache__) continue ;; esac
  ln -s "$(realpath "$entry")" "$PKG/"
done
export PYTHONPATH="$(realpath "$OUT/pkg")${PYTHONPATH:+:$PYTHONPATH}"

# Python is not instrumented, so the ASan runtime is preloaded, with libstdc++ beside it so that torch's C++
# exceptions and operator new/delete resolve to one copy. CPython and torch leak at exit by design: no leak check.
# A failed allocation returns null, as malloc does, so torch raises its error (tests ask for 4 TiB on purpose).
export LD_PRELOAD="$($CXX -print-file-name=libasan.so) $($CXX -print-file-name=libstdc++.so)"
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$PYTHON" -c "import dsv4, sys; sys.exit(None if '/$PKG/' in dsv4._C.__file__ else 'not sanitized: ' + dsv4._C.__file__)"

# Reports go to stderr (and end the process); the logs are also grepped for them, subprocesses' included.
REPORT='runtime error:|ERROR: AddressSanitizer'
status=0

# Not run: the vLLM peer tests (they load vLLM's uninstrumented library and only compare against it) and
# tests/tools/test_fuzz.py (it tests the fuzzer with budgets of a few seconds, too short for instrumented workers; the
# fuzzer itself runs below). The CUDA tests skip themselves: this build has no _C_cuda. --capture=sys leaves fd 2
# alone, as pytest's fd capture would swallow the report of a test that aborts.
start=$(date +%s)
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of words
"$PYTHON" -m pytest -q -ra -p no:cacheprovider --capture=sys -m "not peer" --ignore=tests/tools/test_fuzz.py tests \
  ${PYTEST_ARGS:-} 2>&1 | tee "$LOG/pytest.log" || status=1
echo "sanitize: test suite took $(($(date +%s) - start)) s"

start=$(date +%s)
"$PYTHON" tools/check/fuzz.py --seconds "${FUZZ_SECONDS:-60}" 2>&1 | tee "$LOG/fuzz.log" || status=1
echo "sanitize: fuzzing took $(($(date +%s) - start)) s"

reports=$(cat "$LOG/pytest.log" "$LOG/fuzz.log" | grep -E -c "$REPORT" || true)
echo "sanitize: $reports sanitizer report(s) (logs in $LOG)"
[ "$reports" -eq 0 ] || status=1
exit $status
