"""Paged cache manager of a DeepSeek-V4 model: every cache kind of every layer, one block table per group.

Caches of one kind share a KV-cache group: the same block ids index every layer's tensor of that kind,
so one block table per (group, request) serves all layers. Block tables count raw tokens per block
(64 for the window cache, 256 logical tokens for the compressed and indexer caches, 4 or 8 for the
compressor states); a compressed page holds ``256 // R`` entries. Blocks are kept for a request's
whole context (no sliding-window recycling).

V4.1 adds ratio 1 and 2 groups (256 and 128 entries per compressed page) and shares caches across layers:
only a kv-source layer allocates a compressed cache, a compressor state and indexer keys; the layers reading
that source hold the same tensors. Records follow the configuration (``cache_record``, ``index_key_format``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import torch

from .. import cache
from ..constants import C4_RATIO, C128_RATIO, COMPRESSED_LOGICAL_BLOCK, INDEXER_HEAD_DIM, SWA_BLOCK_SIZE
from ..metadata import (
    CommonAttentionMetadata,
    LayerType,
    compress_ratio_of,
    compressor_state_block_size,
    make_common_metadata,
)
from .config import DeepseekV4AttentionConfig


class CacheGroup(str, Enum):
    SWA = "swa"
    C4_KV = "c4_kv"
    C4_INDEXER_K = "c4_indexer_k"
    C4_STATE = "c4_state"
    C4_INDEXER_STATE = "c4_indexer_state"
    C128_KV = "c128_kv"
    C128_STATE = "c128_state"
    C1_KV = "c1_kv"  # V4.1 groups
    C1_INDEXER_K = "c1_indexer_k"
    C1_STATE = "c1_state"
    C2_KV = "c2_kv"
    C2_INDEXER_K = "c2_indexer_k"
    C2_STATE = "c2_state"


# Raw tokens per block of each group's table.
TOKENS_PER_BLOCK = {
    CacheGroup.SWA: SWA_BLOCK_SIZE,
    CacheGroup.C4_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C4_INDEXER_K: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C4_STATE: compressor_state_block_size(C4_RATIO),
    CacheGroup.C4_INDEXER_STATE: compressor_state_block_size(C4_RATIO),
    CacheGroup.C128_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C128_STATE: compressor_state_block_size(C128_RATIO),
    CacheGroup.C1_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C1_INDEXER_K: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C1_STATE: compressor_state_block_size(1),
    CacheGroup.C2_KV: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C2_INDEXER_K: COMPRESSED_LOGICAL_BLOCK,
    CacheGroup.C2_STATE: compressor_state_block_size(2),
}
GROUPS_OF_TYPE = {
    LayerType.SWA_ONLY: (CacheGroup.SWA,),
    LayerType.C4A: (CacheGroup.SWA, CacheGroup.C4_KV, CacheGroup.C4_INDEXER_K, CacheGroup.C4_STATE,
                    CacheGroup.C4_INDEXER_STATE),
    LayerType.C128A: (CacheGroup.SWA, CacheGroup.C128_KV, CacheGroup.C128_STATE),
    LayerType.C1A: (CacheGroup.SWA, CacheGroup.C1_KV, CacheGroup.C1_INDEXER_K, CacheGroup.C1_STATE),
    LayerType.C2A: (CacheGroup.SWA, CacheGroup.C2_KV, CacheGroup.C2_INDEXER_K, CacheGroup.C2_STATE),
}
# The compressed, indexer-key and state groups of each V4.1 compressed layer type.
V41_GROUPS = {t: GROUPS_OF_TYPE[t][1:] for t in (LayerType.C1A, LayerType.C2A)}


@dataclass
class LayerCaches:
    """One layer's caches (None where its type has none). Byte caches are ``[num_blocks, page_bytes]``."""

    layer_type: LayerType
    swa: torch.Tensor
    compressed: torch.Tensor | None = None  # MODEL1 pages of 256 // R entries
    compressor_state: torch.Tensor | None = None  # fp32 [num_blocks, 4 or 8, 2 * coff * 512]
    indexer_k: torch.Tensor | None = None  # 132 B/entry pages of 64 entries (V4.1: fp8 or mxfp4 keys)
    indexer_state: torch.Tensor | None = None  # fp32 [num_blocks, 4, 2 * 2 * 128]
    window_layout: str = "model1"  # records of the window and compressed caches
    compressed_layout: str = "model1"
    index_key_format: str = "fp8"

    @property
    def compressed_block_size(self) -> int:
        """Entries per compressed page (64 for C4A, 2 for C128A; V4.1: 256 for C1A, 128 for C2A)."""
        return COMPRESSED_LOGICAL_BLOCK // compress_ratio_of(self.layer_type)


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


def _allocate_v41_layer(config: DeepseekV4AttentionConfig, layer: int, layer_type: LayerType,
                        blocks: dict[CacheGroup, int], owned: dict[int, LayerCaches], device) -> LayerCaches:
    """A V4.1 layer's window cache, with the compressed caches of its kv source (allocated when it is the source)."""
    window, compressed = config.cache_record("window"), config.cache_record("compressed")
    caches = LayerCaches(layer_type, cache.allocate_kv_cache(blocks[CacheGroup.SWA], SWA_BLOCK_SIZE, window,
                                                             device=device),
                         window_layout=window, compressed_layout=compressed, index_key_format=config.index_key_format)
    if layer_type is LayerType.SWA_ONLY:
        return caches
    source = config.kv_source_of(layer)
    if source != layer:  # a consumer reads its source's compressed cache and keys
        caches.compressed, caches.indexer_k = owned[source].compressed, owned[source].indexer_k
        return caches
    kv_group, key_group, state_group = V41_GROUPS[layer_type]
    ratio, entries = compress_ratio_of(layer_type), caches.compressed_block_size
    caches.compressed = cache.allocate_kv_cache(blocks[kv_group], entries, compressed, device=device)
    caches.indexer_k = cache.allocate_indexer_k_cache(blocks[key_group], entries, key_format=config.index_key_format,
                                                      device=device)
    caches.compressor_state = cache.allocate_compressor_state(blocks[state_group], TOKENS_PER_BLOCK[state_group],
                                                              cache.KV_HEAD_DIMS["model1"], ratio, device=device)
    owned[layer] = caches
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
        self.layer_types = config.layer_types
        self.groups = tuple(dict.fromkeys(g for t in self.layer_types for g in GROUPS_OF_TYPE[t]))
        self.max_blocks = {g: math.ceil(max_model_len / TOKENS_PER_BLOCK[g]) for g in self.groups}
        self.allocators = {g: cache.BlockAllocator(max_num_reqs * self.max_blocks[g], TOKENS_PER_BLOCK[g])
                           for g in self.groups}
        blocks = {g: allocator.num_blocks for g, allocator in self.allocators.items()}
        if config.model_version == "v4.1":
            owned: dict[int, LayerCaches] = {}
            self.layer_caches = [_allocate_v41_layer(config, i, t, blocks, owned, device)
                                 for i, t in enumerate(self.layer_types)]
        else:
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
