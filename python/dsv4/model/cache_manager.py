"""Paged cache manager of a DeepSeek-V4 model: every cache kind of every layer, one block table per group.

Caches of one kind share a KV-cache group: the same block ids index every layer's tensor of that kind,
so one block table per (group, request) serves all layers. Block tables count raw tokens per block
(64 for the window cache, 256 logical tokens for the compressed and indexer caches, 4 or 8 for the
compressor states); a compressed page holds ``256 // R`` entries. Blocks are kept for a request's
whole context (no sliding-window recycling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch

from .. import cache
from ..constants import C4_RATIO, C128_RATIO, COMPRESSED_LOGICAL_BLOCK, INDEXER_HEAD_DIM, SWA_BLOCK_SIZE
from ..metadata import CommonAttentionMetadata, LayerType, compressor_state_block_size, make_common_metadata
from ..metadata.layer_types import layer_types
from .config import DeepseekV4AttentionConfig


class CacheGroup(str, Enum):
    SWA = "swa"
    C4_KV = "c4_kv"
    C4_INDEXER_K = "c4_indexer_k"
    C4_STATE = "c4_state"
    C4_INDEXER_STATE = "c4_indexer_state"
    C128_KV = "c128_kv"
    C128_STATE = "c128_state"


# Raw tokens per block of each group's table.
TOKENS_PER_BLOCK = {
    CacheGroup.SWA: SWA_BLOCK_SIZE,
    CacheGroup.C4_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C4_INDEXER_K: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C4_STATE: compressor_state_block_size(C4_RATIO),
    CacheGroup.C4_INDEXER_STATE: compressor_state_block_size(C4_RATIO),
    CacheGroup.C128_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C128_STATE: compressor_state_block_size(C128_RATIO),
}
GROUPS_OF_TYPE = {
    LayerType.SWA_ONLY: (CacheGroup.SWA,),
    LayerType.C4A: (CacheGroup.SWA, CacheGroup.C4_KV, CacheGroup.C4_INDEXER_K, CacheGroup.C4_STATE,
                    CacheGroup.C4_INDEXER_STATE),
    LayerType.C128A: (CacheGroup.SWA, CacheGroup.C128_KV, CacheGroup.C128_STATE),
}


@dataclass
class LayerCaches:
    """One layer's caches (None where its type has none). Byte caches are ``[num_blocks, page_bytes]``."""

    layer_type: LayerType
    swa: torch.Tensor
    compressed: torch.Tensor | None = None  # MODEL1 pages of 256 // R entries
    compressor_state: torch.Tensor | None = None  # fp32 [num_blocks, 4 or 8, 2 * coff * 512]
    indexer_k: torch.Tensor | None = None  # 132 B/entry pages of 64 entries
    indexer_state: torch.Tensor | None = None  # fp32 [num_blocks, 4, 2 * 2 * 128]

    @property
    def compressed_block_size(self) -> int:
        """Entries per compressed page (64 for C4A, 2 for C128A)."""
        ratio = C4_RATIO if self.layer_type is LayerType.C4A else C128_RATIO
        return COMPRESSED_LOGICAL_BLOCK // ratio


def _allocate_layer(layer_type: LayerType, blocks: dict[CacheGroup, int], device) -> LayerCaches:
    caches = LayerCaches(layer_type, cache.allocate_kv_cache(blocks[CacheGroup.SWA], SWA_BLOCK_SIZE, device=device))
    head = cache.KV_HEAD_DIMS["model1"]
    if layer_type is LayerType.C4A:
        caches.compressed = cache.allocate_kv_cache(blocks[CacheGroup.C4_KV], COMPRESSED_LOGICAL_BLOCK // C4_RATIO,
                                                    device=device)
        caches.compressor_state = cache.allocate_compressor_state(
            blocks[CacheGroup.C4_STATE], TOKENS_PER_BLOCK[CacheGroup.C4_STATE], head, C4_RATIO, device=device)
        caches.indexer_k = cache.allocate_indexer_k_cache(blocks[CacheGroup.C4_INDEXER_K],
                                                          COMPRESSED_LOGICAL_BLOCK // C4_RATIO, device=device)
        caches.indexer_state = cache.allocate_compressor_state(
            blocks[CacheGroup.C4_INDEXER_STATE], TOKENS_PER_BLOCK[CacheGroup.C4_INDEXER_STATE], INDEXER_HEAD_DIM,
            C4_RATIO, device=device)
    elif layer_type is LayerType.C128A:
        caches.compressed = cache.allocate_kv_cache(blocks[CacheGroup.C128_KV],
                                                    COMPRESSED_LOGICAL_BLOCK // C128_RATIO, device=device)
        caches.compressor_state = cache.allocate_compressor_state(
            blocks[CacheGroup.C128_STATE], TOKENS_PER_BLOCK[CacheGroup.C128_STATE], head, C128_RATIO, device=device)
    return caches


@dataclass(frozen=True)
class ScheduledBatch:
    """One step: requests (decodes first), their query lengths and context lengths including this step."""

    request_ids: tuple[int, ...]
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def positions(self) -> torch.Tensor:
        """int64 ``[num_tokens]``: ``seq_len - query_len + i`` for each request's query tokens."""
        return torch.cat([torch.arange(s - q, s) for q, s in zip(self.query_lens, self.seq_lens, strict=True)])


class PagedCacheManager:
    """Allocates the caches of every layer of ``config`` and keeps the per-request block tables."""

    def __init__(self, config: DeepseekV4AttentionConfig, max_model_len: int, max_num_reqs: int,
                 device: torch.device | str = "cpu") -> None:
        self.config = config
        self.device = device
        self.max_model_len = max_model_len
        self.max_num_reqs = max_num_reqs
        self.layer_types = layer_types(config.compress_ratios)
        self.groups = tuple(dict.fromkeys(g for t in self.layer_types for g in GROUPS_OF_TYPE[t]))
        self.max_blocks = {g: math.ceil(max_model_len / TOKENS_PER_BLOCK[g]) for g in self.groups}
        self.allocators = {g: cache.BlockAllocator(max_num_reqs * self.max_blocks[g], TOKENS_PER_BLOCK[g])
                           for g in self.groups}
        blocks = {g: allocator.num_blocks for g, allocator in self.allocators.items()}
        self.layer_caches = [_allocate_layer(t, blocks, device) for t in self.layer_types]

    def reserve(self, request_id: int, num_tokens: int) -> None:
        """Grows every group's table of the request to hold ``num_tokens`` tokens of context."""
        if num_tokens > self.max_model_len:
            raise ValueError(f"request {request_id}: {num_tokens} tokens exceed max_model_len = {self.max_model_len}")
        for allocator in self.allocators.values():
            allocator.ensure_capacity(request_id, num_tokens)

    def free(self, request_id: int) -> None:
        for allocator in self.allocators.values():
            allocator.free(request_id)

    def group_tables(self, group: CacheGroup, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(block table ``[B, max_blocks]`` int32, slot of every token int64) of the batch in one group."""
        if not batch.request_ids:
            raise ValueError("a scheduled batch needs at least one request")
        allocator = self.allocators[group]
        positions = batch.positions()
        starts = [0, *torch.tensor(batch.query_lens).cumsum(0).tolist()]
        slots = torch.cat([allocator.slot_mapping(r, positions[a:b])
                           for r, a, b in zip(batch.request_ids, starts[:-1], starts[1:], strict=True)])
        return allocator.block_table(list(batch.request_ids), self.max_blocks[group]), slots

    def common_metadata(self, group: CacheGroup, batch: ScheduledBatch) -> CommonAttentionMetadata:
        """The batch seen through one group: its block table and its per-token slots."""
        table, slots = self.group_tables(group, batch)
        return make_common_metadata(batch.query_lens, batch.seq_lens, table, slots, positions=batch.positions(),
                                    device=self.device)
