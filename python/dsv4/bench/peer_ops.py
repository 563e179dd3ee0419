"""The layer's op set served by vLLM's CPU kernels, for composing a whole decode step with the peer.

Each function takes dsv4.ops' arguments and calls the vLLM op that does the same job (argument orders
and layouts adapted here); ops vLLM has no kernel for stay dsv4's: vLLM does the slot mapping in eager
torch, so the reference of it stands in.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from .. import ops
from ..model import layer as layer_module
from ..reference import rope_slots as ref_rope_slots
from ..reference.quant import cache_pages as pages

VLLM_TOPK = 512


def peer_ops(peer) -> SimpleNamespace:
    """A drop-in for the ``dsv4.ops`` names the layer's decode step calls, backed by ``peer`` (torch.ops._C)."""

    def qnorm_rope_kv_insert(q, kv, positions, cos_sin_cache, slot_mapping, kv_cache, block_size, eps=1e-6, **_):
        return peer.fused_qnorm_rope_kv_insert_cpu(q, kv, positions.long(), pages(kv_cache), slot_mapping.long(),
                                                   cos_sin_cache, q.shape[1], eps, block_size)

    def indexer_q_rope_quant(q, positions, cos_sin_cache, weights, softmax_scale, head_scale, **_):
        q_fp8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn)
        weights_out = torch.empty(q.shape[:2])
        peer.fused_indexer_q_rope_quant_cpu(positions.long(), q.float(), cos_sin_cache, q_fp8, weights.float(),
                                            softmax_scale, head_scale, weights_out)
        return q_fp8, weights_out

    def save_partial_states(kv, score, ape, positions, state_cache, slot_mapping):
        peer.save_partial_states_cpu(kv, score, ape, positions.long(), state_cache, slot_mapping.long())

    def compressor(name):
        def store(state, gather, positions, kv_slots, weight, eps, cos_sin_cache, kv_cache, block_size, ratio):
            getattr(peer, name)(state, gather.long(), positions.long(), kv_slots.long(), weight, eps, cos_sin_cache,
                                pages(kv_cache), block_size, ratio)
        store.__name__ = name.removesuffix("_cpu")
        return store

    def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, block_size, max_context_len,
                             clean_logits=True, schedule_meta=None):
        return peer.fp8_paged_mqa_logits_cpu(q[:, 0].contiguous(), pages(kv_cache), weights, context_lens,
                                             block_table, block_size, max_context_len)

    def topk_transform(scores, lengths, k=512, **_):
        if k != VLLM_TOPK:
            raise ValueError(f"vLLM's CPU top-k is fixed at {VLLM_TOPK}, got k={k}")
        raw = torch.empty(scores.shape[0], VLLM_TOPK, dtype=torch.int32)
        paged = torch.empty_like(raw)
        identity_pages = torch.zeros(scores.shape[0], 1, dtype=torch.int32)  # raw indices are what the layer uses
        peer.topk_transform_512_cpu(scores, lengths, identity_pages, paged, 1 << 30, raw)
        return raw, None

    def sparse_mla_decode(q, kv_cache, indices, block_size, *, topk_length=None, attn_sink=None, extra_kv_cache=None,
                          extra_indices=None, extra_topk_length=None, extra_block_size=0, head_dim_v=512,
                          sm_scale=None, layout="auto", extra_layout="auto"):
        if {layout, extra_layout} - {"auto", "model1"}:  # vLLM's CPU kernel reads MODEL1 records only
            raise ValueError(f"the vLLM peer decodes MODEL1 caches only, got {layout} / {extra_layout}")
        window = indices[:, 0].long()
        if topk_length is not None:  # vLLM has no lengths: entries past them become -1
            window = torch.where(torch.arange(window.shape[1]) < topk_length.long()[:, None], window, -1)
        compressed = (extra_indices[:, 0].long() if extra_indices is not None
                      else torch.empty(window.shape[0], 0, dtype=torch.long))
        comp_cache = pages(extra_kv_cache if extra_kv_cache is not None else kv_cache)
        out = torch.empty(q.shape[0], q.shape[2], head_dim_v, dtype=torch.bfloat16)
        peer.flash_mla_with_kvcache_cpu(out, q[:, 0], pages(kv_cache), window.contiguous(), block_size, comp_cache,
                                        compressed.contiguous(), extra_block_size or block_size, attn_sink, sm_scale)
        return out.unsqueeze(1), None

    def inverse_rope(o, positions, cos_sin_cache, **_):
        return peer.inverse_gptj_rope_o_proj_cpu(o, positions.long(), cos_sin_cache, cos_sin_cache.shape[1]).to(o.dtype)

    return SimpleNamespace(
        qnorm_rope_kv_insert=qnorm_rope_kv_insert, indexer_q_rope_quant=indexer_q_rope_quant,
        save_partial_states=save_partial_states,
        compress_norm_rope_store=compressor("compress_norm_rope_store_cpu"),
        compress_norm_rope_store_indexer=compressor("compress_norm_rope_store_indexer_cpu"),
        fp8_paged_mqa_logits=fp8_paged_mqa_logits, topk_transform=topk_transform,
        map_local_to_global_slots=ref_rope_slots.map_local_to_global_slots,
        sparse_mla_decode=sparse_mla_decode, inverse_rope=inverse_rope,
        fp8_paged_mqa_topk=ops.fp8_paged_mqa_topk,  # prefill only; vLLM has no fused op
    )


@contextlib.contextmanager
def layer_ops(namespace):
    """Runs the attention layer with ``namespace`` in place of dsv4.ops."""
    saved = layer_module.ops
    layer_module.ops = namespace
    try:
        yield
    finally:
        layer_module.ops = saved
