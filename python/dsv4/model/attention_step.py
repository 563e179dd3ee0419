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

COMPRESSED_GROUP = {LayerType.C4A: CacheGroup.C4_KV, LayerType.C128A: CacheGroup.C128_KV,
                    LayerType.C1A: CacheGroup.C1_KV, LayerType.C2A: CacheGroup.C2_KV}
INDEXER_GROUP = {LayerType.C4A: CacheGroup.C4_INDEXER_K, LayerType.C1A: CacheGroup.C1_INDEXER_K,
                 LayerType.C2A: CacheGroup.C2_INDEXER_K}
STATE_GROUPS = {CacheGroup.C4_STATE: LayerType.C4A, CacheGroup.C4_INDEXER_STATE: LayerType.C4A,
                CacheGroup.C128_STATE: LayerType.C128A, CacheGroup.C1_STATE: LayerType.C1A,
                CacheGroup.C2_STATE: LayerType.C2A}


@dataclass
class StepMetadata:
    batch: ScheduledBatch
    positions: torch.Tensor  # [T] int64
    swa: DeepseekSparseSWAMetadata
    compressed: dict[LayerType, DeepseekV4FlashMLAMetadata]  # per compressed layer type present
    indexers: dict[LayerType, DeepseekV32IndexerMetadata]  # per indexed layer type present (C4A; V4.1 C1A, C2A)
    compressor: dict[CacheGroup, CompressorMetadata]  # per compressor-state group present

    @property
    def indexer(self) -> DeepseekV32IndexerMetadata | None:
        """The C4A layers' indexer metadata (V4.0)."""
        return self.indexers.get(LayerType.C4A)

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
            compress_ratios=config.compress_ratios, model_version=config.model_version, index_topk=config.index_topk,
            sliding_window=config.sliding_window, max_num_reqs=manager.max_num_reqs, device=manager.device)
        self.impl = impl or select_sparse_impl(AttentionConfig(device=manager.device))
        present = set(manager.layer_types)
        self.swa = self.impl.swa_builder_cls(self.metadata_config)
        mla_builder = self.impl.mla_backend.get_builder_cls()
        # V4.1 types go in as types: their ratios 1 and 2 mean other layers in V4.0
        kind = {t: (compress_ratio_of(t) if t in (LayerType.C4A, LayerType.C128A) else t) for t in present}
        self.compressed = {t: mla_builder(self.metadata_config, kind[t]) for t in COMPRESSED_GROUP if t in present}
        indexer_builder = self.impl.indexer_backend.get_builder_cls()
        self.indexers = {t: indexer_builder(self.metadata_config, kind[t]) for t in INDEXER_GROUP if t in present}
        self.compressor = {g: CompressorMetadataBuilder(self.metadata_config, kind[t])
                           for g, t in STATE_GROUPS.items() if t in present and (
                               g is not CacheGroup.C4_INDEXER_STATE or config.model_version == "v4")}

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
            indexers={t: b.build(common(INDEXER_GROUP[t])) for t, b in self.indexers.items()},
            compressor={g: b.build(common(g)) for g, b in self.compressor.items()},
        )
