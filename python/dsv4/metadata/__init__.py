"""Metadata builders: turn a batch description into the inputs of the dsv4 kernels.

Plain Python over tensors (no engine import). Builders write into persistent buffers sized by
``max_num_batched_tokens`` and return views, so CUDA graphs can capture their consumers.
"""

from .common import (
    AttentionMetadataConfig,
    CommonAttentionMetadata,
    DecodePrefillSplit,
    make_common_metadata,
    split_decodes_and_prefills,
)
from .compressor import CompressorMetadata, CompressorMetadataBuilder, compressor_state_block_size
from .cpu import (
    DeepseekV4CPUFlashMLAMetadataBuilder,
    DeepseekV4CPUIndexerMetadataBuilder,
    DeepseekV4CPUSparseSWAMetadataBuilder,
)
from .indexer import (
    DeepSeekV32IndexerDecodeMetadata,
    DeepseekV32IndexerMetadata,
    DeepseekV32IndexerMetadataBuilder,
    DeepseekV32IndexerPrefillChunkMetadata,
    DeepseekV32IndexerPrefillMetadata,
    split_indexer_prefill_chunks,
)
from .layer_types import (
    INDEXED_LAYER_TYPES,
    LAYER_TYPE_C4A,
    LAYER_TYPE_C128A,
    LAYER_TYPE_SWAONLY,
    MODEL_VERSIONS,
    LayerType,
    compress_ratio_of,
    layer_type_for_ratio,
    layer_types,
)
from .prefill_chunks import AttentionPrefillChunk, plan_attention_prefill_chunks
from .sparse_mla import (
    DeepseekV4FlashMLAMetadata,
    DeepseekV4SparseMLAMetadataBuilder,
    all_compressed_local_indices,
    c128a_width,
    compressed_slot_mapping,
)
from .swa import DeepseekSparseSWAMetadata, DeepseekSparseSWAMetadataBuilder, sliding_window_slots
from .tile_scheduler import build_tile_schedulers

__all__ = [
    "LAYER_TYPE_C128A",
    "LAYER_TYPE_C4A",
    "LAYER_TYPE_SWAONLY",
    "AttentionMetadataConfig",
    "AttentionPrefillChunk",
    "CommonAttentionMetadata",
    "CompressorMetadata",
    "CompressorMetadataBuilder",
    "DecodePrefillSplit",
    "DeepSeekV32IndexerDecodeMetadata",
    "DeepseekSparseSWAMetadata",
    "DeepseekSparseSWAMetadataBuilder",
    "DeepseekV32IndexerMetadata",
    "DeepseekV32IndexerMetadataBuilder",
    "DeepseekV32IndexerPrefillChunkMetadata",
    "DeepseekV32IndexerPrefillMetadata",
    "DeepseekV4CPUFlashMLAMetadataBuilder",
    "DeepseekV4CPUIndexerMetadataBuilder",
    "DeepseekV4CPUSparseSWAMetadataBuilder",
    "DeepseekV4FlashMLAMetadata",
    "DeepseekV4SparseMLAMetadataBuilder",
    "INDEXED_LAYER_TYPES",
    "LayerType",
    "MODEL_VERSIONS",
    "all_compressed_local_indices",
    "build_tile_schedulers",
    "c128a_width",
    "compress_ratio_of",
    "compressed_slot_mapping",
    "compressor_state_block_size",
    "layer_type_for_ratio",
    "layer_types",
    "make_common_metadata",
    "plan_attention_prefill_chunks",
    "sliding_window_slots",
    "split_decodes_and_prefills",
    "split_indexer_prefill_chunks",
]
