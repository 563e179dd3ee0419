"""Layer types of a DeepSeek-V4 model, read from the config's per-layer ``compress_ratios``.

The same ratio means different layers in the two model versions: V4.0 uses 0 (or 1) for window-only
layers, 4 and 128 for compressed ones; V4.1 uses 0 for window-only layers and 1 or 2 for compressed ones
(ratio 1: one entry per token).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from ..constants import C4_RATIO, C128_RATIO


class LayerType(str, Enum):
    """Attention kind of a layer; the values are the keys engines use (``swaonly``, ``c4a``, ``c128a``)."""

    SWA_ONLY = "swaonly"  # sliding window only
    C4A = "c4a"  # window + indexer top-k of the ratio-4 compressed entries
    C128A = "c128a"  # window + every ratio-128 compressed entry
    C1A = "c1a"  # V4.1: window + indexer top-k of one compressed entry per token
    C2A = "c2a"  # V4.1: window + indexer top-k of the ratio-2 compressed entries


LAYER_TYPE_SWAONLY = LayerType.SWA_ONLY
LAYER_TYPE_C4A = LayerType.C4A
LAYER_TYPE_C128A = LayerType.C128A

# Config ratios 0 and 1 both mean "no compression" (HF configs write 0, vLLM normalises to 1).
_RATIO_TO_TYPE = {0: LayerType.SWA_ONLY, 1: LayerType.SWA_ONLY, C4_RATIO: LayerType.C4A,
                  C128_RATIO: LayerType.C128A}
_V41_RATIO_TO_TYPE = {0: LayerType.SWA_ONLY, 1: LayerType.C1A, 2: LayerType.C2A}
_TYPE_TO_RATIO = {LayerType.SWA_ONLY: 1, LayerType.C4A: C4_RATIO, LayerType.C128A: C128_RATIO, LayerType.C1A: 1,
                  LayerType.C2A: 2}
MODEL_VERSIONS = ("v4", "v4.1")
# Layer types whose compressed entries an indexer selects (the others attend every entry or none).
INDEXED_LAYER_TYPES = (LayerType.C4A, LayerType.C1A, LayerType.C2A)


def layer_type_for_ratio(compress_ratio: int | LayerType, model_version: str = "v4") -> LayerType:
    """V4.0: 0/1 -> sliding-window only, 4 -> C4A, 128 -> C128A; V4.1: 0 -> window only, 1 -> C1A, 2 -> C2A.
    A LayerType is returned as it is; anything else is a ValueError."""
    if isinstance(compress_ratio, LayerType):
        return compress_ratio
    if model_version not in MODEL_VERSIONS:
        raise ValueError(f"unknown DeepSeek model version {model_version!r}; supported: {MODEL_VERSIONS}")
    table = _V41_RATIO_TO_TYPE if model_version == "v4.1" else _RATIO_TO_TYPE
    if compress_ratio not in table:
        raise ValueError(f"unsupported compress ratio {compress_ratio!r} for DeepSeek-{model_version.upper()}; "
                         f"supported: {sorted(table)}")
    return table[compress_ratio]


def layer_types(compress_ratios: Iterable[int], model_version: str = "v4") -> list[LayerType]:
    """The layer type of every layer of a model."""
    return [layer_type_for_ratio(ratio, model_version) for ratio in compress_ratios]


def compress_ratio_of(layer_type: LayerType) -> int:
    """The normalised ratio R of a layer type (1 for sliding-window-only layers)."""
    return _TYPE_TO_RATIO[LayerType(layer_type)]
