"""Compressor-state metadata: per-token state slots and each token's pooling-window slots.

State rows are paged by raw position (4 tokens per block for ratio 4, 8 for ratio 128). A token at
p pools the rows of positions ``p - coff*R + 1 .. p`` (``coff`` = 2 overlapping groups for ratio 4,
1 for ratio 128); negative positions are -1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ops
from ..cache import compressor_coff
from ..constants import C4_RATIO, C128_RATIO
from .common import AttentionMetadataConfig, CommonAttentionMetadata, check_capacity
from .layer_types import LayerType, compress_ratio_of, layer_type_for_ratio

C4_STATE_BLOCK_SIZE = 4  # state rows per block of a ratio-4 compressor
C128_STATE_BLOCK_SIZE = 8  # state rows per block of a ratio-128 compressor


def compressor_state_block_size(compress_ratio: int) -> int:
    """Rows per state block: 4 for ratio 4, 8 otherwise (ratio 128, and V4.1's ratios 1 and 2)."""
    return C4_STATE_BLOCK_SIZE if compress_ratio == C4_RATIO else C128_STATE_BLOCK_SIZE


@dataclass
class CompressorMetadata:
    block_table: torch.Tensor  # state group table, negatives clamped to 0
    slot_mapping: torch.Tensor  # [T] state slot of each token (-1 = padding)
    block_size: int
    token_to_req_indices: torch.Tensor  # [T] int32
    window_slots: torch.Tensor  # [T, coff * R] int64 state slots of each token's pooling window


class CompressorMetadataBuilder:
    """Builds :class:`CompressorMetadata` for the state group of one compressor (ratio 4 or 128; V4.1: a C1A or
    C2A layer type, ratio 1 or 2)."""

    def __init__(self, config: AttentionMetadataConfig, compress_ratio: int | LayerType) -> None:
        layer_type = layer_type_for_ratio(compress_ratio)
        if layer_type is LayerType.SWA_ONLY:
            raise ValueError(f"compressor metadata needs a compress ratio in {(C4_RATIO, C128_RATIO)}, "
                             f"got {compress_ratio}")
        self.config = config
        self.compress_ratio = compress_ratio_of(layer_type)
        self.block_size = compressor_state_block_size(self.compress_ratio)
        self.window = compressor_coff(self.compress_ratio) * self.compress_ratio
        self.token_to_req_indices = torch.zeros(config.max_num_batched_tokens, dtype=torch.int32,
                                                device=config.device)

    def build(self, cm: CommonAttentionMetadata) -> CompressorMetadata:
        check_capacity(type(self).__name__, cm.num_actual_tokens, self.config.max_num_batched_tokens)
        req_ids = cm.token_to_req_indices(self.token_to_req_indices)
        block_table = cm.block_table_tensor.clamp(min=0)
        positions = cm.token_positions()
        local = positions[:, None] - self.window + 1 + torch.arange(self.window, device=positions.device)
        window_slots = ops.map_local_to_global_slots(local, req_ids, block_table, self.block_size)
        return CompressorMetadata(
            block_table=block_table,
            slot_mapping=cm.slot_mapping[: cm.num_actual_tokens],
            block_size=self.block_size,
            token_to_req_indices=req_ids,
            window_slots=window_slots,
        )
