"""CPU variants of the builders (engines look them up by these names).

The CPU layer recomputes the C128A index lists from positions, reads the paged indexer K cache
directly (no gather workspace, no dense logits buffer) and never plans FlashMLA tile schedules, so
these builders skip that work.
"""

from __future__ import annotations

import torch

from .common import CommonAttentionMetadata
from .indexer import DeepseekV32IndexerMetadataBuilder
from .layer_types import LayerType
from .sparse_mla import DeepseekV4SparseMLAMetadataBuilder
from .swa import DeepseekSparseSWAMetadataBuilder


class DeepseekV4CPUFlashMLAMetadataBuilder(DeepseekV4SparseMLAMetadataBuilder):
    """Same fields as the base; every ``c128a_*`` field is None."""

    def _build_c128a_metadata(self, cm: CommonAttentionMetadata, req_id_per_token: torch.Tensor) -> dict:
        return {}


class DeepseekV4CPUIndexerMetadataBuilder(DeepseekV32IndexerMetadataBuilder):
    """Same fields as the base; the whole step's prefill is one indexer chunk."""

    @staticmethod
    def _split_indexer_prefill_chunks(compressed_seq_lens_cpu, prefill_query_lens_cpu, workspace_size,
                                      max_logits_bytes, request_offset=0) -> list[tuple[slice, slice]]:
        """One chunk ``(all prefill requests, all their query tokens)``; both budgets are ignored because the
        step's query tokens are already bounded by the scheduler's token budget."""
        num_reqs = compressed_seq_lens_cpu.shape[0]
        total_query_len = int(prefill_query_lens_cpu.sum())
        return [(slice(request_offset, request_offset + num_reqs), slice(0, total_query_len))]


class DeepseekV4CPUSparseSWAMetadataBuilder(DeepseekSparseSWAMetadataBuilder):
    """Same fields as the base; no tile schedulers."""

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict[LayerType, None]:
        return dict.fromkeys(LayerType)
