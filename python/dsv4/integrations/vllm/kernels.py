"""dsv4's kernels behind vLLM's nine DeepSeek-V4 CPU ops (``torch.ops._C.*_cpu``).

The CPU kernel of each op is replaced in the op registry, so every caller (``torch.ops._C.x``, ``ops.x``,
an opaque custom op that calls it) reaches dsv4; vLLM's fake (meta) kernels stay as they are. The
functions are :mod:`dsv4.compat.vllm_cpu`'s, which take vLLM's argument orders and return conventions.
"""

from __future__ import annotations

import torch

from ...compat import vllm_cpu

OPS = vllm_cpu.OPS

_library: torch.library.Library | None = None  # kept alive: dropping it would undo the registrations


def install() -> list[str]:
    """Registers dsv4's CPU kernel for each op vLLM has loaded (vllm._C must be loaded); returns their names."""
    global _library
    if _library is not None:
        return list(OPS)
    missing = [name for name in OPS if not hasattr(torch.ops._C, name)]
    if missing:
        raise RuntimeError(f"vLLM's kernel library defines no {', '.join(missing)}: cannot serve them with dsv4")
    library = torch.library.Library("_C", "IMPL")
    for name in OPS:
        library.impl(name, getattr(vllm_cpu, name), "CPU")
    _library = library
    return list(OPS)
