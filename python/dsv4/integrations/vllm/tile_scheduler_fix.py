"""A fix for vLLM 0.32.0's CPU sliding-window metadata builder (described in docs/vllm.md).

``DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler`` returns only the ``swaonly``, ``c4a`` and
``c128a`` keys, while the shared ``build`` looks up every layer type vLLM defines (``c1a`` and ``c2a`` too):
every DeepSeek-V4 CPU step fails with ``KeyError: 'c1a'``. The CPU never plans FlashMLA tiles, so the
replacement returns ``None`` for every layer type the module defines.
"""

from __future__ import annotations


def layer_types() -> list[str]:
    """Every ``_LAYER_TYPE_*`` value vLLM's sliding-window module defines."""
    from vllm.v1.attention.backends.mla import sparse_swa

    return [value for name, value in vars(sparse_swa).items() if name.startswith("_LAYER_TYPE_")]


def _no_tile_schedules(self, num_decode_tokens: int) -> dict:
    return dict.fromkeys(layer_types())


def install() -> list[str]:
    from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUSparseSWAMetadataBuilder

    DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler = _no_tile_schedules
    return ["DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler"]
