"""Sparse-MLA metadata of a compressed-cache group: compressed slot mapping and the C128A index lists.

Compressed entry ``c = p // R`` is written by the token at ``p = R*c + R - 1`` and stored at
``block_table[req, c // SBS] * SBS + c % SBS`` with ``SBS = 256 // R`` entries per page (64 for C4A,
2 for C128A). A C128A token at p attends to all ``n = (p + 1) // 128`` entries (clamped to the width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import ops
from ..constants import C128_RATIO
from .common import AttentionMetadataConfig, CommonAttentionMetadata, check_capacity, split_decodes_and_prefills
from .layer_types import LayerType, compress_ratio_of, layer_type_for_ratio

C128A_TOPK_ALIGNMENT = 128  # FlashMLA decode needs extra_topk to be a multiple of its 64/128-token tile


def compressed_slot_mapping(cm: CommonAttentionMetadata, compress_ratio: int, storage_block_size: int,
                            out: torch.Tensor) -> torch.Tensor:
    """Slot of the entry each token completes (-1 for the others); fills all of ``out``, returns ``out[:T]``."""
    out.fill_(-1)
    num_tokens = cm.num_actual_tokens
    positions = cm.token_positions()
    writes = (positions + 1) % compress_ratio == 0
    local = torch.where(writes, positions // compress_ratio, -1)[:, None]
    slots = ops.map_local_to_global_slots(local, cm.token_requests(), cm.block_table_tensor, storage_block_size)
    out[:num_tokens].copy_(slots[:, 0])
    return out[:num_tokens]


def c128a_width(max_model_len: int) -> int:
    """Columns of the C128A index lists: every entry of the longest context, padded to the FlashMLA tile."""
    return math.ceil(math.ceil(max_model_len / C128_RATIO) / C128A_TOPK_ALIGNMENT) * C128A_TOPK_ALIGNMENT


def all_compressed_local_indices(positions: torch.Tensor, compress_ratio: int, width: int) -> torch.Tensor:
    """int64 ``[N, width]``: ``j`` for ``j < min((p + 1) // R, width)``, else -1."""
    counts = ((positions.long() + 1) // compress_ratio).clamp(max=width)
    columns = torch.arange(width, device=positions.device)
    return torch.where(columns < counts[:, None], columns, -1)


@dataclass
class DeepseekV4FlashMLAMetadata:
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor  # compressed slot mapping (compressed layers), else the group's slot mapping
    block_table: torch.Tensor  # in 256-token logical blocks
    req_id_per_token: torch.Tensor
    block_size: int  # logical block (256); entries per page = block_size // compress_ratio
    topk_tokens: int
    compress_ratio: int
    c128a_global_decode_topk_indices: torch.Tensor | None = None  # [Nd, 1, width] int32 slots
    c128a_decode_topk_lens: torch.Tensor | None = None  # [Nd] int32
    c128a_prefill_topk_indices: torch.Tensor | None = None  # [Np, width] int32 request-local entries


class DeepseekV4SparseMLAMetadataBuilder:
    """Builds :class:`DeepseekV4FlashMLAMetadata` for one compress ratio into persistent buffers."""

    def __init__(self, config: AttentionMetadataConfig, compress_ratio: int | LayerType) -> None:
        self.config = config
        self.layer_type = layer_type_for_ratio(compress_ratio)  # a V4.1 layer passes its LayerType
        self.compress_ratio = compress_ratio_of(self.layer_type)
        self.block_size = config.logical_block_size
        self.storage_block_size = self.block_size // self.compress_ratio
        self.reorder_batch_threshold = config.decode_threshold
        rows, device = config.max_num_batched_tokens, config.device
        self.req_id_per_token = torch.zeros(rows, dtype=torch.int32, device=device)
        self.compressed_slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=device)
        if self.layer_type is LayerType.C128A:
            self.c128a_width = c128a_width(config.max_model_len)
            self.c128a_global_decode = torch.full((rows, self.c128a_width), -1, dtype=torch.int32, device=device)
            self.c128a_decode_lens = torch.zeros(rows, dtype=torch.int32, device=device)
            self.c128a_prefill = torch.full((rows, self.c128a_width), -1, dtype=torch.int32, device=device)

    def build(self, cm: CommonAttentionMetadata) -> DeepseekV4FlashMLAMetadata:
        check_capacity(type(self).__name__, cm.num_actual_tokens, self.config.max_num_batched_tokens)
        self.req_id_per_token.zero_()  # a CUDA graph's padded rows read request 0
        req_id_per_token = cm.token_to_req_indices(self.req_id_per_token)
        slot_mapping = cm.slot_mapping
        if self.layer_type is not LayerType.SWA_ONLY:
            slot_mapping = compressed_slot_mapping(cm, self.compress_ratio, self.storage_block_size,
                                                   self.compressed_slot_mapping)
        c128a = self._build_c128a_metadata(cm, req_id_per_token) if self.layer_type is LayerType.C128A else {}
        return DeepseekV4FlashMLAMetadata(
            num_reqs=cm.num_reqs,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=cm.query_start_loc,
            slot_mapping=slot_mapping,
            block_table=cm.block_table_tensor,
            req_id_per_token=req_id_per_token,
            block_size=self.block_size,
            topk_tokens=self.config.index_topk,
            compress_ratio=self.compress_ratio,
            c128a_global_decode_topk_indices=c128a.get("c128a_global_decode_topk_indices"),
            c128a_decode_topk_lens=c128a.get("c128a_decode_topk_lens"),
            c128a_prefill_topk_indices=c128a.get("c128a_prefill_topk_indices"),
        )

    def _build_c128a_metadata(self, cm: CommonAttentionMetadata, req_id_per_token: torch.Tensor
                              ) -> dict[str, torch.Tensor]:
        """Decode tokens: global slots of all their entries and the count (0 for padding); prefill tokens:
        request-local entry indices. Uses the SWA split so the rows line up with the window lists."""
        _, _, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(cm, self.reorder_batch_threshold)
        if num_decode_tokens + num_prefill_tokens == 0:
            return {}
        positions = cm.token_positions()
        local = all_compressed_local_indices(positions, self.compress_ratio, self.c128a_width)
        result: dict[str, torch.Tensor] = {}
        if num_decode_tokens:
            decode_local = local[:num_decode_tokens]
            slots = ops.map_local_to_global_slots(decode_local, req_id_per_token[:num_decode_tokens],
                                                  cm.block_table_tensor, self.storage_block_size)
            global_decode = self.c128a_global_decode[:num_decode_tokens]
            global_decode.copy_(slots)
            counts = (decode_local >= 0).sum(dim=1)
            is_valid = cm.slot_mapping[:num_decode_tokens] >= 0
            lens = self.c128a_decode_lens[:num_decode_tokens]
            lens.copy_(torch.where(is_valid, counts, 0))
            result["c128a_global_decode_topk_indices"] = global_decode.view(num_decode_tokens, 1, -1)
            result["c128a_decode_topk_lens"] = lens
        if num_prefill_tokens:
            prefill = self.c128a_prefill[:num_prefill_tokens]
            prefill.copy_(local[num_decode_tokens:])
            result["c128a_prefill_topk_indices"] = prefill
        return result
