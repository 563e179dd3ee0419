"""dsv4: DeepSeek-V4 sparse attention kernels as ``torch.ops.dsv4.*`` custom ops.

Importing the package loads the CPU library (``dsv4._C``, always present) and, when it was
built and the local torch has CUDA, the CUDA library (``dsv4._C_cuda``). Typed wrappers with
shapes and dtypes are in :mod:`dsv4.ops`; the executable specification is :mod:`dsv4.reference`.
"""

from __future__ import annotations

import importlib
import os

import torch

from . import _C  # noqa: F401  (registers the schemas and the CPU kernels)
from ._version import __version__

if os.environ.get("DSV4_CPU_ISA"):  # a forced tier this CPU cannot run fails here, not at the first op call
    try:
        torch.ops.dsv4.cpu_isa()
    except RuntimeError as exc:
        raise ImportError(f"DSV4_CPU_ISA={os.environ['DSV4_CPU_ISA']!r}: {exc}") from None

_cuda_load_error: str | None = None
try:
    importlib.import_module("dsv4._C_cuda")
except ImportError as exc:  # CPU-only build or CPU-only torch
    _cuda_load_error = str(exc)

from .rocm_fallback import register_reference_fallbacks  # noqa: E402

# On a ROCm torch: reference kernels for the ops _C_cuda lacks.
REFERENCE_BACKED_ROCM_OPS = register_reference_fallbacks()

from . import ops  # noqa: E402  (fake kernels and reference-backed CPU ops)
from .ops import REFERENCE_BACKED_CPU_OPS  # noqa: E402


def cuda_available() -> bool:
    """True when the CUDA kernels were built and loaded."""
    return _cuda_load_error is None


# Every CPU tier _C carries; which run here, best first: torch.ops.dsv4.supported_cpu_isas().
CPU_ISAS = ("amx", "avx512", "avx512dot", "avx2", "generic")


def cpu_isa() -> str:
    """The CPU tier that runs the kernels: one of CPU_ISAS."""
    return torch.ops.dsv4.cpu_isa()


def build_info() -> dict:
    """Version, torch, compiled and selected CPU tiers, threads, CUDA presence, reference-backed ops."""
    return {
        "version": __version__,
        "torch": torch.__version__,
        "compiled_cpu_isas": list(CPU_ISAS),
        "supported_cpu_isas": torch.ops.dsv4.supported_cpu_isas().split(","),
        "cpu_isa_order": torch.ops.dsv4.cpu_isa_order(),
        "selected_cpu_isa": cpu_isa(),
        "num_threads": torch.get_num_threads(),
        "cuda_kernels": cuda_available(),
        "cuda_load_error": _cuda_load_error,
        "reference_backed_cpu_ops": sorted(REFERENCE_BACKED_CPU_OPS),
        "reference_backed_rocm_ops": sorted(REFERENCE_BACKED_ROCM_OPS),
    }


__all__ = ["CPU_ISAS", "__version__", "build_info", "cpu_isa", "cuda_available", "ops"]
