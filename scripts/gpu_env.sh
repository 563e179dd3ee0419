# Sourced by the GPU scripts (from the repository root): the Python with the CUDA torch, the compute capability of
# its GPU (for DSV4_CUDA_ARCHS) and the build's parallel jobs.
PY=${PYTHON:-python3}
ARCH=$($PY -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}{p[1]}')")
JOBS=${MAX_JOBS:-$(nproc)}
