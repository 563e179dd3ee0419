"""vLLM's DeepSeek-V4 CPU ops (``torch.ops._C.*_cpu``) with vLLM's names, argument orders and return
conventions, implemented on :mod:`dsv4.ops`, so engine code switches by changing an import::

    from dsv4.compat import vllm_cpu as ops   # instead of ``ops = torch.ops._C``

Caches are vLLM's 2-D uint8 page views ``[num_blocks, page_bytes]`` (any page stride) with the block
size passed alongside, exactly as vLLM passes them. Results differ from vLLM's only where dsv4 is
stricter: top-k comes sorted (vLLM's order is unspecified) and the SWA insert keeps fp8 values below
2^-6 exact where vLLM flushes them to zero.
"""

from __future__ import annotations

import torch

from .. import ops
from ..constants import MODEL1_HEAD_DIM

VLLM_TOPK = 512  # topk_transform_512_cpu writes exactly this many columns
OPS = (
    "fused_qnorm_rope_kv_insert_cpu",
    "fused_indexer_q_rope_quant_cpu",
    "save_partial_states_cpu",
    "compress_norm_rope_store_cpu",
    "compress_norm_rope_store_indexer_cpu",
    "inverse_gptj_rope_o_proj_cpu",
    "fp8_paged_mqa_logits_cpu",
    "topk_transform_512_cpu",
    "flash_mla_with_kvcache_cpu",
)  # vLLM's DeepSeek-V4 CPU ops, each a function of this module

# ---------------------------------------------------------------------------------------------
# KV-cache writers
# ---------------------------------------------------------------------------------------------


def fused_qnorm_rope_kv_insert_cpu(
    q: torch.Tensor,
    kv: torch.Tensor,
    positions: torch.Tensor,
    swa_kv_cache_2d: torch.Tensor,
    slot_mapping: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_head_padded: int,
    eps: float,
    cache_block_size: int,
) -> torch.Tensor:
    """Mirrors ``torch.ops._C.fused_qnorm_rope_kv_insert_cpu``.

    q ``[T, H, 512]``, kv ``[>= T_ins, 512]``, slot_mapping ``[T_ins]`` (-1 skips). Returns a new
    ``[T, q_head_padded, 512]`` q (heads past H are 0); the SWA cache is written in place. Unlike
    vLLM, fp8 values below the smallest normal keep their exact subnormal code instead of 0.
    """
    return ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin_cache, slot_mapping, swa_kv_cache_2d,
                                    cache_block_size, eps, padded_heads=q_head_padded)


def fused_indexer_q_rope_quant_cpu(
    positions: torch.Tensor,
    index_q: torch.Tensor,
    index_q_cos_sin_cache: torch.Tensor,
    index_q_fp8: torch.Tensor,
    index_weights: torch.Tensor,
    index_weights_softmax_scale: float,
    index_weights_head_scale: float,
    index_weights_out: torch.Tensor,
) -> None:
    """Mirrors ``torch.ops._C.fused_indexer_q_rope_quant_cpu``: writes index_q_fp8 ``[T, H, 128]`` and
    index_weights_out ``[T, H]`` (weights with the q scale and both scales folded in) in place."""
    ops.indexer_q_rope_quant(index_q, positions, index_q_cos_sin_cache, index_weights, index_weights_softmax_scale,
                             index_weights_head_scale, q_fp8=index_q_fp8, weights_out=index_weights_out)


def save_partial_states_cpu(
    kv: torch.Tensor,
    score: torch.Tensor,
    ape: torch.Tensor,
    positions: torch.Tensor,
    state_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Mirrors ``torch.ops._C.save_partial_states_cpu``: ``state[slot] = [kv | score + ape[pos % R]]``."""
    ops.save_partial_states(kv, score, ape, positions, state_cache, slot_mapping)


def compress_norm_rope_store_cpu(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache_2d: torch.Tensor,
    kv_cache_block_size: int,
    compress_ratio: int,
) -> None:
    """Mirrors ``torch.ops._C.compress_norm_rope_store_cpu``: compressed head-512 entries into the
    fp8_ds_mla (MODEL1) cache for tokens with ``(pos + 1) % compress_ratio == 0``."""
    ops.compress_norm_rope_store(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                 rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_cache_block_size, compress_ratio)


def compress_norm_rope_store_indexer_cpu(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache_2d: torch.Tensor,
    kv_cache_block_size: int,
    compress_ratio: int,
) -> None:
    """Mirrors ``torch.ops._C.compress_norm_rope_store_indexer_cpu``: compressed head-128 indexer K
    into the 132 B/entry cache."""
    ops.compress_norm_rope_store_indexer(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                         rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_cache_block_size,
                                         compress_ratio)


def inverse_gptj_rope_o_proj_cpu(
    o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, rope_dim: int
) -> torch.Tensor:
    """Mirrors ``torch.ops._C.inverse_gptj_rope_o_proj_cpu``: a new fp32 ``[T, H, D]`` copy of o with
    the GPT-J RoPE on its last ``rope_dim`` dims undone."""
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != rope_dim:
        raise ValueError(f"inverse_gptj_rope_o_proj_cpu: cos_sin_cache must be [max_pos, rope_dim = {rope_dim}] "
                         f"(cos | sin), got {list(cos_sin_cache.shape)}")
    return ops.inverse_rope(o, positions, cos_sin_cache, out_dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# Lightning indexer
# ---------------------------------------------------------------------------------------------


def fp8_paged_mqa_logits_cpu(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    block_size: int,
    max_seq_len: int,
) -> torch.Tensor:
    """Mirrors ``torch.ops._C.fp8_paged_mqa_logits_cpu``.

    q_fp8 e4m3 ``[B, H, 128]`` (one query row per request, no next_n axis), kvcache_fp8 uint8
    ``[num_blocks, >= block_size * 132]``, weight fp32 ``[B, H]``, seq_lens ``[B]``, page_table
    ``[B, P]``. Returns fp32 ``[B, max_seq_len]``; as in vLLM only ``[b, :seq_lens[b])`` is defined.
    """
    return ops.fp8_paged_mqa_logits(q_fp8.unsqueeze(1), kvcache_fp8, weight, seq_lens, page_table, block_size,
                                    max_seq_len, clean_logits=False)


def topk_transform_512_cpu(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor,
    out_page_indices: torch.Tensor,
    page_size: int,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """Mirrors ``torch.ops._C.topk_transform_512_cpu``.

    Writes columns ``[0, 512)`` of out_page_indices (slot ids through page_tables ``[B, P]``) and, when
    given, of out_raw_indices (row-local positions), both int32 ``[B, >= 512]``. Rows with
    ``seq_len <= 512`` give ``0..L-1`` then -1; seq_lens past the score width count as the width (both
    libraries clamp). The selected set is vLLM's; the order (score descending, ties by lower index)
    is dsv4's.
    """
    slots = out_page_indices[:, :VLLM_TOPK]
    raw = out_raw_indices[:, :VLLM_TOPK] if out_raw_indices is not None else torch.empty_like(slots)
    torch.ops.dsv4.topk_transform(scores, seq_lens, None, page_tables, page_size, raw, slots)


# ---------------------------------------------------------------------------------------------
# Sparse MLA attention
# ---------------------------------------------------------------------------------------------


def flash_mla_with_kvcache_cpu(
    out: torch.Tensor,
    q: torch.Tensor,
    window_cache_2d: torch.Tensor,
    window_slots: torch.Tensor,
    window_block_size: int,
    compressed_cache_2d: torch.Tensor,
    compressed_slots: torch.Tensor,
    compressed_block_size: int,
    attn_sink: torch.Tensor,
    scale: float,
) -> None:
    """Mirrors ``torch.ops._C.flash_mla_with_kvcache_cpu``.

    q bf16 ``[T, H, 512]``; window_slots ``[T, Nw]`` and compressed_slots ``[T, Nc]`` (Nc may be 0)
    are global slot ids into their own fp8_ds_mla caches (-1 invalid). One softmax over both sets
    plus the per-head sink; writes bf16 ``[T, H, 512]`` into ``out`` (lse is dropped, as in vLLM).
    """
    has_compressed = compressed_slots.shape[1] > 0
    result, _ = ops.sparse_mla_decode(
        q.unsqueeze(1),
        window_cache_2d,
        window_slots.unsqueeze(1),
        window_block_size,
        attn_sink=attn_sink,
        extra_kv_cache=compressed_cache_2d if has_compressed else None,
        extra_indices=compressed_slots.unsqueeze(1) if has_compressed else None,
        extra_block_size=compressed_block_size if has_compressed else 0,
        head_dim_v=MODEL1_HEAD_DIM,
        sm_scale=scale,
    )
    out.copy_(result.squeeze(1))
