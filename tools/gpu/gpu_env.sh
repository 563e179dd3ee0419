# Sourced by the GPU scripts (from the repository root): the Python with the CUDA torch, the compute capability of
# its GPU (for DSV4_CUDA_ARCHS), the build's parallel jobs, and build_package.
PY=${PYTHON:-python3}
ARCH=$($PY -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}{p[1]}')")
JOBS=${MAX_JOBS:-$(nproc)}

# build_package DIR CUDA_FLAGS [cmake --build arguments...]: builds this tree into DIR with the CUDA tier, into a
# fresh copy of the package at DIR/python (import it from there).
build_package() {
  local dir=$1 flags=$2
  shift 2
  rm -rf "$dir/python" && mkdir -p "$dir/python" && cp -r python/dsv4 "$dir/python/"
  cmake -S . -B "$dir" -G Ninja -DDSV4_PYTHON="$(command -v "$PY")" -DDSV4_OUTPUT_DIR="$PWD/$dir/python/dsv4" \
    -DDSV4_ENABLE_CUDA=ON -DDSV4_CUDA_ARCHS="$ARCH" -DCMAKE_CUDA_FLAGS="$flags" -DDSV4_CUDA_PTXAS_REPORT=ON &&
    cmake --build "$dir" --parallel "$JOBS" "$@"
}
