"""References of the KV-cache writers beyond the record codecs of quant.py: the fused q-norm + RoPE + SWA insert.
fp32 math; caches are written through quant.py."""

from __future__ import annotations

import torch

from . import quant
from .rope_slots import apply_rope


def qnorm_rope_kv_insert(
    q: torch.Tensor,
    kv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    eps: float = 1e-6,
    padded_heads: int | None = None,
    q_norm: bool = True,
    layout: str = "model1",
    placement: str = "page_split",
) -> torch.Tensor:
    """Returns q_out ``[T, padded_heads, 512]`` (q's dtype) and writes kv rows into the ``layout`` cache.

    q_out[:, h] = RoPE(x * rsqrt(mean(x^2) + eps)) for h < H (RoPE(x) without ``q_norm``, DeepSeek-V4.1), 0 for
    padded heads. kv row t (for t < len(slot_mapping), slot != -1) is RoPE-rotated at positions[t] and quantized
    (:func:`.quant.write_records`: every dim bf16-rounded first, so MODEL1's RoPE dims are stored as their bf16).
    """
    tokens, heads, dim = q.shape
    x = q.float()
    normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps) if q_norm else x
    q_out = torch.zeros(tokens, padded_heads or heads, dim, dtype=q.dtype)
    q_out[:, :heads] = apply_rope(normed, positions, cos_sin_cache).to(q.dtype)
    inserted = slot_mapping.shape[0]
    kv_rows = apply_rope(kv[:inserted], positions[:inserted], cos_sin_cache)
    quant.write_records(kv_cache, slot_mapping, block_size, kv_rows, layout, placement)
    return q_out
