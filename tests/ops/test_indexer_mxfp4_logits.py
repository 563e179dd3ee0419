"""MXFP4 indexer queries and keys (DeepSeek-V4.1): indexer_q_rope_quant's mxfp4 query, and the paged, ragged and
fused top-k logits over fp8 or mxfp4 keys with fp8 or mxfp4 queries, against the reference on every tier."""

from __future__ import annotations

import pytest
import torch

from conftest import MAX_POSITION, assert_rejects, random_positions, replaced, rope_table
from dsv4 import ops
from dsv4.constants import INDEXER_HEAD_DIM
from dsv4.reference import indexer, quant
from helpers.indexer_cases import (
    assert_logits_match,
    indexer_cache,
    paged_format_case,
    random_query,
    row_valid_mask,
)

FORMAT_PAIRS = [(k, q) for k in ("fp8", "mxfp4") for q in ("fp8", "mxfp4")]  # (key format, query format)
HEADS = [32, 64, 7]


# ---- queries ----


@pytest.mark.parametrize("heads", [1, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_q_rope_quant_mxfp4_matches_reference(isa, heads, dtype):
    tokens = 19
    magnitude = torch.exp2(torch.randint(-12, 12, (tokens, heads, 1)))
    q = (torch.randn(tokens, heads, INDEXER_HEAD_DIM) * magnitude).to(dtype)
    positions = random_positions(tokens)
    cos_sin = rope_table(MAX_POSITION)
    weights = torch.randn(tokens, heads)
    codes, scales, weights_out = ops.indexer_q_rope_quant(q, positions, cos_sin, weights, 0.3, 0.7,
                                                          query_format="mxfp4")
    want_codes, want_scales, want_weights = indexer.indexer_q_rope_quant_mxfp4(q, positions, cos_sin, weights, 0.3,
                                                                               0.7)
    assert codes.dtype == torch.uint8 and codes.shape == (tokens, heads, 64) and scales.shape == (tokens, heads, 4)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales)
    assert torch.equal(weights_out, want_weights)


def test_q_rope_quant_fp8_keeps_its_two_results():
    q = torch.randn(3, 4, INDEXER_HEAD_DIM)
    out = ops.indexer_q_rope_quant(q, torch.arange(3), rope_table(MAX_POSITION), torch.randn(3, 4))
    assert len(out) == 2 and out[0].dtype == torch.float8_e4m3fn
    again = ops.indexer_q_rope_quant(q, torch.arange(3), rope_table(MAX_POSITION), torch.randn(3, 4),
                                     query_format="fp8")
    assert len(again) == 2 and torch.equal(again[0].view(torch.uint8), out[0].view(torch.uint8))


def q_quant_args(tokens=4, heads=8):
    return dict(q=torch.randn(tokens, heads, INDEXER_HEAD_DIM), positions=torch.arange(tokens),
                cos_sin_cache=rope_table(MAX_POSITION), weights=torch.randn(tokens, heads), softmax_scale=1.0,
                head_scale=1.0, q_fp8=torch.zeros(tokens, heads, 64, dtype=torch.uint8),
                weights_out=torch.zeros(tokens, heads), query_format="mxfp4",
                q_scale_out=torch.zeros(tokens, heads, 4, dtype=torch.uint8))


@pytest.mark.parametrize("corrupt,message", [
    (replaced(query_format="nvfp4"), "argument 'query_format' must be 'fp8'"),
    (replaced(q_scale_out=None), "argument 'q_scale_out' must be a uint8"),
    (replaced(q_scale_out=torch.zeros(4, 8, 8, dtype=torch.uint8)), "argument 'q_scale_out' must have shape"),
    (replaced(q_fp8=torch.zeros(4, 8, 128, dtype=torch.uint8)), "argument 'q_fp8' \\(the mxfp4 codes\\)"),
    (replaced(query_format="fp8", q_fp8=torch.zeros(4, 8, 128, dtype=torch.uint8)),
     "argument 'q_scale_out' must be None"),
])
def test_q_rope_quant_format_rejects(corrupt, message):
    args = q_quant_args()
    corrupt(args)
    assert_rejects(torch.ops.dsv4.indexer_q_rope_quant.format, args, message, unchanged=("weights_out",))


def test_q_rope_quant_format_opcheck(opcheck, request):
    opcheck(torch.ops.dsv4.indexer_q_rope_quant.format, tuple(q_quant_args().values()))


# ---- paged logits ----


@pytest.mark.parametrize("key_format,query_format", FORMAT_PAIRS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [1, 64])
def test_paged_logits_formats(isa, key_format, query_format, heads, block_size):
    lens = [0, 1, 300, 700]
    args, q_scale = paged_format_case(len(lens), 1, heads, block_size, lens, key_format, query_format)
    want = indexer.fp8_paged_mqa_logits(*args, q_scale=q_scale, key_format=key_format)
    valid = row_valid_mask(args[3], 1, args[6])
    for clean in (True, False):
        got = ops.fp8_paged_mqa_logits(*args, clean_logits=clean, q_scale=q_scale, key_format=key_format)
        assert_logits_match(got, want, torch.ones_like(valid) if clean else valid)


@pytest.mark.parametrize("key_format,query_format", FORMAT_PAIRS)
def test_paged_logits_formats_mtp(isa, key_format, query_format):
    lens = [5, 520, 1100]
    args, q_scale = paged_format_case(len(lens), 2, 64, 64, lens, key_format, query_format, lens_2d=True,
                                      index_dtype=torch.int64)
    want = indexer.fp8_paged_mqa_logits(*args, q_scale=q_scale, key_format=key_format)
    got = ops.fp8_paged_mqa_logits(*args, q_scale=q_scale, key_format=key_format)
    assert_logits_match(got, want, torch.ones_like(got, dtype=torch.bool))


def test_paged_logits_fp8_format_is_the_old_op():
    args, _ = paged_format_case(2, 1, 16, 64, [100, 300], "fp8", "fp8")
    old = torch.ops.dsv4.fp8_paged_mqa_logits(*args, True, None)
    new = torch.ops.dsv4.fp8_paged_mqa_logits.format(*args, True, None, None, "fp8")
    assert torch.equal(old, new)


def test_mxfp4_logits_flush_only_below_the_smallest_normal(isa):
    """Keys whose blocks carry scale byte 1 (values down to 2^-127): the bf16 dot-product tiers treat values below
    2^-126 as zero; every tier stays within the logits tolerance of the exact reference."""
    lens = [200]
    args, q_scale = paged_format_case(1, 1, 32, 64, lens, "mxfp4", "mxfp4", holes=False)
    pages = quant.cache_pages(args[1])
    pages[:, 64 * 64 : 68 * 64 : 4] = 1  # the first block of every key at the smallest scale
    want = indexer.fp8_paged_mqa_logits(*args, q_scale=q_scale, key_format="mxfp4")
    got = ops.fp8_paged_mqa_logits(*args, q_scale=q_scale, key_format="mxfp4")
    assert_logits_match(got, want, torch.ones_like(got, dtype=torch.bool))


def paged_format_args(key_format="mxfp4", query_format="mxfp4"):
    args, q_scale = paged_format_case(2, 1, 8, 16, [10, 30], key_format, query_format)
    names = ("q", "kv_cache", "weights", "context_lens", "block_table", "block_size", "max_context_len")
    return dict(zip(names, args, strict=True), clean_logits=True, schedule_meta=None, q_scale=q_scale,
                key_format=key_format)


@pytest.mark.parametrize("corrupt,message", [
    (replaced(key_format="fp4"), "argument 'key_format' must be 'fp8'"),
    (replaced(key_format="fp8"), "argument 'kv_cache' pages hold 1152 bytes, fewer than .* 132 bytes"),
    (replaced(q_scale=torch.zeros(2, 1, 8, 2, dtype=torch.uint8)), "argument 'q_scale' must have size 4"),
    (replaced(q_scale=None), "argument 'q' must have dtype Float8_e4m3fn"),
    (replaced(q=torch.zeros(2, 1, 8, 128, dtype=torch.uint8)), "argument 'q' must have size 64 in dimension 3"),
])
def test_paged_logits_format_rejects(corrupt, message):
    args = paged_format_args()
    corrupt(args)
    assert_rejects(torch.ops.dsv4.fp8_paged_mqa_logits.format, args, message)


def test_paged_logits_format_opcheck(opcheck, request):
    opcheck(torch.ops.dsv4.fp8_paged_mqa_logits.format, tuple(paged_format_args().values()))


# ---- ragged logits ----


def ragged_case(rows, heads, num_keys, key_format, query_format, dim=INDEXER_HEAD_DIM):
    q, q_scale = random_query(query_format, rows, heads, dim)
    keys = torch.randn(num_keys, dim) * torch.rand(num_keys, 1) * 4
    if key_format == "mxfp4":
        k, k_scale = quant.mxfp4_pack(keys)
    else:
        k, k_scale = quant.indexer_k_pack(keys) if dim == INDEXER_HEAD_DIM else (keys.to(torch.float8_e4m3fn),
                                                                                 torch.rand(num_keys) + 0.5)
        k = k.view(torch.float8_e4m3fn)
    ks = torch.randint(0, num_keys // 2 + 1, (rows,), dtype=torch.int32)
    ke = torch.minimum(ks + torch.randint(0, num_keys, (rows,), dtype=torch.int32), torch.tensor(num_keys))
    ke[0] = ks[0]  # an empty row
    return q, k, k_scale, torch.randn(rows, heads), ks, ke, q_scale


@pytest.mark.parametrize("key_format,query_format", FORMAT_PAIRS)
@pytest.mark.parametrize("heads", HEADS)
def test_ragged_logits_formats(isa, key_format, query_format, heads):
    q, k, k_scale, weights, ks, ke, q_scale = ragged_case(37, heads, 700, key_format, query_format)
    want = indexer.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, q_scale=q_scale, key_format=key_format)
    cols = torch.arange(k.shape[0])
    valid = (cols >= ks.long()[:, None]) & (cols < ke.long()[:, None])
    for clean in (True, False):
        got = ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean, q_scale=q_scale, key_format=key_format)
        assert_logits_match(got, want, torch.ones_like(valid) if clean else valid)


@pytest.mark.parametrize("key_format,query_format", FORMAT_PAIRS)
def test_ragged_logits_other_head_dim_and_strides(isa, key_format, query_format):
    q, k, k_scale, weights, ks, ke, q_scale = ragged_case(9, 5, 90, key_format, query_format, dim=64)
    # row-strided k and k_scale views (only the last dims are contiguous)
    k = torch.cat([k.view(torch.uint8), torch.zeros(k.shape[0], 16, dtype=torch.uint8)], 1)[:, : k.shape[1]].view(
        k.dtype)
    if key_format == "mxfp4":
        k_scale = torch.cat([k_scale, torch.zeros(k.shape[0], 3, dtype=torch.uint8)], 1)[:, : k_scale.shape[1]]
    want = indexer.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, q_scale=q_scale, key_format=key_format)
    got = ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, q_scale=q_scale, key_format=key_format)
    assert_logits_match(got, want, torch.ones_like(got, dtype=torch.bool))


def ragged_args():
    q, k, k_scale, weights, ks, ke, q_scale = ragged_case(5, 4, 40, "mxfp4", "mxfp4")
    return dict(q=q, k=k, k_scale=k_scale, weights=weights, ks=ks, ke=ke, clean_logits=True, q_scale=q_scale,
                key_format="mxfp4")


@pytest.mark.parametrize("corrupt,message", [
    (replaced(k_scale=torch.zeros(40)), "argument 'k_scale' must have dtype Byte"),
    (replaced(k=torch.zeros(40, 128, dtype=torch.uint8)), "argument 'k' must have size 64"),
    (replaced(key_format="fp8"), "argument 'k' must have dtype Float8_e4m3fn"),
    (replaced(q_scale=torch.zeros(5, 4, 4)), "argument 'q_scale' must have dtype Byte"),
])
def test_ragged_logits_format_rejects(corrupt, message):
    args = ragged_args()
    corrupt(args)
    assert_rejects(torch.ops.dsv4.fp8_mqa_logits.format, args, message)


def test_ragged_logits_format_opcheck(opcheck, request):
    opcheck(torch.ops.dsv4.fp8_mqa_logits.format, tuple(ragged_args().values()))


# ---- fused top-k ----


def prefill_format_case(requests, heads, key_format, query_format, block_size=64):
    pages = [(prefix + q_len + block_size - 1) // block_size for prefix, q_len in requests]
    num_blocks = sum(pages) + 2
    cache = indexer_cache(num_blocks, block_size, 24, key_format)
    table = torch.full((len(requests), max(pages)), -1, dtype=torch.int32)
    free = torch.randperm(num_blocks).tolist()
    for i, n in enumerate(pages):
        table[i, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
    table[0, 1] = -1  # a hole
    lengths = torch.cat([prefix + 1 + torch.arange(q_len) for prefix, q_len in requests]).to(torch.int32)
    rows = torch.cat([torch.full((q_len,), i) for i, (_, q_len) in enumerate(requests)]).to(torch.int32)
    q, q_scale = random_query(query_format, len(lengths), heads, INDEXER_HEAD_DIM)
    return (q, cache, torch.randn(len(lengths), heads), lengths, table, rows, block_size), q_scale


@pytest.mark.parametrize("key_format,query_format", FORMAT_PAIRS)
@pytest.mark.parametrize("heads", [32, 7])
def test_fused_topk_formats_equal_unfused(isa, key_format, query_format, heads):
    args, q_scale = prefill_format_case([(900, 6), (10, 3), (560, 5)], heads, key_format, query_format)
    q, cache, weights, lengths, table, rows, block_size = args
    got = ops.fp8_paged_mqa_topk(*args, k=512, q_scale=q_scale, key_format=key_format)
    logits = ops.fp8_paged_mqa_logits(q.unsqueeze(1), cache, weights, lengths, table[rows.long()], block_size,
                                      int(lengths.max()), q_scale=None if q_scale is None else q_scale.unsqueeze(1),
                                      key_format=key_format)
    assert torch.equal(got, ops.topk_transform(logits, lengths, 512)[0])


def test_fused_topk_format_opcheck(opcheck, request):
    args, q_scale = prefill_format_case([(600, 2)], 8, "mxfp4", "mxfp4")
    out = torch.empty(len(args[3]), 512, dtype=torch.int32)
    opcheck(torch.ops.dsv4.fp8_paged_mqa_topk.format, (*args, out, q_scale, "mxfp4"))
