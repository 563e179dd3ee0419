"""Native sparse_mla_decode against the reference on every CPU tier.

A FlashMLA-style grid (a representative subset by default; all of it with DSV4_FULL_GRID=1 or -m slow),
corner cases (nothing valid, zero lengths, infinite sinks, ids past the cache, duplicates, page sizes 1 and
576), strided inputs, a rising running max, thread splits and determinism. Caches are NaN wherever no valid
entry points, so reading a skipped entry fails the NaN check.
"""

from __future__ import annotations

import math

import pytest
import torch

from dsv4 import ops
from dsv4.constants import (
    MODEL1_BYTES_PER_TOKEN,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_SCALE_BYTES,
    ROPE_DIM,
    V32_BYTES_PER_TOKEN,
    V32_HEAD_DIM,
    V32_NOPE_DIM,
)
from dsv4.reference import quant
from helpers.sparse_mla_cases import (
    D_V,
    DEFAULT_DECODE_CASES,
    SPLIT_THREADS,
    WRITERS,
    DecodeCase,
    assert_attention_close,
    decode_grid,
    decode_inputs,
    poisoned_cache,
    q_off_16_bytes,
    reference_decode,
    require_full_grid,
)


def check_decode(args: dict) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = ops.sparse_mla_decode(**args)
    assert_attention_close(out, lse, *reference_decode(args))
    return out, lse


@pytest.mark.parametrize("case", DEFAULT_DECODE_CASES, ids=str)
def test_decode_matches_reference(isa, case):
    check_decode(decode_inputs(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", decode_grid(), ids=str)
def test_decode_full_grid(request, isa, case):
    require_full_grid(request)
    check_decode(decode_inputs(case))


# ---------------------------------------------------------------------------------------------
# Corner cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_nothing_valid_gives_zero_and_inf(isa, d_qk):
    case = DecodeCase(d_qk, b=4, s_q=2, h_q=5, topk=70, page=3, extra_topk=20, extra_page=5, topk_length=True,
                      extra_topk_length=True)
    args = decode_inputs(case)
    capacity = args["kv_cache"].shape[0] * case.page
    args["indices"][0] = -1  # all -1
    args["indices"][1] = torch.tensor([capacity, -2, 2**31 - 1]).repeat(24)[: case.topk]  # all outside
    args["topk_length"][2:] = 0  # batches 2 and 3: zero lengths (their extra sets too)
    args["extra_indices"][:2] = -1
    args["extra_topk_length"][2:] = 0
    out, lse = check_decode(args)
    assert torch.equal(out, torch.zeros_like(out)) and (lse == math.inf).all()


def test_infinite_sinks(isa):
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=3, topk=50, page=7, sink=False))
    plain_out, plain_lse = check_decode(args)
    args["attn_sink"] = torch.tensor([-math.inf, math.inf, 0.5])
    out, lse = check_decode(args)
    assert torch.equal(lse, plain_lse)  # the returned lse never includes the sink
    assert torch.equal(out[:, :, 0], plain_out[:, :, 0])  # -inf: no effect
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))  # +inf: zero output


def test_ids_past_the_cache_are_never_read(isa):
    """Slots just past the cache, far past it (int64) and negative; the page right after the cache is NaN."""
    block_size, num_blocks = 4, 3
    written = torch.tensor([0, 5, 11])
    backing = poisoned_cache(MODEL1_HEAD_DIM, num_blocks + 1, block_size, written)
    cache = backing[:num_blocks]  # a read past the cache's last page would land in NaN bytes
    indices = torch.tensor([[[0, 12, 13, 15, 5, 2**40, -3, 11]]])
    check_decode(dict(q=torch.randn(1, 1, 4, MODEL1_HEAD_DIM).bfloat16(), kv_cache=cache, indices=indices,
                      block_size=block_size))


def test_duplicates_are_attended_twice(isa):
    block_size = 4
    cache = poisoned_cache(MODEL1_HEAD_DIM, 2, block_size, torch.tensor([2, 5]))
    q = torch.randn(1, 1, 2, MODEL1_HEAD_DIM).bfloat16()
    twice, _ = check_decode(dict(q=q, kv_cache=cache, indices=torch.tensor([[[5, 2, 5]]]), block_size=block_size))
    once, _ = check_decode(dict(q=q, kv_cache=cache, indices=torch.tensor([[[5, 2]]]), block_size=block_size))
    assert not torch.equal(twice, once)


@pytest.mark.parametrize("page", [1, 576])
@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_extreme_page_sizes(isa, page, d_qk):
    check_decode(decode_inputs(DecodeCase(d_qk, b=2, s_q=1, h_q=8, topk=96, page=page, extra_topk=33,
                                          extra_page=577 - page, topk_length=True)))


def test_extra_set_only_and_empty_extra(isa):
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=16, topk=40, page=8, extra_topk=30, extra_page=4))
    args["indices"][:] = -1  # only the extra set attends
    check_decode(args)
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=16, topk=40, page=8, extra_topk=30, extra_page=4))
    args["extra_indices"] = args["extra_indices"][..., :0]  # an extra set with no columns
    check_decode(args)


def test_strided_inputs(isa):
    """q with padded heads, indices as a strided view, FlashMLA's 4-D cache view over padded pages."""
    args = decode_inputs(DecodeCase(b=3, s_q=2, h_q=12, topk=64, page=16, extra_topk=32, extra_page=8))
    wide_q = torch.randn(3, 2, 16, MODEL1_HEAD_DIM + 64).bfloat16()
    wide_q[:, :, :12, :MODEL1_HEAD_DIM] = args["q"]
    args["q"] = wide_q[:, :, :12, :MODEL1_HEAD_DIM]
    args["indices"] = args["indices"].transpose(0, 2).contiguous().transpose(0, 2)
    cache = args["kv_cache"]
    args["kv_cache"] = cache[:, : 16 * 584].view(cache.shape[0], 16, 1, 584)
    check_decode(args)


def test_q_rows_off_16_byte_alignment(isa):
    """q rows starting 2 bytes past a 16-byte boundary (no tensor copies of q on the Hopper tier: element loads)."""
    args = decode_inputs(DecodeCase(b=3, s_q=2, h_q=70, topk=64, page=16, extra_topk=32, extra_page=8))
    args["q"] = q_off_16_bytes(args["q"])
    check_decode(args)


def test_rising_scores_raise_the_running_max(isa):
    """Scores climbing by far more than the lazy-max slack from one 128-row chunk to the next (head 0), and
    falling (head 1)."""
    entries, block_size = 400, 16
    q_row = torch.randn(MODEL1_HEAD_DIM)
    ramp = torch.linspace(0, 2, entries)[:, None]
    rows = ramp * q_row + 0.1 * torch.randn(entries, MODEL1_HEAD_DIM)
    cache = poisoned_cache(MODEL1_HEAD_DIM, entries // block_size, block_size, torch.tensor([]))
    WRITERS[MODEL1_HEAD_DIM](cache, torch.arange(entries), block_size, rows)
    q = torch.stack([q_row, -q_row]).bfloat16().view(1, 1, 2, MODEL1_HEAD_DIM)
    check_decode(dict(q=q, kv_cache=cache, indices=torch.arange(entries).view(1, 1, entries), block_size=block_size))


@pytest.mark.parametrize("scale", [-0.05, 0.0, 0.3])
def test_any_softmax_scale(isa, scale):
    """Negative, zero and large scales: the running max is that of the scaled scores (a negative scale turns the
    largest dot products into the smallest logits)."""
    args = decode_inputs(DecodeCase(b=2, h_q=8, topk=96, page=16, extra_topk=32, extra_page=8, topk_length=True))
    args["sm_scale"] = scale
    check_decode(args)


def single_entry_outputs(cache: torch.Tensor, block_size: int, d_qk: int) -> torch.Tensor:
    """out of query n attending entry n alone with q = 0: exactly that entry's row, as bf16."""
    entries = cache.shape[0] * block_size
    q = torch.zeros(1, entries, 1, d_qk).bfloat16()
    out, lse = ops.sparse_mla_decode(q, cache, torch.arange(entries).view(1, entries, 1), block_size)
    assert (lse == 0).all()
    return out[0, :, 0]


FINITE_E4M3_CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
DIRECT_SCALE_BYTES = (10, 246)  # MODEL1 scale bytes the AVX-512 tiers decode straight to bf16 bits
BF16_TINY = torch.finfo(torch.bfloat16).tiny  # bf16 products flush smaller magnitudes to zero


def assert_rows_equal_where_normal(got: torch.Tensor, want: torch.Tensor) -> None:
    comparable = (want.float().abs() >= BF16_TINY) | (want == 0)
    assert comparable.float().mean() > 0.99
    assert torch.equal(got[comparable], want[comparable])


def test_every_e4m3_code_and_scale_byte_decodes_exactly(isa):
    """MODEL1 rows with every finite e4m3 code under every scale byte of the direct path plus its neighbours
    match the reference's rows bit for bit."""
    scale_bytes = torch.arange(DIRECT_SCALE_BYTES[0] - 3, DIRECT_SCALE_BYTES[1] + 1, dtype=torch.uint8)
    entries = len(scale_bytes)
    cache = torch.zeros(1, entries * MODEL1_BYTES_PER_TOKEN, dtype=torch.uint8)
    scale_region = entries * MODEL1_DATA_BYTES
    for e in range(entries):
        data = cache[0, e * MODEL1_DATA_BYTES : (e + 1) * MODEL1_DATA_BYTES]
        data[:MODEL1_NOPE_DIM] = FINITE_E4M3_CODES[(torch.arange(MODEL1_NOPE_DIM) + 37 * e) % len(FINITE_E4M3_CODES)]
        data[MODEL1_NOPE_DIM:] = torch.randn(ROPE_DIM).bfloat16().view(torch.uint8)
        cache[0, scale_region + e * MODEL1_SCALE_BYTES : scale_region + e * MODEL1_SCALE_BYTES + 7] = scale_bytes[e]
    want = quant.model1_read(cache, torch.arange(entries), entries).bfloat16()
    assert_rows_equal_where_normal(single_entry_outputs(cache, entries, MODEL1_HEAD_DIM), want)


def test_nan_codes_give_nan_rows(isa):
    """An attended MODEL1 entry with an e4m3 NaN code (0x7f or 0xff) at any nope position gives a NaN row and lse,
    as the reference's dequantized NaN does; clean entries next to it stay exact."""
    positions = list(range(0, MODEL1_NOPE_DIM, 11)) + [MODEL1_NOPE_DIM - 1]
    entries = len(positions) + 4
    cache = torch.zeros(1, entries * MODEL1_BYTES_PER_TOKEN, dtype=torch.uint8)
    scale_region = entries * MODEL1_DATA_BYTES
    for e in range(entries):
        data = cache[0, e * MODEL1_DATA_BYTES : (e + 1) * MODEL1_DATA_BYTES]
        data[:MODEL1_NOPE_DIM] = FINITE_E4M3_CODES[torch.randint(len(FINITE_E4M3_CODES), (MODEL1_NOPE_DIM,))]
        if e < len(positions):
            data[positions[e]] = 0x7F if e % 2 else 0xFF
        data[MODEL1_NOPE_DIM:] = torch.randn(ROPE_DIM).bfloat16().view(torch.uint8)
        cache[0, scale_region + e * MODEL1_SCALE_BYTES : scale_region + e * MODEL1_SCALE_BYTES + 7] = 120 + e % 8
    q = torch.zeros(1, entries, 2, MODEL1_HEAD_DIM).bfloat16()  # clean rows: weight exactly 1, out the row itself
    out, lse = ops.sparse_mla_decode(q, cache, torch.arange(entries).view(1, entries, 1), entries)
    assert torch.isnan(out[0, : len(positions)]).all() and torch.isnan(lse[0, :, : len(positions)]).all()
    clean = quant.model1_read(cache, torch.arange(entries), entries).bfloat16()[len(positions) :]
    assert torch.equal(out[0, len(positions) :], clean[:, None].expand(-1, 2, -1))


def test_nan_in_q_gives_nan_rows(isa):
    """A NaN in one head's q makes that (query, head)'s out and lse NaN, as in the reference, through a split
    plan and its combine; every other row keeps its bits."""
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=16, topk=512, extra_topk=128, sink=True))
    out, lse = ops.sparse_mla_decode(**args)
    args["q"] = args["q"].clone()
    args["q"][1, 0, 3, 7] = math.nan
    got, got_lse = ops.sparse_mla_decode(**args)
    ref, ref_lse = reference_decode(args)
    assert torch.isnan(ref[1, 0, 3]).all() and torch.isnan(ref_lse[1, 3, 0])
    assert torch.isnan(got[1, 0, 3]).all() and torch.isnan(got_lse[1, 3, 0])
    hit = torch.zeros_like(out, dtype=torch.bool)
    hit[1, 0, 3] = True
    assert torch.equal(got[~hit], out[~hit])
    hit_lse = torch.zeros_like(lse, dtype=torch.bool)
    hit_lse[1, 3, 0] = True
    assert torch.equal(got_lse[~hit_lse], lse[~hit_lse])


def test_v32_scales_decode_exactly(isa):
    """V32 rows (fp32 tile scales, not only powers of two): bf16 of e4m3 x scale, rounded once."""
    scales = torch.tensor([2.0**-20, 0.37, 1.0, 3.14159, 64.0, 1e-3, 5e-7, 0.5])
    entries = len(scales)
    cache = torch.zeros(1, entries * V32_BYTES_PER_TOKEN, dtype=torch.uint8)
    for e in range(entries):
        entry = cache[0, e * V32_BYTES_PER_TOKEN : (e + 1) * V32_BYTES_PER_TOKEN]
        entry[:V32_NOPE_DIM] = FINITE_E4M3_CODES[(torch.arange(V32_NOPE_DIM) + 11 * e) % len(FINITE_E4M3_CODES)]
        entry[V32_NOPE_DIM : V32_NOPE_DIM + 16] = scales.roll(e)[:4].view(torch.uint8)
        entry[V32_NOPE_DIM + 16 :] = torch.randn(ROPE_DIM).bfloat16().view(torch.uint8)
    want = quant.v32_read(cache, torch.arange(entries), entries)[:, :D_V].bfloat16()
    assert_rows_equal_where_normal(single_entry_outputs(cache, entries, V32_HEAD_DIM), want)


# ---------------------------------------------------------------------------------------------
# Work splitting and determinism
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", SPLIT_THREADS)
@pytest.mark.parametrize("b", [1, 3])
def test_split_entries_across_threads(isa, restore_threads, threads, b):
    torch.set_num_threads(threads)
    check_decode(decode_inputs(DecodeCase(b=b, s_q=1, h_q=32, topk=700, page=64, extra_topk=128, extra_page=16,
                                          topk_length=True)))


def test_batch_of_whole_requests(isa):
    # Enough requests that a GPU plan keeps each whole (two per partition on 132 SMs) and no combine runs; ragged
    # lengths so that the partitions' costs differ.
    check_decode(decode_inputs(DecodeCase(b=264, s_q=1, h_q=16, topk=128, page=64, extra_topk=64, extra_page=16,
                                          topk_length=True, extra_topk_length=True)))


def test_whole_requests_with_heads_ending_inside_a_warp(isa):
    # As above (CTAs finish several whole requests; on Hopper their rows leave by 16-byte stores whose transposes
    # take every lane of a warp), with 20 heads: the second warp's rows past h_q write nothing.
    check_decode(decode_inputs(DecodeCase(b=300, s_q=1, h_q=20, topk=64, page=64, extra_topk=64, extra_page=16,
                                          topk_length=True)))


@pytest.mark.parametrize("case", [
    # Two head groups (two CTAs per query on the GPU tiers) with several tiles per request: pages only 8-byte
    # aligned, ragged lengths, a second group of 36 heads, and more requests than a plan has partitions.
    DecodeCase(b=24, s_q=2, h_q=128, topk=300, page=61, extra_topk=64, extra_page=2, topk_length=True),
    DecodeCase(b=40, s_q=1, h_q=100, topk=300, page=64, extra_topk=128, extra_page=16, extra_topk_length=True),
    DecodeCase(b=140, s_q=1, h_q=128, topk=128, page=64, extra_topk=64, extra_page=16, topk_length=True,
               extra_topk_length=True),
], ids=str)
def test_two_head_groups(isa, case):
    check_decode(decode_inputs(case))


def test_same_inputs_same_bits(isa):
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=64, topk=300, page=61, extra_topk=64, extra_page=2))
    first = ops.sparse_mla_decode(**args)
    second = ops.sparse_mla_decode(**args)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


# ---------------------------------------------------------------------------------------------
# Op contract
# ---------------------------------------------------------------------------------------------


def schema_args(args: dict) -> tuple:
    return (args["q"], args["kv_cache"], args["indices"], args.get("topk_length"), args.get("attn_sink"),
            args.get("extra_kv_cache"), args.get("extra_indices"), args.get("extra_topk_length"), args["block_size"],
            args.get("extra_block_size", 0), D_V, args["sm_scale"])


@pytest.mark.parametrize("case", DEFAULT_DECODE_CASES[:2], ids=str)
def test_opcheck(case, opcheck):
    opcheck(torch.ops.dsv4.sparse_mla_decode.default, schema_args(decode_inputs(case)))


BAD_INPUTS = [
    ("q", lambda a: a.update(q=a["q"].transpose(2, 3).contiguous().transpose(2, 3)), "contiguous in its last"),
    ("indices", lambda a: a.update(indices=a["indices"][..., 0]), "3 dimensions"),
    ("topk_length", lambda a: a.update(topk_length=a["topk_length"].float()), "dtype"),
    ("extra_topk_length", lambda a: a.update(extra_kv_cache=None, extra_indices=None), "None without extra_indices"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"][:, :100]), "pages hold"),
    ("extra_block_size", lambda a: a.update(extra_block_size=-1), "positive"),
]


@pytest.mark.parametrize("arg,corrupt,message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_inputs_raise_before_running(arg, corrupt, message):
    args = decode_inputs(DecodeCase(b=2, s_q=1, h_q=4, topk=8, page=4, extra_topk=4, extra_page=4, topk_length=True,
                                    extra_topk_length=True))
    corrupt(args)
    with pytest.raises(RuntimeError, match=f"dsv4::sparse_mla_decode: argument '{arg}' .*{message}"):
        ops.sparse_mla_decode(**args)


@pytest.mark.parametrize("b,s_q", [(1, 0), (0, 1)])
def test_schedule_of_an_empty_step(b, s_q):
    """No query rows (or no requests) plan without dividing by zero."""
    q = torch.randn(b, s_q, 16, MODEL1_HEAD_DIM).bfloat16()
    meta, splits = ops.sparse_mla_decode_schedule(q, torch.zeros(b, s_q, 64, dtype=torch.int32))
    assert meta.shape[1] == 8 and splits.shape == (b + 1,)
