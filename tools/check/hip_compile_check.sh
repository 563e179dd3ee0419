#!/usr/bin/env bash
# Proves the portable CUDA tier is hipify-clean: hipifies it with torch.utils.hipify and compiles every hipified
# source and header for gfx90a and gfx940 with Debian's hipcc (ROCm 5.2: no hip_bf16.h, no fp8 types), compile
# only. Installs hipcc, libamdhip64-dev and rocm-device-libs through apt when missing. Exits non-zero on any error.
# Debian's hipcc finds clang++-15, --rocm-path=/usr and the device libraries (/usr/lib/<triplet>/amdgcn/bitcode)
# by itself; HIP_PLATFORM=amd is needed because it would otherwise target NVIDIA wherever nvcc is installed.
set -euo pipefail

HIP_PACKAGES=(hipcc libamdhip64-dev rocm-device-libs)
HIP_ARCHS=(gfx90a gfx940)

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
python=${PYTHON:-$repo_root/.venv/bin/python}

fail() { echo "hip_compile_check: $*" >&2; exit 1; }

install_missing_packages() {
  local missing=() pkg
  for pkg in "${HIP_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  command -v apt-get >/dev/null || fail "apt-get not found: install ${missing[*]} (Debian 12 packages) by hand"
  local sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  echo "hip_compile_check: installing ${missing[*]}"
  local log
  log=$(mktemp)
  if ! { "${sudo[@]}" apt-get update -qq && \
         "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    fail "apt-get could not install ${missing[*]}"
  fi
  rm -f "$log"
}

install_missing_packages
command -v hipcc >/dev/null || fail "hipcc is not on PATH after installing ${HIP_PACKAGES[*]}"
[[ -x $python ]] || fail "no Python at $python (run 'make test' first or set PYTHON)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" "$repo_root/tools/check/hipify_portable.py" "$repo_root/csrc" "$work" >"$work/units" 2>"$work/hipify.log" || {
  cat "$work/hipify.log" >&2
  fail "hipify failed"
}

export HIP_PLATFORM=amd
hip_flags=(-c -std=c++17 -Wall -Wextra -Wno-unused-parameter -ffp-contract=off -I "$work/csrc")
for arch in "${HIP_ARCHS[@]}"; do hip_flags+=("--offload-arch=$arch"); done

# Each hipified header on its own too, so a helper no kernel uses yet is still checked.
while IFS= read -r header; do
  rel=${header#"$work/csrc/hip/portable/"}  # family folders: indexer/score.cuh -> unit indexer_score.hip
  unit="$work/headers/${rel//\//_}"
  unit="${unit%.cuh}.hip"
  mkdir -p "$work/headers"
  printf '#include "hip/portable/%s"\n' "$rel" >"$unit"
  echo "$unit" >>"$work/units"
done < <(find "$work/csrc/hip/portable" -name '*.cuh' | sort)

failed=()
count=0
while read -r unit; do
  count=$((count + 1))
  name=${unit#"$work/"}
  if hipcc "${hip_flags[@]}" "$unit" -o "$work/out.o" </dev/null; then
    echo "hip_compile_check: ok      $name"
  else
    echo "hip_compile_check: FAILED  $name" >&2
    failed+=("$name")
  fi
done < <(grep -v '^$' "$work/units")

[[ ${#failed[@]} -eq 0 ]] || fail "${#failed[@]} of $count hipified units do not compile: ${failed[*]}"
echo "hip_compile_check: $count hipified units compile for ${HIP_ARCHS[*]} with HIP $(hipconfig --version)"
