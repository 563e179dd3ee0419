"""One step's metadata for every cache group of a model, built with the selected implementation's builders."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backends import AttentionConfig, SparseImpl, select_sparse_impl
from ..metadata import (
    AttentionMetadataConfig,
    CommonAttentionMetadata,
    CompressorMetadata,
    CompressorMetadataBuilder,
    DeepseekSparseSWAMetadata,
    DeepseekV4FlashMLAMetadata,
    DeepseekV32IndexerMetadata,
    LayerType,
    compress_ratio_of,
)
from .cache_manager import CacheGroup, PagedCacheManager, ScheduledBatch

COMPRESSED_GROUP = {LayerType.C4A: CacheGroup.C4_KV, LayerType.C128A: CacheGroup.C128_KV}
STATE_GROUPS = {CacheGroup.C4_STATE: LayerType.C4A, CacheGroup.C4_INDEXER_STATE: LayerType.C4A,
                CacheGroup.C128_STATE: LayerType.C128A}


@dataclass
class StepMetadata:
    batch: ScheduledBatch
    positions: torch.Tensor  # [T] int64
    swa: DeepseekSparseSWAMetadata
    compressed: dict[LayerType, DeepseekV4FlashMLAMetadata]  # per compressed layer type present
    indexer: DeepseekV32IndexerMetadata | None  # with C4A layers
    compressor: dict[CacheGroup, CompressorMetadata]  # per compressor-state group present

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


class StepMetadataBuilder:
    """Owns one builder per cache group of the manager's model (persistent buffers sized by the step budget)."""

    def __init__(self, manager: PagedCacheManager, max_num_batched_tokens: int, impl: SparseImpl | None = None):
        self.manager = manager
        config = manager.config
        self.metadata_config = AttentionMetadataConfig(
            max_num_batched_tokens=max_num_batched_tokens, max_model_len=manager.max_model_len,
            compress_ratios=config.compress_ratios, index_topk=config.index_topk,
            sliding_window=config.sliding_window, max_num_reqs=manager.max_num_reqs, device=manager.device)
        self.impl = impl or select_sparse_impl(AttentionConfig(device=manager.device))
        present = set(manager.layer_types)
        self.swa = self.impl.swa_builder_cls(self.metadata_config)
        mla_builder = self.impl.mla_backend.get_builder_cls()
        self.compressed = {t: mla_builder(self.metadata_config, compress_ratio_of(t))
                           for t in COMPRESSED_GROUP if t in present}
        self.indexer = (self.impl.indexer_backend.get_builder_cls()(self.metadata_config)
                        if LayerType.C4A in present else None)
        self.compressor = {g: CompressorMetadataBuilder(self.metadata_config, compress_ratio_of(t))
                           for g, t in STATE_GROUPS.items() if t in present}

    def build(self, batch: ScheduledBatch) -> StepMetadata:
        base = self.manager.common_metadata(CacheGroup.SWA, batch)

        def common(group: CacheGroup) -> CommonAttentionMetadata:
            """Another group's view of the same batch (request ids per token computed once)."""
            return base if group is CacheGroup.SWA else base.for_group(*self.manager.group_tables(group, batch))

        return StepMetadata(
            batch=batch,
            positions=base.positions,
            swa=self.swa.build(common(CacheGroup.SWA)),
            compressed={t: b.build(common(COMPRESSED_GROUP[t])) for t, b in self.compressed.items()},
            indexer=None if self.indexer is None else self.indexer.build(common(CacheGroup.C4_INDEXER_K)),
            compressor={g: b.build(common(g)) for g, b in self.compressor.items()},
        )
