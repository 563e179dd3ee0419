"""Reference compressor ops: state rows, then softmax-pooled, normalized, rotated, quantized entries.

Mirrors ``torch.ops.dsv4.save_partial_states`` / ``compress_norm_rope_store`` /
``compress_norm_rope_store_indexer`` argument for argument; fp32 math, caches written through
the byte-exact helpers of :mod:`.quant`.

Compressor geometry (head dim D, compress ratio R): the state row of a raw token is
``[kv (coff*D) | score + ape (coff*D)]`` with ``coff = row_width / (2*D)`` (2 for the
overlapping C4 windows, 1 for C128). A compressed entry pools ``coff*R`` window rows; window
row w reads projection half ``w // R`` (C4: the older group its first D channels, the current
group its second D channels).
"""

from __future__ import annotations

import torch

from ..constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM
from . import quant
from .rope_slots import apply_rope


def save_partial_states(
    kv: torch.Tensor,
    score: torch.Tensor,
    ape: torch.Tensor,
    positions: torch.Tensor,
    state_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``state[slot] = [kv[t] | score[t] + ape[positions[t] % R]]`` for every slot in range; -1 skips."""
    num_blocks, block_size, _ = state_cache.shape
    slots = slot_mapping.long()
    keep = quant.valid_slots(slots, num_blocks, block_size)
    rows = torch.cat([kv.float(), score.float() + ape.float()[positions.long() % ape.shape[0]]], dim=1)
    kept = slots[keep]
    state_cache[kept // block_size, kept % block_size] = rows[keep]


def pooled_normed_entries(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel softmax pool of each token's window, then RMSNorm.

    Returns (entries fp32 ``[T, head_dim]``, has_valid_row bool ``[T]``). A window slot is valid
    iff it addresses a row inside the state cache; rows of tokens without one are undefined.
    """
    num_blocks, block_size, row_width = state_cache.shape
    width = row_width // 2
    num_tokens, window = gather_slots.shape
    slots = gather_slots.long()
    valid = quant.valid_slots(slots, num_blocks, block_size)
    safe = torch.where(valid, slots, 0)
    rows = state_cache[safe // block_size, safe % block_size].float()  # [T, window, 2*width]
    half = torch.arange(window) // compress_ratio
    columns = (half[:, None] * head_dim + torch.arange(head_dim)).expand(num_tokens, window, head_dim)
    kv = torch.where(valid[..., None], rows[..., :width].gather(-1, columns), 0.0)
    score = rows[..., width:].gather(-1, columns).masked_fill(~valid[..., None], -torch.inf)
    pooled = (torch.softmax(score, dim=1) * kv).sum(dim=1)
    inv_rms = torch.rsqrt(pooled.square().mean(dim=-1, keepdim=True) + rms_norm_eps)
    return pooled * inv_rms * rms_norm_weight.float(), valid.any(dim=1)


def _rotated_entries(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight, rms_norm_eps,
                     cos_sin_cache, compress_ratio, head_dim, latent_out=None, capacity=0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(pooled, normed entries rotated at ``(p // R) * R`` ``[T, head_dim]``, the slot each writes or -1); the
    rows written into a cache of ``capacity`` slots also go, before the rotation, to ``latent_out`` (bf16)."""
    entries, has_row = pooled_normed_entries(state_cache, gather_slots, rms_norm_weight, rms_norm_eps,
                                             compress_ratio, head_dim)
    positions = positions.long()
    rotated = apply_rope(entries, positions // compress_ratio * compress_ratio, cos_sin_cache)
    # Only the last token of a group writes, and only when its window pooled at least one row.
    writes = ((positions + 1) % compress_ratio == 0) & has_row
    slots = torch.where(writes, kv_slot_mapping.long(), -1)
    if latent_out is not None:
        keep = (slots >= 0) & (slots < capacity)
        latent_out[keep] = entries[keep].to(latent_out.dtype)
    return rotated, slots


def compress_norm_rope_store(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    compress_ratio: int,
    layout: str = "model1",
    placement: str = "page_split",
    latent_out: torch.Tensor | None = None,
) -> None:
    """Head 512 compressed entries into a ``layout`` cache (MODEL1, V4.1 fp8 or fp4 in ``placement``).

    For each token with ``(p+1) % R == 0`` and a valid ``kv_slot_mapping`` entry: pool the window,
    RMSNorm, rotate the un-rounded last 64 dims at ``(p // R) * R``, then quantize (MODEL1: NoPE
    bf16-rounded then tile-quantized, RoPE stored bf16; V4.1: all dims bf16-rounded, then quantized). A token
    whose window has no valid row writes nothing (its softmax would be 0/0): the cache entry keeps its old bytes.
    ``latent_out`` (bf16 ``[T, 512]``) receives each written entry before its rotation.
    """
    entries, slots = _rotated_entries(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                      rms_norm_eps, cos_sin_cache, compress_ratio, MODEL1_HEAD_DIM, latent_out,
                                      kv_cache.shape[0] * block_size)
    quant.write_records(kv_cache, slots, block_size, entries, layout, placement)


def compress_norm_rope_store_indexer(
    state_cache: torch.Tensor,
    gather_slots: torch.Tensor,
    positions: torch.Tensor,
    kv_slot_mapping: torch.Tensor,
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    block_size: int,
    compress_ratio: int,
) -> None:
    """Head 128 compressed entries into the 132 B/entry indexer K cache.

    As :func:`compress_norm_rope_store`, but RoPE on dims [64, 128), then all 128 dims are
    bf16-rounded and quantized with one power-of-two fp32 scale (:func:`.quant.indexer_k_pack`).
    A token whose window has no valid row writes nothing.
    """
    entries, slots = _rotated_entries(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                      rms_norm_eps, cos_sin_cache, compress_ratio, INDEXER_HEAD_DIM)
    codes, scales = quant.indexer_k_pack(entries)
    quant.indexer_k_write(kv_cache, slots, block_size, codes, scales)
