"""Byte-exact quantizers and dequantizers of every dsv4 cache layout (pure torch).

These are the executable specification of the cache formats; the kernels must produce and
read exactly these bytes. All math is float32 on the CPU.

Layouts (one page of ``block_size`` entries; pages may be padded, always honour stride(0)):
- MODEL1 (``fp8_ds_mla``, DSv4): entry i data at ``576*i``: 448 e4m3 NoPE bytes, 64 bf16 RoPE
  values; then at ``576*block_size + 8*i``: 7 UE8M0 scale bytes (one per 64-dim tile), 1 zero pad.
- V32 (DeepSeek-V3.2, 656 B/entry, row-interleaved): 512 e4m3, 4 fp32 scales (128-dim tiles),
  64 bf16 RoPE values.
- Indexer K (132 B/entry): entry i's 128 e4m3 bytes at ``128*i``, its fp32 scale at
  ``128*block_size + 4*i``.
"""

from __future__ import annotations

import torch

from ..constants import (
    FP8_MAX,
    INDEXER_AMAX_FLOOR,
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_NOPE_DIM,
    MODEL1_ROPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
    SCALE_FLOOR,
    V32_BYTES_PER_TOKEN,
    V32_NOPE_DIM,
    V32_ROPE_DIM,
    V32_TILE,
)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(x))`` for positive float32 x, as int32 (no log rounding)."""
    mantissa, exponent = torch.frexp(x.float())
    return torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.int32)


def encode_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 -> e4m3fn bytes (uint8), saturating at +-448, round-to-nearest-even, subnormals kept."""
    clamped = x.float().clamp(-FP8_MAX, FP8_MAX)
    return clamped.to(torch.float8_e4m3fn).view(torch.uint8)


def decode_e4m3(b: torch.Tensor) -> torch.Tensor:
    """e4m3fn bytes (uint8) -> float32."""
    return b.contiguous().view(torch.float8_e4m3fn).float()


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def tile_scale_exponent(tiles: torch.Tensor) -> torch.Tensor:
    """Power-of-two scale exponent of each tile (last dim): ceil(log2(max(amax/448, 1e-4)))."""
    amax = tiles.abs().amax(dim=-1)
    return ceil_log2(torch.clamp_min(amax / FP8_MAX, SCALE_FLOOR))


def indexer_scale(x: torch.Tensor) -> torch.Tensor:
    """Indexer (K or Q) power-of-two scale over the last dim: 2^ceil(log2(max(amax,1e-4)/448))."""
    amax = torch.clamp_min(x.abs().amax(dim=-1), INDEXER_AMAX_FLOOR)
    return torch.ldexp(torch.ones_like(amax), ceil_log2(amax / FP8_MAX).float())


def _scaled_codes(tiles: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    inv = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), (-exponent).float())
    return encode_e4m3(tiles * inv.unsqueeze(-1))


def model1_pack(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 512] values -> (data [N, 576] uint8, scales [N, 8] uint8) of the MODEL1 layout.

    NoPE dims are bf16-rounded then quantized per 64-dim tile; RoPE dims are stored as bf16.
    """
    x = round_bf16(kv)
    n = x.shape[0]
    tiles = x[:, :MODEL1_NOPE_DIM].reshape(n, MODEL1_NOPE_DIM // MODEL1_TILE, MODEL1_TILE)
    exponent = tile_scale_exponent(tiles)
    codes = _scaled_codes(tiles, exponent).reshape(n, MODEL1_NOPE_DIM)
    rope = x[:, MODEL1_NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    scales = torch.zeros(n, MODEL1_SCALE_BYTES, dtype=torch.uint8)
    scales[:, : tiles.shape[1]] = (exponent + 127).clamp(0, 255).to(torch.uint8)
    return torch.cat([codes, rope.reshape(n, 2 * MODEL1_ROPE_DIM)], dim=1), scales


def model1_unpack(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(data [N, 576], scales [N, 8]) -> float32 [N, 512]; scale byte b means 2^(b-127), 255 is NaN."""
    n = data.shape[0]
    nope = decode_e4m3(data[:, :MODEL1_NOPE_DIM]).reshape(n, MODEL1_NOPE_DIM // MODEL1_TILE, MODEL1_TILE)
    exps = scales[:, : nope.shape[1]].to(torch.int32) - 127
    mult = torch.ldexp(torch.ones(exps.shape), exps.float())
    mult = torch.where(scales[:, : nope.shape[1]] == 255, torch.nan, mult)
    rope = data[:, MODEL1_NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat([(nope * mult.unsqueeze(-1)).reshape(n, MODEL1_NOPE_DIM), rope], dim=1)


def v32_pack(kv: torch.Tensor) -> torch.Tensor:
    """[N, 576] values -> [N, 656] uint8 V32 entries (512 e4m3, 4 fp32 scales, 64 bf16)."""
    x = round_bf16(kv)
    n = x.shape[0]
    tiles = x[:, :V32_NOPE_DIM].reshape(n, V32_NOPE_DIM // V32_TILE, V32_TILE)
    exponent = tile_scale_exponent(tiles)
    codes = _scaled_codes(tiles, exponent).reshape(n, V32_NOPE_DIM)
    scale = torch.ldexp(torch.ones(exponent.shape), exponent.float()).contiguous()
    rope = x[:, V32_NOPE_DIM:].to(torch.bfloat16).contiguous()
    return torch.cat([codes, scale.view(torch.uint8), rope.view(torch.uint8)], dim=1)


def v32_unpack(entries: torch.Tensor) -> torch.Tensor:
    """[N, 656] uint8 -> float32 [N, 576]."""
    n = entries.shape[0]
    nope = decode_e4m3(entries[:, :V32_NOPE_DIM]).reshape(n, V32_NOPE_DIM // V32_TILE, V32_TILE)
    scale = entries[:, V32_NOPE_DIM : V32_NOPE_DIM + 16].contiguous().view(torch.float32)
    rope = entries[:, V32_NOPE_DIM + 16 :].contiguous().view(torch.bfloat16).float()
    return torch.cat([(nope * scale.unsqueeze(-1)).reshape(n, V32_NOPE_DIM), rope], dim=1)


def indexer_k_pack(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 128] values -> (e4m3 bytes [N, 128] uint8, fp32 scales [N]); values bf16-rounded first."""
    x = round_bf16(k)
    scale = indexer_scale(x)
    return encode_e4m3(x / scale.unsqueeze(-1)), scale


# ---- paged access: slot -> (page, offset) with any page stride --------------------------------


def cache_pages(cache: torch.Tensor) -> torch.Tensor:
    """View any cache tensor ([num_blocks, ...] with contiguous trailing dims) as pages of bytes."""
    flat = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    return flat.reshape(flat.shape[0], -1)


def valid_slots(slots: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    return (slots >= 0) & (slots < num_blocks * block_size)


def model1_write(cache: torch.Tensor, slots: torch.Tensor, block_size: int, kv: torch.Tensor):
    """Reference MODEL1 insert: quantize rows of ``kv`` [N, 512] into ``cache`` at ``slots``."""
    pages = cache_pages(cache)
    data, scales = model1_pack(kv)
    for i, slot in enumerate(slots.tolist()):
        if not 0 <= slot < pages.shape[0] * block_size:
            continue
        block, off = divmod(slot, block_size)
        pages[block, off * MODEL1_DATA_BYTES : (off + 1) * MODEL1_DATA_BYTES] = data[i]
        s0 = block_size * MODEL1_DATA_BYTES + off * MODEL1_SCALE_BYTES
        pages[block, s0 : s0 + MODEL1_SCALE_BYTES] = scales[i]


def model1_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Reference MODEL1 gather: float32 [*slots.shape, 512]; invalid slots give zeros."""
    pages = cache_pages(cache)
    flat = slots.reshape(-1).tolist()
    data = torch.zeros(len(flat), MODEL1_DATA_BYTES, dtype=torch.uint8)
    scales = torch.zeros(len(flat), MODEL1_SCALE_BYTES, dtype=torch.uint8)
    ok = torch.zeros(len(flat), dtype=torch.bool)
    for i, slot in enumerate(flat):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            data[i] = pages[block, off * MODEL1_DATA_BYTES : (off + 1) * MODEL1_DATA_BYTES]
            s0 = block_size * MODEL1_DATA_BYTES + off * MODEL1_SCALE_BYTES
            scales[i] = pages[block, s0 : s0 + MODEL1_SCALE_BYTES]
            ok[i] = True
    out = torch.where(ok.unsqueeze(-1), model1_unpack(data, scales), 0.0)
    return out.reshape(*slots.shape, MODEL1_NOPE_DIM + MODEL1_ROPE_DIM)


def v32_write(cache: torch.Tensor, slots: torch.Tensor, block_size: int, kv: torch.Tensor):
    """Reference V32 insert of rows of ``kv`` [N, 576]."""
    pages = cache_pages(cache)
    entries = v32_pack(kv)
    for i, slot in enumerate(slots.tolist()):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            pages[block, off * V32_BYTES_PER_TOKEN : (off + 1) * V32_BYTES_PER_TOKEN] = entries[i]


def v32_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Reference V32 gather: float32 [*slots.shape, 576]; invalid slots give zeros."""
    pages = cache_pages(cache)
    flat = slots.reshape(-1).tolist()
    entries = torch.zeros(len(flat), V32_BYTES_PER_TOKEN, dtype=torch.uint8)
    ok = torch.zeros(len(flat), dtype=torch.bool)
    for i, slot in enumerate(flat):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            entries[i] = pages[block, off * V32_BYTES_PER_TOKEN : (off + 1) * V32_BYTES_PER_TOKEN]
            ok[i] = True
    out = torch.where(ok.unsqueeze(-1), v32_unpack(entries), 0.0)
    return out.reshape(*slots.shape, V32_NOPE_DIM + V32_ROPE_DIM)


def indexer_k_write(cache: torch.Tensor, slots: torch.Tensor, block_size: int, codes, scales):
    """Reference indexer-K store of already-quantized (codes [N,128] uint8, scales [N] fp32)."""
    pages = cache_pages(cache)
    scale_bytes = scales.float().contiguous().view(torch.uint8).reshape(-1, 4)
    for i, slot in enumerate(slots.tolist()):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            pages[block, off * INDEXER_HEAD_DIM : (off + 1) * INDEXER_HEAD_DIM] = codes[i]
            s0 = block_size * INDEXER_HEAD_DIM + 4 * off
            pages[block, s0 : s0 + 4] = scale_bytes[i]


def indexer_k_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int):
    """Reference indexer-K gather: (codes uint8 [*slots.shape, 128], scales fp32 [*slots.shape]).

    Invalid slots give zero codes and zero scales.
    """
    pages = cache_pages(cache)
    flat = slots.reshape(-1).tolist()
    codes = torch.zeros(len(flat), INDEXER_HEAD_DIM, dtype=torch.uint8)
    scale_bytes = torch.zeros(len(flat), 4, dtype=torch.uint8)
    for i, slot in enumerate(flat):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            codes[i] = pages[block, off * INDEXER_HEAD_DIM : (off + 1) * INDEXER_HEAD_DIM]
            s0 = block_size * INDEXER_HEAD_DIM + 4 * off
            scale_bytes[i] = pages[block, s0 : s0 + 4]
    scales = scale_bytes.view(torch.float32).reshape(-1)
    return codes.reshape(*slots.shape, INDEXER_HEAD_DIM), scales.reshape(slots.shape)


assert MODEL1_BYTES_PER_TOKEN == MODEL1_DATA_BYTES + MODEL1_SCALE_BYTES
assert INDEXER_K_BYTES_PER_ENTRY == INDEXER_HEAD_DIM + 4
