"""dsv4::qnorm_rope_kv_insert (q RMSNorm + RoPE, kv RoPE + MODEL1 SWA insert) against its reference."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import (
    INDEX_DTYPES,
    MAX_POSITION,
    PAGE_SIZES,
    assert_equal_outside,
    assert_rejects,
    clone_storage,
    distinct_slots,
    entry_byte_index,
    random_pages,
    random_positions,
    rope_table,
    storage_bytes,
    ulp_distance,
    with_last,
)
from dsv4 import ops
from dsv4.constants import (
    CACHE_ALIGNMENT,
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
)
from dsv4.reference import kv_cache, quant, rope_slots

EPS = 1e-6
MAX_ULP = 1  # q_out bf16/fp16, cache fp8 codes and bf16 RoPE values: at most one step from the reference
MAX_SCALE_BYTE_DIFF = 1
MIN_EXACT_FRACTION = 0.99  # rounding ties aside, kernel and reference agree bit for bit
FP32_RTOL = 1e-5  # fp32 q_out: summation order of the RMS only
Q_ATOL = 1e-5  # unit-RMS q: an fp32 rounding of the RMS survives a RoPE cancellation as an absolute error
NUM_TILES = MODEL1_NOPE_DIM // MODEL1_TILE
Q_MAGNITUDES = torch.tensor([1e-4, 4.0, 100.0])
KV_MAGNITUDES = torch.tensor([1e-7, 1e-5, 3.0, 100.0])

HEAD_CASES = [(1, 1), (8, 8), (8, 16), (16, 16), (64, 64), (64, 128), (128, 128)]
SKIP_EVERY = 3  # every third slot is -1


def model1_page_bytes(block_size: int) -> int:
    """Page bytes as FlashMLA allocates them: rounded up to a multiple of 576."""
    return math.ceil(block_size * MODEL1_BYTES_PER_TOKEN / CACHE_ALIGNMENT) * CACHE_ALIGNMENT


def poisoned_q_out(tokens: int, heads: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((tokens, heads, MODEL1_HEAD_DIM), float("nan"), dtype=dtype)


def entry_byte_offsets(cache: torch.Tensor, slots: torch.Tensor, block_size: int):
    """Offsets into the cache storage of the data bytes [N, 576] and scale bytes [N, 8] of each valid slot."""
    valid = slots[slots >= 0].long()
    return (entry_byte_index(cache, valid, block_size, 0, MODEL1_DATA_BYTES),
            entry_byte_index(cache, valid, block_size, block_size * MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES))


def assert_cache_matches(cache: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor, block_size: int):
    """Written entries within one step of the reference (nearly all exact); every other byte, padding included,
    untouched."""
    flat, expected_flat = storage_bytes(cache), storage_bytes(expected)
    data_at, scales_at = entry_byte_offsets(cache, slots, block_size)
    data, expected_data = flat[data_at], expected_flat[data_at]
    scales, expected_scales = flat[scales_at], expected_flat[scales_at]
    nope_ulp = ulp_distance(data[:, :MODEL1_NOPE_DIM].view(torch.float8_e4m3fn),
                            expected_data[:, :MODEL1_NOPE_DIM].view(torch.float8_e4m3fn))
    rope_ulp = ulp_distance(data[:, MODEL1_NOPE_DIM:].contiguous().view(torch.bfloat16),
                            expected_data[:, MODEL1_NOPE_DIM:].contiguous().view(torch.bfloat16))
    assert torch.all(nope_ulp <= MAX_ULP)
    assert torch.all(rope_ulp <= MAX_ULP)
    scale_diff = (scales[:, :NUM_TILES].int() - expected_scales[:, :NUM_TILES].int()).abs()
    assert torch.all(scale_diff <= MAX_SCALE_BYTE_DIFF)
    assert torch.all(scales[:, NUM_TILES:] == 0)
    same = torch.cat([(data == expected_data).reshape(-1), (scales == expected_scales).reshape(-1)])
    assert same.numel() == 0 or same.float().mean() >= MIN_EXACT_FRACTION
    assert_equal_outside(cache, expected, [data_at, scales_at])


def assert_q_out_matches(q_out: torch.Tensor, expected: torch.Tensor, heads: int):
    assert torch.equal(q_out[:, heads:], torch.zeros_like(q_out[:, heads:])), "padded heads must be exactly 0"
    if q_out.dtype == torch.float32:
        torch.testing.assert_close(q_out, expected, rtol=FP32_RTOL, atol=Q_ATOL)
        return
    ulp = ulp_distance(q_out, expected)
    assert torch.all((ulp <= MAX_ULP) | ((q_out.float() - expected.float()).abs() <= Q_ATOL))
    assert ulp.numel() == 0 or (ulp == 0).float().mean() >= MIN_EXACT_FRACTION


def run_and_check(q, kv, positions, slots, cache, block_size, padded_heads, *, pass_q_out=True):
    """Runs the op and the reference on copies of the same cache and compares everything."""
    cos_sin = rope_table(MAX_POSITION)
    expected_cache = clone_storage(cache)
    q_out = poisoned_q_out(q.shape[0], padded_heads, q.dtype) if pass_q_out else None
    out = ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, cache, block_size, EPS,
                                   padded_heads=padded_heads, q_out=q_out)
    expected = kv_cache.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, expected_cache, block_size, EPS,
                                            padded_heads)
    assert out.shape == (q.shape[0], padded_heads, MODEL1_HEAD_DIM) and out.dtype == q.dtype
    assert_q_out_matches(out, expected, q.shape[1])
    assert_cache_matches(cache, expected_cache, slots, block_size)


def random_case(tokens, heads, inserted, dtype=torch.bfloat16):
    """q heads and kv 64-dim blocks of mixed magnitudes: eps-dominated RMS, all-subnormal fp8 tiles, scales > 1."""
    q_scale = Q_MAGNITUDES[torch.randint(0, len(Q_MAGNITUDES), (tokens, heads, 1))]
    q = (torch.randn(tokens, heads, MODEL1_HEAD_DIM) * q_scale).to(dtype)
    rows = inserted + 2  # kv may hold more rows than are inserted
    kv_scale = KV_MAGNITUDES[torch.randint(0, len(KV_MAGNITUDES), (rows, MODEL1_HEAD_DIM // MODEL1_TILE, 1))]
    kv = (torch.randn(rows, MODEL1_HEAD_DIM // MODEL1_TILE, MODEL1_TILE) * kv_scale).reshape(rows, -1).to(dtype)
    return q, kv


@pytest.mark.parametrize("heads,padded_heads", HEAD_CASES)
def test_head_counts(isa, heads, padded_heads):
    tokens, block_size = 9, 64
    q, kv = random_case(tokens, heads, tokens)
    cache = random_pages(1, model1_page_bytes(block_size))
    positions, slots = random_positions(tokens), distinct_slots(tokens, block_size, skip_every=SKIP_EVERY)
    run_and_check(q, kv, positions, slots, cache, block_size, padded_heads)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("block_size", PAGE_SIZES)
def test_page_sizes_and_padded_strides(isa, block_size, index_dtype):
    tokens, inserted, heads, pad_bytes = 20, 17, 8, 100  # fewer slots than tokens, as with DP padding
    num_blocks = max(2, math.ceil(2 * inserted / block_size))
    q, kv = random_case(tokens, heads, inserted)
    cache = random_pages(num_blocks, model1_page_bytes(block_size), pad_bytes)
    slots = distinct_slots(inserted, num_blocks * block_size, skip_every=SKIP_EVERY, index_dtype=index_dtype)
    run_and_check(q, kv, random_positions(tokens, index_dtype), slots, cache, block_size, heads)


def test_strided_inputs(isa):
    tokens, heads, block_size, num_blocks = 12, 8, 2, 8
    q, kv = random_case(tokens, heads, tokens)
    q = q.transpose(0, 1).contiguous().transpose(0, 1)  # head-major storage
    kv = torch.cat([kv, kv[:, :MODEL1_TILE]], dim=1)[:, :MODEL1_HEAD_DIM]  # padded kv rows
    positions = random_positions(2 * tokens)[::2]
    slots = distinct_slots(2 * tokens, num_blocks * block_size, skip_every=SKIP_EVERY)[::2]
    cache = random_pages(num_blocks, model1_page_bytes(block_size), 7)
    run_and_check(q, kv, positions, slots, cache, block_size, 16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_other_dtypes(isa, dtype):
    tokens, heads, block_size = 5, 8, 4
    q, kv = random_case(tokens, heads, tokens, dtype)
    cache = random_pages(2, model1_page_bytes(block_size), 32)
    positions, slots = random_positions(tokens), distinct_slots(tokens, 2 * block_size, skip_every=SKIP_EVERY)
    run_and_check(q, kv, positions, slots, cache, block_size, 16, pass_q_out=False)


def test_flashmla_shaped_cache_view(isa):
    tokens, heads, block_size, num_blocks = 6, 8, 4, 3
    q, kv = random_case(tokens, heads, tokens)
    cache = random_pages(num_blocks, block_size * MODEL1_BYTES_PER_TOKEN, 64)
    positions, slots = random_positions(tokens), distinct_slots(tokens, num_blocks * block_size, skip_every=SKIP_EVERY)
    run_and_check(q, kv, positions, slots, cache.view(num_blocks, block_size, 1, MODEL1_BYTES_PER_TOKEN), block_size,
                  heads)


def test_empty_batch(isa):
    block_size = 2
    q, kv = random_case(0, 8, 0)
    cache = random_pages(2, model1_page_bytes(block_size), 16)
    positions, slots = random_positions(0), distinct_slots(0, 4, skip_every=SKIP_EVERY)
    run_and_check(q, kv[:0], positions, slots, cache, block_size, 16)


def test_reference_semantics():
    """The reference itself: unit-RMS q heads (RoPE preserves the norm), cache rows that dequantize to RoPE(kv)."""
    tokens, heads, block_size, magnitude = 4, 2, 4, 3.0
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM) * magnitude
    kv = torch.randn(tokens, MODEL1_HEAD_DIM) * magnitude
    positions, slots = random_positions(tokens), torch.arange(tokens)
    cos_sin = rope_table(MAX_POSITION)
    cache = random_pages(1, model1_page_bytes(block_size))
    q_out = kv_cache.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, cache, block_size, EPS)
    torch.testing.assert_close(q_out.square().mean(-1), torch.ones(tokens, heads))
    nope = q[..., :MODEL1_NOPE_DIM] / q.square().mean(-1, keepdim=True).sqrt()
    torch.testing.assert_close(q_out[..., :MODEL1_NOPE_DIM], nope)
    stored = quant.model1_read(cache, slots, block_size)
    rotated = rope_slots.apply_rope(kv, positions, cos_sin)
    fp8_tolerance = dict(rtol=2**-3, atol=2**-6 * magnitude)  # e4m3: 3 mantissa bits, scale about magnitude / 64
    torch.testing.assert_close(stored, rotated, **fp8_tolerance)
    assert not torch.allclose(stored, kv, **fp8_tolerance), "the stored RoPE dims must be rotated"


def test_opcheck(opcheck):
    tokens, heads, block_size = 3, 2, 2
    q, kv = random_case(tokens, heads, tokens)
    args = (q, kv, random_positions(tokens), rope_table(MAX_POSITION),
            distinct_slots(tokens, 4, skip_every=SKIP_EVERY), random_pages(2, model1_page_bytes(block_size)),
            block_size, EPS, poisoned_q_out(tokens, 4, q.dtype))
    opcheck(torch.ops.dsv4.qnorm_rope_kv_insert.default, args)


# ---- bad inputs: a RuntimeError naming the op and the argument, raised before anything is written ----

BAD_BLOCK_SIZE = 2
BAD_NUM_BLOCKS = 2


def valid_args() -> dict:
    tokens, heads = 4, 2
    q, kv = random_case(tokens, heads, tokens)
    return dict(q=q, kv=kv, positions=random_positions(tokens), cos_sin_cache=rope_table(MAX_POSITION),
                slot_mapping=distinct_slots(tokens, BAD_NUM_BLOCKS * BAD_BLOCK_SIZE, skip_every=SKIP_EVERY),
                kv_cache=random_pages(BAD_NUM_BLOCKS, model1_page_bytes(BAD_BLOCK_SIZE)), block_size=BAD_BLOCK_SIZE,
                eps=EPS, q_out=poisoned_q_out(tokens, heads, q.dtype))


BAD_INPUTS = {
    "q dtype": (lambda a: {**a, "q": a["q"].to(torch.int32)}, "argument 'q' must have dtype"),
    "q rank": (lambda a: {**a, "q": a["q"][:, 0]}, "argument 'q' must have 3 dimensions"),
    "q head dim": (lambda a: {**a, "q": a["q"][..., :256]}, "argument 'q' must have size 512"),
    "q last dim strided": (lambda a: {**a, "q": a["q"].repeat_interleave(2, -1)[..., ::2]},
                           "argument 'q' must be contiguous in its last dimension"),
    "kv dtype": (lambda a: {**a, "kv": a["kv"].half()},
                 "argument 'kv' is Half but argument 'q' is BFloat16: they must have the same dtype"),
    "q dtype unlike kv": (lambda a: {**a, "q": a["q"].half(), "q_out": a["q_out"].half()},
                          "argument 'kv' is BFloat16 but argument 'q' is Half: they must have the same dtype"),
    "kv head dim": (lambda a: {**a, "kv": a["kv"][:, :448]}, "argument 'kv' must have size 512"),
    "positions dtype": (lambda a: {**a, "positions": a["positions"].float()}, "argument 'positions' must have dtype"),
    "positions length": (lambda a: {**a, "positions": a["positions"][:-1]}, "argument 'positions' must have size"),
    "position past the rope table": (lambda a: {**a, "positions": with_last(a["positions"], MAX_POSITION)},
                                     "argument 'positions' entry 3 is 300"),
    "negative position": (lambda a: {**a, "positions": with_last(a["positions"], -1)}, "argument 'positions' entry"),
    "cos_sin_cache width": (lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"][:, :32]},
                            "argument 'cos_sin_cache' must have size 64"),
    "cos_sin_cache dtype": (lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"].bfloat16()},
                            "argument 'cos_sin_cache' must have dtype"),
    "slot_mapping rank": (lambda a: {**a, "slot_mapping": a["slot_mapping"][None]},
                          "argument 'slot_mapping' must have 1 dimensions"),
    "slot_mapping longer than q": (lambda a: {**a, "slot_mapping": torch.full((5,), -1)},
                                   "argument 'slot_mapping' has 5 entries"),
    "kv fewer rows than slots": (lambda a: {**a, "kv": a["kv"][:2].contiguous()},
                                 "argument 'slot_mapping' has 4 entries but q has 4 tokens and kv 2 rows"),
    "slot past the cache": (lambda a: {**a, "slot_mapping": with_last(a["slot_mapping"], 4)},
                            "argument 'slot_mapping' entry 3 is 4"),
    "slot below -1": (lambda a: {**a, "slot_mapping": with_last(a["slot_mapping"], -2)},
                      "argument 'slot_mapping' entry 3 is -2"),
    "kv_cache dtype": (lambda a: {**a, "kv_cache": a["kv_cache"].float()}, "argument 'kv_cache' must have dtype"),
    "kv_cache page too small": (lambda a: {**a, "block_size": 3}, "argument 'kv_cache' pages hold"),
    "block_size zero": (lambda a: {**a, "block_size": 0}, "argument 'block_size' must be positive"),
    "q_out dtype": (lambda a: {**a, "q_out": a["q_out"].float()}, "argument 'q_out' must have dtype"),
    "q_out not contiguous": (lambda a: {**a, "q_out": a["q_out"].transpose(0, 1).contiguous().transpose(0, 1)},
                             "argument 'q_out' must be contiguous"),
    "q_out fewer heads": (lambda a: {**a, "q_out": poisoned_q_out(4, 1, a["q"].dtype)}, "argument 'q_out' has 1 heads"),
    "q_out tokens": (lambda a: {**a, "q_out": a["q_out"][1:]}, "argument 'q_out' must have size 4 in dimension 0"),
    "q_out overlaps kv": (lambda a: {**a, "kv": a["q_out"].view(4, -1)[:, :512]},
                          "argument 'q_out' overlaps argument 'kv'"),
    "q_out is q": (lambda a: {**a, "q_out": a["q"]}, "argument 'q_out' overlaps argument 'q'"),
    "two tokens, one slot": (lambda a: {**a, "slot_mapping": torch.tensor([1, 3, 1, -1])},
                             "argument 'slot_mapping' entries 0 and 2 both write slot 1"),
    "eps zero": (lambda a: {**a, "eps": 0.0}, "argument 'eps' must be positive"),
    "eps negative": (lambda a: {**a, "eps": -1e-6}, "argument 'eps' must be positive"),
    "eps nan": (lambda a: {**a, "eps": float("nan")}, "argument 'eps' must be positive"),
    "eps below fp32": (lambda a: {**a, "eps": 1e-50}, "argument 'eps' must be positive"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rejects_bad_input(case):
    mutate, message = BAD_INPUTS[case]
    assert_rejects(torch.ops.dsv4.qnorm_rope_kv_insert, mutate(valid_args()), f"dsv4::qnorm_rope_kv_insert: {message}",
                   unchanged=("kv_cache", "q_out"))
