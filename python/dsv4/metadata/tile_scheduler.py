"""FlashMLA decode tile schedulers: one fresh, unplanned schedule object per layer type present.

The first ``flash_mla_with_kvcache`` call of a layer type in a step plans its object; the other
layers of that type reuse the plan, which is valid because their per-token window and compressed
lengths depend only on positions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .layer_types import LayerType


def new_flashmla_sched_meta():
    """A fresh FlashMLA schedule object (imported on use: only FlashMLA GPUs plan schedules)."""
    from ..flash_mla import get_mla_metadata

    return get_mla_metadata()[0]


def plans_flashmla_schedules(device: torch.device | str) -> bool:
    """True on NVIDIA GPUs that run FlashMLA decode (not ROCm, XPU, SM12x, nor the CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device)[0] != 12


def build_tile_schedulers(
    present: Iterable[LayerType],
    num_decode_tokens: int,
    plans_schedules: bool,
    new_sched_meta: Callable[[], object] = new_flashmla_sched_meta,
) -> dict[LayerType, object | None]:
    """``{every layer type: fresh schedule for a present type, else None}``; all None without decode
    tokens or on a platform that plans no schedules."""
    schedulers: dict[LayerType, object | None] = dict.fromkeys(LayerType)
    if num_decode_tokens == 0 or not plans_schedules:
        return schedulers
    for layer_type in set(present):
        schedulers[layer_type] = new_sched_meta()
    return schedulers
