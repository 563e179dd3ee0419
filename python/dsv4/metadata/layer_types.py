"""Layer types of a DeepSeek-V4 model, read from the config's per-layer ``compress_ratios``."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from ..constants import C4_RATIO, C128_RATIO


class LayerType(str, Enum):
    """Attention kind of a layer; the values are the keys engines use (``swaonly``, ``c4a``, ``c128a``)."""

    SWA_ONLY = "swaonly"  # sliding window only
    C4A = "c4a"  # window + indexer top-k of the ratio-4 compressed entries
    C128A = "c128a"  # window + every ratio-128 compressed entry


LAYER_TYPE_SWAONLY = LayerType.SWA_ONLY
LAYER_TYPE_C4A = LayerType.C4A
LAYER_TYPE_C128A = LayerType.C128A

# Config ratios 0 and 1 both mean "no compression" (HF configs write 0, vLLM normalises to 1).
_RATIO_TO_TYPE = {0: LayerType.SWA_ONLY, 1: LayerType.SWA_ONLY, C4_RATIO: LayerType.C4A,
                  C128_RATIO: LayerType.C128A}
_TYPE_TO_RATIO = {LayerType.SWA_ONLY: 1, LayerType.C4A: C4_RATIO, LayerType.C128A: C128_RATIO}


def layer_type_for_ratio(compress_ratio: int) -> LayerType:
    """0/1 -> sliding-window only, 4 -> C4A, 128 -> C128A; anything else is a ValueError."""
    if compress_ratio not in _RATIO_TO_TYPE:
        raise ValueError(f"unsupported compress ratio {compress_ratio!r}; supported: {sorted(_RATIO_TO_TYPE)}")
    return _RATIO_TO_TYPE[compress_ratio]


def layer_types(compress_ratios: Iterable[int]) -> list[LayerType]:
    """The layer type of every layer of a model."""
    return [layer_type_for_ratio(ratio) for ratio in compress_ratios]


def compress_ratio_of(layer_type: LayerType) -> int:
    """The normalised ratio R of a layer type (1 for sliding-window-only layers)."""
    return _TYPE_TO_RATIO[LayerType(layer_type)]
