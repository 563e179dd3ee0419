"""Benchmark cases of the KV-cache writers and the gather (DSv4-Flash: 64 heads x 512, MODEL1 records)."""

from __future__ import annotations

import torch

import dsv4

from ..reference import kv_cache as ref_kv_cache
from ..reference import quant as ref_quant
from . import BLOCK, HEAD_DIM, HEADS, Case, token_batch


def cases(quick: bool = False) -> list[Case]:
    batch = token_batch(quick)
    tokens, positions, rope, slots, swa = batch.count, batch.positions, batch.rope, batch.slots, batch.swa
    q = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    kv = torch.randn(tokens, HEAD_DIM).bfloat16()
    gather_rows = torch.randint(0, batch.num_blocks * BLOCK, (4 * tokens,))
    return [
        Case("qnorm_rope_kv_insert", f"T={tokens} H={HEADS}", q.nbytes * 2 + kv.nbytes + tokens * 584,
             lambda m: m.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, swa, slots, rope, HEADS, 1e-6, BLOCK),
             lambda: ref_kv_cache.qnorm_rope_kv_insert(q, kv, positions, rope, slots, swa, BLOCK, 1e-6, HEADS)),
        Case("quantize_kv_insert", f"T={tokens} MODEL1", kv.nbytes + tokens * 584,
             lambda m: dsv4.ops.quantize_kv_insert(kv, slots, swa, BLOCK),
             lambda: ref_quant.model1_write(swa, slots, BLOCK, kv.float()), on_peer=False),
        Case("dequantize_kv_gather", f"N={gather_rows.numel()} MODEL1", gather_rows.numel() * (584 + 1024),
             lambda m: dsv4.ops.dequantize_kv_gather(swa, gather_rows, BLOCK),
             lambda: ref_quant.model1_read(swa, gather_rows, BLOCK), on_peer=False),
    ]
