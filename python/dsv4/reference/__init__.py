"""Pure-PyTorch references: the executable specification of every dsv4 op (slow, obviously right)."""

from . import compressor, indexer, kv_cache, layer, quant, rope_slots, sparse_mla, topk

# Ops with a schema adapter (the op's exact arguments; writes outputs in place or returns them): what stands in
# for a missing native kernel (dsv4.ops on the CPU, dsv4.rocm_fallback on ROCm).
OP_IMPLS = {
    "fp8_paged_mqa_logits": indexer.fp8_paged_mqa_logits_op,
    "fp8_mqa_logits": indexer.fp8_mqa_logits_op,
    "topk_transform": topk.topk_transform_op,
    "sparse_mla_decode": sparse_mla.sparse_mla_decode_op,
    "sparse_mla_prefill": sparse_mla.sparse_mla_prefill_op,
}

__all__ = ["OP_IMPLS", "compressor", "indexer", "kv_cache", "layer", "quant", "rope_slots", "sparse_mla", "topk"]
