"""Benchmark cases of the KV compressor (C4: ratio 4, an 8-row window; the 512-dim KV and the 128-dim indexer K)."""

from __future__ import annotations

import torch

from .. import cache
from ..reference import compressor as ref_compressor
from . import BLOCK, HEAD_DIM, INDEXER_DIM, Case, token_batch

RATIO = 4


def cases(quick: bool = False) -> list[Case]:
    batch = token_batch(quick)
    tokens, positions, rope, slots, swa = batch.count, batch.positions, batch.rope, batch.slots, batch.swa
    # One group boundary per token (positions 4i+3), an 8-row window of 2048-float rows.
    width = 2 * HEAD_DIM
    c_pos = positions * RATIO + RATIO - 1
    state = cache.allocate_compressor_state(tokens * 2 + 2, 4, HEAD_DIM, RATIO)
    state.normal_()
    state_slots = torch.arange(tokens)
    gather = (c_pos[:, None] - 7 + torch.arange(8)).clamp(min=-1) % (state.shape[0] * 4)
    ckv = torch.randn(tokens, 2 * width)
    ape = torch.randn(RATIO, width)
    norm_w = torch.rand(HEAD_DIM) + 0.5
    norm_w_idx = torch.rand(INDEXER_DIM) + 0.5
    istate = cache.allocate_compressor_state(tokens * 2 + 2, 4, INDEXER_DIM, RATIO)
    istate.normal_()
    k_cache = cache.allocate_indexer_k_cache(batch.num_blocks)
    return [
        Case("save_partial_states", f"T={tokens} W={width}", ckv.nbytes + ape.nbytes + tokens * 2 * width * 4,
             lambda m: m.save_partial_states_cpu(ckv[:, :width], ckv[:, width:], ape, positions, state, state_slots),
             lambda: ref_compressor.save_partial_states(ckv[:, :width], ckv[:, width:], ape, positions, state,
                                                        state_slots)),
        Case("compress_norm_rope_store", f"T={tokens} R=4 D=512", tokens * 8 * 2 * HEAD_DIM * 4 + tokens * 584,
             lambda m: m.compress_norm_rope_store_cpu(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa, BLOCK,
                                                      RATIO),
             lambda: ref_compressor.compress_norm_rope_store(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa,
                                                             BLOCK, RATIO)),
        Case("compress_norm_rope_store_indexer", f"T={tokens} R=4 D=128",
             tokens * 8 * 2 * INDEXER_DIM * 4 + tokens * 132,
             lambda m: m.compress_norm_rope_store_indexer_cpu(istate, gather, c_pos, slots, norm_w_idx, 1e-6, rope,
                                                              k_cache, BLOCK, RATIO),
             lambda: ref_compressor.compress_norm_rope_store_indexer(istate, gather, c_pos, slots, norm_w_idx, 1e-6,
                                                                     rope, k_cache, BLOCK, RATIO)),
    ]
