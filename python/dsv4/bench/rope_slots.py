"""Benchmark case of the inverse RoPE on the attention output (DSv4-Flash: 64 heads x 512, 64 rotary dims)."""

from __future__ import annotations

import torch

from ..reference import rope_slots as ref_rope_slots
from . import HEAD_DIM, HEADS, Case, token_batch


def cases(quick: bool = False) -> list[Case]:
    batch = token_batch(quick)
    tokens, positions, rope = batch.count, batch.positions, batch.rope
    o = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    return [
        Case("inverse_rope", f"T={tokens} H={HEADS}", o.nbytes * 3,
             lambda m: m.inverse_gptj_rope_o_proj_cpu(o, positions, rope, 64),
             lambda: ref_rope_slots.inverse_rope(o, positions, rope, torch.float32)),
    ]
