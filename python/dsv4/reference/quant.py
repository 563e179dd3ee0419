"""Byte-exact quantizers and dequantizers of every dsv4 cache layout (pure torch).

These are the executable specification of the cache formats; the kernels must produce and
read exactly these bytes. All math is float32 on the CPU.

Layouts (one page of ``block_size`` entries; pages may be padded, always honour stride(0)):
- MODEL1 (``fp8_ds_mla``, DSv4): entry i data at ``576*i``: 448 e4m3 NoPE bytes, 64 bf16 RoPE
  values; then at ``576*block_size + 8*i``: 7 UE8M0 scale bytes (one per 64-dim tile), 1 zero pad.
- V32 (DeepSeek-V3.2, 656 B/entry, row-interleaved): 512 e4m3, 4 fp32 scales (128-dim tiles),
  64 bf16 RoPE values.
- V4.1 fp8 (528 B/entry): 512 e4m3 codes for all dims (RoPE dims included), 16 UE8M0 scales (dims 32j..32j+31).
- V4.1 fp4 (288 B/entry, extra cache only): 256 bytes of e2m1 codes (dim 2i in the low nibble of byte i, 2i+1
  in the high one), 32 e4m3 scales (dims 16j..16j+15).
- Indexer K (132 B/entry): entry i's 128 e4m3 bytes at ``128*i``, its fp32 scale at
  ``128*block_size + 4*i``.
- Indexer K MXFP4 (68 B/entry, DeepSeek-V4.1): entry i's 64 bytes of e2m1 pairs at ``64*i``, its 4 UE8M0 scales
  (dims 32j..32j+31) at ``64*block_size + 4*i``.

Every attention record is a data part and a scale part (V32's "scales" are the bytes after its codes). Two
placements put them in a page: ``page_split`` (MODEL1 always, V4.1 as vLLM and SGLang write it): data of entry i at
``D*i``, scales at ``D*block_size + S*i``; ``per_token`` (V32 always, V4.1 as FlashMLA upstream writes it): entry i
at ``(D+S)*i``, data then scales.
"""

from __future__ import annotations

import torch

from ..constants import (
    E2M1_MAX,
    FP4_SCALE_MIN,
    FP8_MAX,
    INDEXER_AMAX_FLOOR,
    INDEXER_HEAD_DIM,
    INDEXER_K_BYTES_PER_ENTRY,
    INDEXER_K_FP4_DATA_BYTES,
    INDEXER_K_FP4_SCALE_BYTES,
    INDEXER_MXFP4_BLOCK,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_NOPE_DIM,
    MODEL1_ROPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
    MXFP4_AMAX_FLOOR,
    SCALE_FLOOR,
    V32_BYTES_PER_TOKEN,
    V32_NOPE_DIM,
    V32_ROPE_DIM,
    V32_TILE,
    V41_FP4_TILE,
    V41_FP8_TILE,
    V41_HEAD_DIM,
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


def v41_fp8_pack(kv: torch.Tensor, rule: str = "flashmla") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 512] values -> (codes [N, 512] uint8, UE8M0 scales [N, 16] uint8) of the V4.1 fp8 record.

    Values are bf16-rounded, then quantized per 32-dim tile. ``rule="flashmla"`` (what dsv4's kernels write):
    scale ``2^ceil(log2(max(amax / 448, 1e-4)))``. ``rule="vllm"`` (vLLM's and DeepGEMM's writers): amax floored
    at 1e-4 before the division, codes clamped to +-448; tiles with amax < 0.0448 get a smaller scale byte. Both
    decode with :func:`v41_fp8_unpack` to the tile's values within its code precision.
    """
    x = round_bf16(kv)
    n = x.shape[0]
    tiles = x.reshape(n, V41_HEAD_DIM // V41_FP8_TILE, V41_FP8_TILE)
    if rule == "flashmla":
        exponent = tile_scale_exponent(tiles)
    elif rule == "vllm":
        exponent = ceil_log2(torch.clamp_min(tiles.abs().amax(dim=-1), SCALE_FLOOR) / FP8_MAX)
    else:
        raise ValueError(f"unknown fp8 scale rule {rule!r}; supported: 'flashmla', 'vllm'")
    codes = _scaled_codes(tiles, exponent).reshape(n, V41_HEAD_DIM)
    return codes, (exponent + 127).clamp(0, 255).to(torch.uint8)


def _ue8m0(scales: torch.Tensor) -> torch.Tensor:
    """Multipliers of UE8M0 scale bytes: 2^(b - 127), 255 is NaN."""
    mult = torch.ldexp(torch.ones(scales.shape), (scales.to(torch.int32) - 127).float())
    return torch.where(scales == 255, torch.nan, mult)


def v41_fp8_unpack(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(codes [N, 512], scales [N, 16]) -> float32 [N, 512]."""
    n = codes.shape[0]
    tiles = decode_e4m3(codes).reshape(n, V41_HEAD_DIM // V41_FP8_TILE, V41_FP8_TILE)
    return (tiles * _ue8m0(scales).unsqueeze(-1)).reshape(n, V41_HEAD_DIM)


E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Rounding thresholds between neighbouring e2m1 magnitudes; a tie goes to the even code: at 0.25, 1.25, 2.5 and 5
# the lower neighbour, at 0.75, 1.75 and 3.5 the upper one.
_E2M1_BOUNDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def encode_e2m1(y: torch.Tensor) -> torch.Tensor:
    """float32 -> e2m1 codes (uint8 0..15): nearest, ties to even, saturating at +-6; NaN -> 0; the sign bit is
    kept (-0 and negatives that round to 0 give code 8)."""
    a = y.abs()
    magnitude = torch.zeros(y.shape, dtype=torch.uint8)
    for bound, tie_up in _E2M1_BOUNDS:
        magnitude += (a >= bound if tie_up else a > bound).to(torch.uint8)
    code = magnitude | torch.signbit(y).to(torch.uint8) << 3
    return torch.where(torch.isnan(y), 0, code).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES))
    return table[codes.long()]


def fp4_tile_scales(tiles: torch.Tensor) -> torch.Tensor:
    """e4m3 scale bytes of fp4 tiles (last dim): ``e4m3_rne(clamp(amax / 6, 2^-9, 448))``; a tile holding NaN or
    inf gets the NaN byte 0x7f."""
    amax = tiles.abs().amax(dim=-1)
    poisoned = ~torch.isfinite(tiles).all(dim=-1)
    scales = encode_e4m3(torch.clamp(amax / E2M1_MAX, FP4_SCALE_MIN, FP8_MAX))
    return torch.where(poisoned, 0x7F, scales).to(torch.uint8)


def v41_fp4_pack(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 512] values -> (e2m1 pairs [N, 256] uint8, e4m3 scales [N, 32] uint8) of the V4.1 fp4 record.

    Values are bf16-rounded; per 16-dim tile the codes are ``e2m1(x / scale)`` (an fp32 division, rounded once).
    """
    x = round_bf16(kv)
    n = x.shape[0]
    tiles = x.reshape(n, V41_HEAD_DIM // V41_FP4_TILE, V41_FP4_TILE)
    scales = fp4_tile_scales(tiles)
    codes = encode_e2m1(tiles / decode_e4m3(scales).unsqueeze(-1)).reshape(n, V41_HEAD_DIM // 2, 2)
    return codes[..., 0] | codes[..., 1] << 4, scales


def v41_fp4_unpack(data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(e2m1 pairs [N, 256], e4m3 scales [N, 32]) -> float32 [N, 512] (exact: every value is a bf16)."""
    n = data.shape[0]
    codes = torch.stack([data & 0xF, data >> 4], dim=-1).reshape(n, V41_HEAD_DIM // V41_FP4_TILE, V41_FP4_TILE)
    return (decode_e2m1(codes) * decode_e4m3(scales).unsqueeze(-1)).reshape(n, V41_HEAD_DIM)


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
    write_records(cache, slots, block_size, kv, "model1")


def model1_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Reference MODEL1 gather: float32 [*slots.shape, 512]; invalid slots give zeros."""
    return read_records(cache, slots, block_size, "model1")


def v32_write(cache: torch.Tensor, slots: torch.Tensor, block_size: int, kv: torch.Tensor):
    """Reference V32 insert of rows of ``kv`` [N, 576]."""
    write_records(cache, slots, block_size, kv, "v32")


def v32_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Reference V32 gather: float32 [*slots.shape, 576]; invalid slots give zeros."""
    return read_records(cache, slots, block_size, "v32")


def indexer_k_write(cache: torch.Tensor, slots: torch.Tensor, block_size: int, codes, scales, key_format="fp8"):
    """Reference indexer-K store of already-quantized (codes [N,128] uint8, scales [N] fp32); ``key_format="mxfp4"``:
    (e2m1 pairs [N, 64] uint8, UE8M0 bytes [N, 4] uint8) into 68 B entries (:func:`indexer_key_write`)."""
    if key_format != "fp8":
        indexer_key_write(cache, slots, block_size, codes, scales, key_format)
        return
    pages = cache_pages(cache)
    scale_bytes = scales.float().contiguous().view(torch.uint8).reshape(-1, 4)
    for i, slot in enumerate(slots.tolist()):
        if 0 <= slot < pages.shape[0] * block_size:
            block, off = divmod(slot, block_size)
            pages[block, off * INDEXER_HEAD_DIM : (off + 1) * INDEXER_HEAD_DIM] = codes[i]
            s0 = block_size * INDEXER_HEAD_DIM + 4 * off
            pages[block, s0 : s0 + 4] = scale_bytes[i]


def indexer_k_read(cache: torch.Tensor, slots: torch.Tensor, block_size: int, key_format: str = "fp8"):
    """Reference indexer-K gather: (codes uint8 [*slots.shape, 128], scales fp32 [*slots.shape]); ``key_format=
    "mxfp4"``: (e2m1 pairs uint8 [*slots.shape, 64], UE8M0 bytes uint8 [*slots.shape, 4]).

    Invalid slots give zero codes and zero scales.
    """
    if key_format != "fp8":
        return indexer_key_read(cache, slots, block_size, key_format)
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


# ---- every attention record through one pair of paged writer / reader ----------------------------------------

# record -> (head dim, data bytes, scale bytes, pack to (data, scales), unpack, placements)
RECORDS = {
    "model1": (MODEL1_NOPE_DIM + MODEL1_ROPE_DIM, MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES, model1_pack, model1_unpack,
               ("page_split",)),
    "v32": (V32_NOPE_DIM + V32_ROPE_DIM, V32_NOPE_DIM, V32_BYTES_PER_TOKEN - V32_NOPE_DIM,
            lambda kv: (lambda e: (e[:, :V32_NOPE_DIM], e[:, V32_NOPE_DIM:]))(v32_pack(kv)),
            lambda d, s: v32_unpack(torch.cat([d, s], dim=1)), ("per_token",)),
    "v41_fp8": (V41_HEAD_DIM, V41_HEAD_DIM, V41_HEAD_DIM // V41_FP8_TILE, v41_fp8_pack, v41_fp8_unpack,
                ("page_split", "per_token")),
    "v41_fp4": (V41_HEAD_DIM, V41_HEAD_DIM // 2, V41_HEAD_DIM // V41_FP4_TILE, v41_fp4_pack, v41_fp4_unpack,
                ("page_split", "per_token")),
}
PLACEMENTS = ("page_split", "per_token")


def record_placement(layout: str, placement: str) -> str:
    """The placement a record is stored in: V4.1 records take either, MODEL1 and V32 have one each."""
    if layout not in RECORDS:
        raise ValueError(f"unknown KV record {layout!r}; supported: {sorted(RECORDS)}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; supported: {PLACEMENTS}")
    return placement if placement in RECORDS[layout][5] else RECORDS[layout][5][0]


def _entry_byte_index(layout: str, placement: str, block_size: int, offsets: torch.Tensor):
    """Byte columns in a page of the data and scale parts of entries at ``offsets`` ([N] -> [N, D], [N, S])."""
    _, data, scales, *_ = RECORDS[layout]
    off = offsets.long()[:, None]
    if record_placement(layout, placement) == "per_token":
        start = off * (data + scales)
        return start + torch.arange(data), start + data + torch.arange(scales)
    return off * data + torch.arange(data), block_size * data + off * scales + torch.arange(scales)


def write_records(cache, slots, block_size, kv, layout="v41_fp8", placement="page_split", rule="flashmla"):
    """Reference insert of rows ``kv`` [N, head dim] as ``layout`` records at ``slots`` (-1 and slots outside the
    cache skipped). ``rule`` chooses the V4.1 fp8 scale rule (:func:`v41_fp8_pack`)."""
    pages = cache_pages(cache)
    pack = RECORDS[layout][3]
    data, scales = pack(kv, rule) if layout == "v41_fp8" else pack(kv)
    ok = valid_slots(slots.long(), pages.shape[0], block_size)
    block, off = slots.long()[ok] // block_size, slots.long()[ok] % block_size
    data_cols, scale_cols = _entry_byte_index(layout, placement, block_size, off)
    pages[block[:, None], data_cols] = data[ok]
    pages[block[:, None], scale_cols] = scales[ok]


def read_records(cache, slots, block_size, layout="v41_fp8", placement="page_split"):
    """Reference gather of ``layout`` records: float32 ``[*slots.shape, head dim]``; invalid slots give zeros."""
    pages = cache_pages(cache)
    dim, data_bytes, scale_bytes, _, unpack, _ = RECORDS[layout]
    flat = slots.reshape(-1).long()
    ok = valid_slots(flat, pages.shape[0], block_size)
    safe = torch.where(ok, flat, 0)
    block, off = safe // block_size, safe % block_size
    data_cols, scale_cols = _entry_byte_index(layout, placement, block_size, off)
    rows = unpack(pages[block[:, None], data_cols], pages[block[:, None], scale_cols]) if flat.numel() else None
    out = torch.zeros(flat.numel(), dim) if rows is None else torch.where(ok[:, None], rows, 0.0)
    return out.reshape(*slots.shape, dim)


def convert_placement(cache, block_size, layout, src_placement, dst_placement, out=None):
    """The same records in the other placement (a byte permutation of each page): ``cache`` [num_blocks, ...] ->
    uint8 [num_blocks, page bytes] (``out`` when given, any device). Page padding is copied as zeros."""
    src = cache_pages(cache)
    _, data, scales, *_ = RECORDS[layout]
    raw = block_size * (data + scales)
    dst = torch.zeros_like(src) if out is None else cache_pages(out)
    if record_placement(layout, src_placement) == record_placement(layout, dst_placement):
        dst[:, :raw] = src[:, :raw]
        return dst
    split = lambda p: (p[:, : block_size * data].reshape(-1, block_size, data),  # noqa: E731
                       p[:, block_size * data : raw].reshape(-1, block_size, scales))
    if record_placement(layout, src_placement) == "page_split":
        d, s = split(src)
        dst[:, :raw] = torch.cat([d, s], dim=2).reshape(-1, raw)
    else:
        rows = src[:, :raw].reshape(-1, block_size, data + scales)
        dst[:, :raw] = torch.cat([rows[..., :data].reshape(-1, block_size * data),
                                  rows[..., data:].reshape(-1, block_size * scales)], dim=1)
    return dst


assert MODEL1_BYTES_PER_TOKEN == MODEL1_DATA_BYTES + MODEL1_SCALE_BYTES
assert INDEXER_K_BYTES_PER_ENTRY == INDEXER_HEAD_DIM + 4


# ---- MXFP4 (DeepSeek-V4.1 indexer keys and queries) ---------------------------------------------------------------
#
# Per block of 32 dims: amax = max |x| over the block's non-NaN values, floored at 6 * 2^-126; exponent
# e = ceil(log2(amax / 6)) (the fp32 division, rounded once) clamped to [-127, 127] (an infinite amax gives 127);
# scale byte e + 127; codes e2m1(x * 2^-e) rounded to the nearest grid value with ties to the lower magnitude
# (boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 take the lower code), saturating at 6, the sign bit only on a
# non-zero magnitude. NaN has no e2m1 code: it is left out of amax and stored as code 0. Codes pack two per byte,
# the even dim in the low nibble. Decoding: e2m1(code) * 2^(byte - 127) (byte 255 is NaN, as every UE8M0 byte here).

_MXFP4_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def mxfp4_exponent(blocks: torch.Tensor) -> torch.Tensor:
    """int32 scale exponents of blocks (last dim): ceil(log2(max(amax, 6 * 2^-126) / 6)) in [-127, 127]."""
    a = blocks.float().abs()
    amax = torch.where(torch.isnan(a), 0.0, a).amax(dim=-1)
    amax = torch.clamp_min(amax, MXFP4_AMAX_FLOOR)
    finite = torch.isfinite(amax)
    exponent = ceil_log2(torch.where(finite, amax / E2M1_MAX, 1.0))
    return torch.where(finite, exponent, 127).clamp(-127, 127).to(torch.int32)


def encode_e2m1_lower_ties(y: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15) of fp32 y: nearest, ties to the lower magnitude, saturating at 6; NaN -> 0; the sign
    bit only with a non-zero magnitude."""
    a = y.abs()
    magnitude = torch.zeros(y.shape, dtype=torch.uint8)
    for bound in _MXFP4_BOUNDS:
        magnitude += (a > bound).to(torch.uint8)  # NaN compares false: magnitude 0
    sign = (torch.signbit(y) & (magnitude > 0)).to(torch.uint8) << 3
    return magnitude | sign


def mxfp4_pack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., D]`` values (D a multiple of 32) -> (e2m1 pairs uint8 ``[..., D/2]``, UE8M0 bytes uint8 ``[..., D/32]``).

    Values are used as given (fp32); callers round to bf16 first where the format says so."""
    shape = x.shape
    blocks = x.float().reshape(*shape[:-1], shape[-1] // INDEXER_MXFP4_BLOCK, INDEXER_MXFP4_BLOCK)
    exponent = mxfp4_exponent(blocks)
    scaled = torch.ldexp(blocks, (-exponent).unsqueeze(-1).float())
    codes = encode_e2m1_lower_ties(scaled).reshape(*shape[:-1], shape[-1] // 2, 2)
    return codes[..., 0] | codes[..., 1] << 4, (exponent + 127).to(torch.uint8)


def mxfp4_unpack(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(e2m1 pairs uint8 ``[..., D/2]``, UE8M0 bytes uint8 ``[..., D/32]``) -> float32 ``[..., D]`` (exact)."""
    shape = codes.shape
    dim = 2 * shape[-1]
    values = decode_e2m1(torch.stack([codes & 0xF, codes >> 4], dim=-1).reshape(*shape[:-1], dim))
    blocks = values.reshape(*shape[:-1], dim // INDEXER_MXFP4_BLOCK, INDEXER_MXFP4_BLOCK)
    return (blocks * _ue8m0(scales).unsqueeze(-1)).reshape(*shape[:-1], dim)


# ---- the indexer K cache in either key format: (data bytes, scale bytes) per entry ------------------------------

# key format -> (data bytes, scale bytes) of one entry
INDEXER_KEY_PARTS = {
    "fp8": (INDEXER_HEAD_DIM, INDEXER_K_BYTES_PER_ENTRY - INDEXER_HEAD_DIM),
    "mxfp4": (INDEXER_K_FP4_DATA_BYTES, INDEXER_K_FP4_SCALE_BYTES),
}


def check_key_format(key_format: str) -> tuple[int, int]:
    """(data bytes, scale bytes) of one entry of the key format; raises on an unknown name."""
    if key_format not in INDEXER_KEY_PARTS:
        raise ValueError(f"unknown indexer key format {key_format!r}; supported: {sorted(INDEXER_KEY_PARTS)}")
    return INDEXER_KEY_PARTS[key_format]


def indexer_key_pack(k: torch.Tensor, key_format: str = "fp8") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, 128] values -> (data uint8 [N, D], scale bytes uint8 [N, S]) of one key format; values bf16-rounded."""
    check_key_format(key_format)
    if key_format == "mxfp4":
        return mxfp4_pack(round_bf16(k))
    codes, scales = indexer_k_pack(k)
    return codes, scales.float().contiguous().view(torch.uint8).reshape(-1, 4)


def indexer_key_unpack(data: torch.Tensor, scales: torch.Tensor, key_format: str = "fp8"):
    """(data [N, D], scale bytes [N, S]) -> (float32 values [N, 128] before the key scale, fp32 key scales [N]):
    fp8 keys keep their one scale apart (the logits multiply by it last); mxfp4 keys are decoded whole, scale 1."""
    check_key_format(key_format)
    if key_format == "mxfp4":
        return mxfp4_unpack(data, scales), torch.ones(data.shape[0])
    return decode_e4m3(data), scales.contiguous().view(torch.float32).reshape(-1)


def _indexer_entry_columns(key_format: str, block_size: int, offsets: torch.Tensor):
    data, scales = check_key_format(key_format)
    off = offsets.long()[:, None]
    return off * data + torch.arange(data), block_size * data + off * scales + torch.arange(scales)


def indexer_key_write(cache, slots, block_size, data, scales, key_format="fp8"):
    """Reference store of already-packed keys (data [N, D], scale bytes [N, S]) at slots (invalid ones skipped)."""
    pages = cache_pages(cache)
    ok = valid_slots(slots.long(), pages.shape[0], block_size)
    block, off = slots.long()[ok] // block_size, slots.long()[ok] % block_size
    data_cols, scale_cols = _indexer_entry_columns(key_format, block_size, off)
    pages[block[:, None], data_cols] = data[ok]
    pages[block[:, None], scale_cols] = scales[ok]


def indexer_key_read(cache, slots, block_size, key_format="fp8"):
    """Reference gather: (data uint8 [*slots.shape, D], scale bytes uint8 [*slots.shape, S]); invalid slots zero."""
    pages = cache_pages(cache)
    data, scales = check_key_format(key_format)
    flat = slots.reshape(-1).long()
    ok = valid_slots(flat, pages.shape[0], block_size)
    safe = torch.where(ok, flat, 0)
    data_cols, scale_cols = _indexer_entry_columns(key_format, block_size, safe % block_size)
    block = (safe // block_size)[:, None]
    got_data = torch.where(ok[:, None], pages[block, data_cols], 0) if flat.numel() else torch.zeros(0, data)
    got_scales = torch.where(ok[:, None], pages[block, scale_cols], 0) if flat.numel() else torch.zeros(0, scales)
    return (got_data.to(torch.uint8).reshape(*slots.shape, data),
            got_scales.to(torch.uint8).reshape(*slots.shape, scales))


def indexer_k_insert(cache, slots, block_size, k, key_format="fp8"):
    """Reference ``indexer_k_quant_insert``: rows k [N, 128] bf16-rounded, packed in key_format, stored at slots."""
    data, scales = indexer_key_pack(k, key_format)
    indexer_key_write(cache, slots, block_size, data, scales, key_format)
