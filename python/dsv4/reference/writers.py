"""References of the q/kv preparation ops: fused q-norm + RoPE + SWA insert, indexer q quantization,
inverse output RoPE, and block-table slot mapping. fp32 math; caches are written through quant.py."""

from __future__ import annotations

import torch

from . import quant


def apply_rope(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, inverse: bool = False):
    """GPT-J (interleaved pairs) RoPE of the last ``cos_sin_cache.shape[1]`` dims of x ``[T, ..., D]``.

    Row ``positions[t]`` of the table holds ``[cos_0..cos_{n-1} | sin_0..sin_{n-1}]``; pair i is
    ``(x[2i], x[2i+1])`` of the rotated part. Returns fp32; ``inverse`` rotates by ``-theta``.
    """
    rope_dim = cos_sin_cache.shape[1]
    half = rope_dim // 2
    x = x.float()
    rows = cos_sin_cache.float()[positions.long()]
    broadcast = (x.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos = rows[:, :half].reshape(broadcast)
    sin = rows[:, half:].reshape(broadcast)
    if inverse:
        sin = -sin
    nope, rope = x[..., : x.shape[-1] - rope_dim], x[..., x.shape[-1] - rope_dim :]
    even, odd = rope[..., 0::2], rope[..., 1::2]
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([nope, rotated], dim=-1)


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
) -> torch.Tensor:
    """Returns q_out ``[T, padded_heads, 512]`` (q's dtype) and writes kv rows into the MODEL1 cache.

    q_out[:, h] = RoPE(x * rsqrt(mean(x^2) + eps)) for h < H, 0 for padded heads. kv row t (for
    t < len(slot_mapping), slot != -1) is RoPE-rotated at positions[t] and MODEL1-quantized.
    """
    tokens, heads, dim = q.shape
    x = q.float()
    normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    q_out = torch.zeros(tokens, padded_heads or heads, dim, dtype=q.dtype)
    q_out[:, :heads] = apply_rope(normed, positions, cos_sin_cache).to(q.dtype)
    inserted = slot_mapping.shape[0]
    kv_rows = apply_rope(kv[:inserted], positions[:inserted], cos_sin_cache)
    quant.model1_write(kv_cache, slot_mapping, block_size, kv_rows)
    return q_out


def indexer_q_rope_quant(
    q: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    weights: torch.Tensor,
    softmax_scale: float,
    head_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_fp8 ``[T, H, 128]`` float8_e4m3fn, weights_out ``[T, H]`` fp32).

    RoPE on the last 64 dims, rounded to bf16 (the NoPE half keeps q's values); per (t, h) scale
    ``2^ceil(log2(max(amax, 1e-4) / 448))``; ``weights_out = weights * scale * softmax_scale * head_scale``.
    """
    rotated = apply_rope(q, positions, cos_sin_cache)
    rope_dim = cos_sin_cache.shape[1]
    values = torch.cat([rotated[..., :-rope_dim], quant.round_bf16(rotated[..., -rope_dim:])], dim=-1)
    scale = quant.indexer_scale(values)
    q_fp8 = quant.encode_e4m3(values / scale.unsqueeze(-1)).view(torch.float8_e4m3fn)
    weights_out = weights.float() * scale * softmax_scale * head_scale
    return q_fp8, weights_out


def inverse_rope(
    o: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """o ``[T, H, D]`` with its last ``cos_sin_cache.shape[1]`` dims rotated back by ``-theta(positions[t])``."""
    return apply_rope(o, positions, cos_sin_cache, inverse=True).to(out_dtype or o.dtype)


def map_local_to_global_slots(
    local: torch.Tensor, req_ids: torch.Tensor, block_table: torch.Tensor, block_size: int
) -> torch.Tensor:
    """``block_table[req_ids[r], local // bs] * bs + local % bs`` in local's dtype; -1 where the local
    index is negative, its block is past the table, the request id is out of range or the table entry < 0."""
    if block_table.numel() == 0:
        return torch.full(local.shape, -1, dtype=local.dtype)
    local64 = local.long()
    reqs = req_ids.long().unsqueeze(1).expand_as(local64)
    blocks = torch.where(local64 >= 0, local64 // block_size, -1)
    mapped = (blocks >= 0) & (blocks < block_table.shape[1]) & (reqs >= 0) & (reqs < block_table.shape[0])
    pages = block_table.long()[reqs.clamp(0, block_table.shape[0] - 1), blocks.clamp(0, block_table.shape[1] - 1)]
    mapped &= pages >= 0
    return torch.where(mapped, pages * block_size + local64 % block_size, -1).to(local.dtype)
