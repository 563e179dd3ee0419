"""Benchmark cases of the KV-cache writers (DSv4-Flash: 64 heads x 512, indexer 64 x 128, C4 compressor)."""

from __future__ import annotations

import torch

import dsv4

from .. import cache
from ..reference import compressor as ref_compressor
from ..reference import indexer as ref_indexer
from ..reference import kv_cache as ref_kv_cache
from ..reference import quant as ref_quant
from ..reference import rope_slots as ref_rope_slots
from . import Case, rope_table

HEADS, HEAD_DIM, INDEXER_HEADS, INDEXER_DIM = 64, 512, 64, 128
BLOCK = 64


def cases(quick: bool = False) -> list[Case]:
    tokens = 64 if quick else 256
    rope = rope_table(max(8192, 4 * tokens + 8))
    positions = torch.arange(tokens)
    num_blocks = tokens // BLOCK + 2
    slots = torch.randperm(num_blocks * BLOCK)[:tokens]
    swa = cache.allocate_kv_cache(num_blocks, BLOCK)
    q = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    kv = torch.randn(tokens, HEAD_DIM).bfloat16()
    iq = torch.randn(tokens, INDEXER_HEADS, INDEXER_DIM)
    iw = torch.randn(tokens, INDEXER_HEADS)
    iq_fp8 = torch.empty(tokens, INDEXER_HEADS, INDEXER_DIM, dtype=torch.float8_e4m3fn)
    iw_out = torch.empty(tokens, INDEXER_HEADS)
    o = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    # C4 compressor: one group boundary per token (positions 4i+3), an 8-row window of 2048-float rows.
    ratio, width = 4, 2 * HEAD_DIM
    c_pos = positions * ratio + ratio - 1
    state = cache.allocate_compressor_state(tokens * 2 + 2, 4, HEAD_DIM, ratio)
    state.normal_()
    state_slots = torch.arange(tokens)
    gather = (c_pos[:, None] - 7 + torch.arange(8)).clamp(min=-1) % (state.shape[0] * 4)
    ckv = torch.randn(tokens, 2 * width)
    ape = torch.randn(ratio, width)
    norm_w = torch.rand(HEAD_DIM) + 0.5
    norm_w_idx = torch.rand(INDEXER_DIM) + 0.5
    istate = cache.allocate_compressor_state(tokens * 2 + 2, 4, INDEXER_DIM, ratio)
    istate.normal_()
    k_cache = cache.allocate_indexer_k_cache(num_blocks)
    gather_rows = torch.randint(0, num_blocks * BLOCK, (4 * tokens,))
    return [
        Case("qnorm_rope_kv_insert", f"T={tokens} H={HEADS}", q.nbytes * 2 + kv.nbytes + tokens * 584,
             lambda m: m.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, swa, slots, rope, HEADS, 1e-6, BLOCK),
             lambda: ref_kv_cache.qnorm_rope_kv_insert(q, kv, positions, rope, slots, swa, BLOCK, 1e-6, HEADS)),
        Case("indexer_q_rope_quant", f"T={tokens} H={INDEXER_HEADS}", iq.nbytes + iq_fp8.nbytes + 2 * iw.nbytes,
             lambda m: m.fused_indexer_q_rope_quant_cpu(positions, iq, rope, iq_fp8, iw, 128**-0.5, 0.125, iw_out),
             lambda: ref_indexer.indexer_q_rope_quant(iq, positions, rope, iw, 128**-0.5, 0.125)),
        Case("save_partial_states", f"T={tokens} W={width}", ckv.nbytes + ape.nbytes + tokens * 2 * width * 4,
             lambda m: m.save_partial_states_cpu(ckv[:, :width], ckv[:, width:], ape, positions, state, state_slots),
             lambda: ref_compressor.save_partial_states(ckv[:, :width], ckv[:, width:], ape, positions, state,
                                                        state_slots)),
        Case("compress_norm_rope_store", f"T={tokens} R=4 D=512", tokens * 8 * 2 * HEAD_DIM * 4 + tokens * 584,
             lambda m: m.compress_norm_rope_store_cpu(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa, BLOCK,
                                                      ratio),
             lambda: ref_compressor.compress_norm_rope_store(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa,
                                                             BLOCK, ratio)),
        Case("compress_norm_rope_store_indexer", f"T={tokens} R=4 D=128",
             tokens * 8 * 2 * INDEXER_DIM * 4 + tokens * 132,
             lambda m: m.compress_norm_rope_store_indexer_cpu(istate, gather, c_pos, slots, norm_w_idx, 1e-6, rope,
                                                              k_cache, BLOCK, ratio),
             lambda: ref_compressor.compress_norm_rope_store_indexer(istate, gather, c_pos, slots, norm_w_idx, 1e-6,
                                                                     rope, k_cache, BLOCK, ratio)),
        Case("inverse_rope", f"T={tokens} H={HEADS}", o.nbytes * 3,
             lambda m: m.inverse_gptj_rope_o_proj_cpu(o, positions, rope, 64),
             lambda: ref_rope_slots.inverse_rope(o, positions, rope, torch.float32)),
        Case("quantize_kv_insert", f"T={tokens} MODEL1", kv.nbytes + tokens * 584,
             lambda m: dsv4.ops.quantize_kv_insert(kv, slots, swa, BLOCK),
             lambda: ref_quant.model1_write(swa, slots, BLOCK, kv.float()), on_peer=False),
        Case("dequantize_kv_gather", f"N={gather_rows.numel()} MODEL1", gather_rows.numel() * (584 + 1024),
             lambda m: dsv4.ops.dequantize_kv_gather(swa, gather_rows, BLOCK),
             lambda: ref_quant.model1_read(swa, gather_rows, BLOCK), on_peer=False),
    ]
