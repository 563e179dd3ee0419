"""References of the helpers around attention: GPT-J RoPE (used by the writers too), the inverse output RoPE, and
the block-table slot mapping. fp32 math."""

from __future__ import annotations

import torch


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
