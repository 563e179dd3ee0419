"""Native CPU kernels of fp8_paged_mqa_logits and fp8_mqa_logits against the reference, on every tier."""

from __future__ import annotations

import pytest
import torch

from dsv4 import ops
from dsv4.reference import indexer
from helpers.indexer_cases import (
    HEAD_DIM,
    assert_logits_match,
    indexer_cache,
    paged_case,
    random_fp8,
    row_valid_mask,
)


def assert_both_cleaning_modes(args) -> None:
    """The kernel against the reference on a paged_case, with and without cleaning (all of it, or the valid part)."""
    next_n = args[0].shape[1]
    valid = row_valid_mask(args[3], next_n, args[6])
    want = indexer.fp8_paged_mqa_logits(*args)
    for clean in (True, False):
        got = ops.fp8_paged_mqa_logits(*args, clean_logits=clean)
        assert_logits_match(got, want, torch.ones_like(valid) if clean else valid)


@pytest.mark.parametrize("heads", [1, 16, 64, 128])
@pytest.mark.parametrize("block_size", [1, 2, 61, 64, 256])
def test_paged_logits_heads_and_pages(isa, heads, block_size):
    args = paged_case(2, 1, heads, block_size, [0, 300], lens_2d=False, pad_bytes=40)
    got = ops.fp8_paged_mqa_logits(*args, clean_logits=True)
    assert_logits_match(got, indexer.fp8_paged_mqa_logits(*args), torch.ones_like(got, dtype=torch.bool))


@pytest.mark.parametrize("next_n,lens_2d", [(1, False), (2, False), (2, True)])
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_paged_logits_mtp_clean_and_index_dtypes(isa, next_n, lens_2d, clean, index_dtype):
    lens = [1, 511, 512, 513, 1500]
    args = paged_case(len(lens), next_n, 64, 64, lens, lens_2d, index_dtype=index_dtype, holes=True)
    got = ops.fp8_paged_mqa_logits(*args, clean_logits=clean)
    valid = row_valid_mask(args[3], next_n, args[6])
    assert_logits_match(got, indexer.fp8_paged_mqa_logits(*args), torch.ones_like(valid) if clean else valid)


@pytest.mark.parametrize("block_size", [64, 128])
@pytest.mark.parametrize("heads,next_n", [(16, 1), (64, 1), (64, 2), (128, 1)])
def test_paged_logits_whole_tile_pages(isa, block_size, heads, next_n):
    """Pages of whole 64-entry tiles on 16-byte boundaries (the Hopper tier copies those in bulk), long enough rows
    for several tiles per CTA, holes, both cleaning modes."""
    lens = [1, 64, 700, 3000]
    assert_both_cleaning_modes(paged_case(len(lens), next_n, heads, block_size, lens, lens_2d=False, holes=True))


def test_paged_logits_long_chunks(isa):
    """64 rows of ~4K keys: on an H200 the Hopper tier's CTAs then take chunks of nine tiles, so its bulk path
    refills its four ring slots (a slot is refilled while the next tile is scored) and turns the barrier phases;
    rows end at different tiles, and the pages come from a small shared pool (with holes) to keep the cache cheap
    to build. Both cleaning modes."""
    lens = [4096 - 37 * i for i in range(64)]
    assert_both_cleaning_modes(paged_case(len(lens), 1, 64, 64, lens, lens_2d=False, holes=True, pool=97))


def test_paged_logits_long_context(isa):
    args = paged_case(1, 1, 64, 64, [16384], lens_2d=False)
    got = ops.fp8_paged_mqa_logits(*args, clean_logits=True)
    assert_logits_match(got, indexer.fp8_paged_mqa_logits(*args), torch.ones_like(got, dtype=torch.bool))


def test_paged_logits_64k_context():
    args = paged_case(1, 1, 64, 64, [65536], lens_2d=False)
    got = ops.fp8_paged_mqa_logits(*args, clean_logits=True)
    assert_logits_match(got, indexer.fp8_paged_mqa_logits(*args), torch.ones_like(got, dtype=torch.bool))


def test_paged_logits_empty_batch_and_zero_width(isa):
    args = paged_case(1, 1, 8, 64, [5], lens_2d=False)
    q, cache, weights, ctx, table, bs, _ = args
    assert ops.fp8_paged_mqa_logits(q, cache, weights, ctx, table, bs, 0).shape == (1, 0)
    empty = ops.fp8_paged_mqa_logits(q[:0], cache, weights[:0], ctx[:0], table[:0], bs, 7)
    assert empty.shape == (0, 7)


def ragged_case(rows, num_keys, heads, dim=HEAD_DIM, k_row_stride=None):
    q = random_fp8(rows, heads, dim)
    k_full = random_fp8(num_keys, k_row_stride or dim)
    k = k_full[:, :dim]
    k_scale = torch.exp2(torch.randint(-10, 3, (num_keys,)).float())
    weights = torch.randn(rows, heads)
    ks = torch.randint(-3, num_keys, (rows,))
    ke = ks + torch.randint(-2, num_keys + 5, (rows,))
    ks[0], ke[0] = 0, num_keys  # one full row
    return q, k, k_scale, weights, ks.int(), ke.int()


@pytest.mark.parametrize("heads,dim", [(1, 128), (64, 128), (128, 128), (32, 64), (64, 32)])
@pytest.mark.parametrize("clean", [True, False])
def test_ragged_logits(isa, heads, dim, clean):
    args = ragged_case(9, 700, heads, dim, k_row_stride=dim + 32)
    got = ops.fp8_mqa_logits(*args, clean_logits=clean)
    cols = torch.arange(700)
    valid = (cols >= args[4].long()[:, None]) & (cols < args[5].long()[:, None])
    assert_logits_match(got, indexer.fp8_mqa_logits(*args), torch.ones_like(valid) if clean else valid)


def test_ragged_logits_empty(isa):
    q, k, k_scale, weights, ks, ke = ragged_case(3, 5, 4)
    assert ops.fp8_mqa_logits(q[:0], k, k_scale, weights[:0], ks[:0], ke[:0]).shape == (0, 5)
    got = ops.fp8_mqa_logits(q, k[:0], k_scale[:0], weights, ks, ke)
    assert got.shape == (3, 0)


def test_tiers_agree_on_ties_of_exact_sums():
    """Keys built so every head dot is exact in fp32: all tiers must then give identical logits."""
    q = torch.ones(2, 1, 4, HEAD_DIM).to(torch.float8_e4m3fn)
    cache = indexer_cache(4, 64, 0)
    args = (q, cache, torch.ones(2, 4), torch.tensor([100, 64]), torch.tensor([[0, 1], [2, 3]]), 64, 128)
    results = []
    for isa in torch.ops.dsv4.supported_cpu_isas().split(","):
        torch.ops.dsv4._set_cpu_isa(isa)
        results.append(ops.fp8_paged_mqa_logits(*args))
    torch.ops.dsv4._set_cpu_isa("auto")
    for r in results[1:]:
        assert torch.equal(r, results[0])


BAD = [
    ("q", lambda a: a.update(q=a["q"].float()), "argument 'q' must have dtype"),
    ("q heads", lambda a: a.update(q=random_fp8(1, 1, 129, HEAD_DIM), weights=torch.randn(1, 129)), "1 to 128 heads"),
    ("q dim", lambda a: a.update(q=random_fp8(1, 1, 4, 64)), "argument 'q' must have size 128"),
    ("weights", lambda a: a.update(weights=a["weights"][:, :2]), "argument 'weights' must have size 4"),
    ("context_lens", lambda a: a.update(context_lens=a["context_lens"].float()), "argument 'context_lens' must have"),
    ("block_table", lambda a: a.update(block_table=a["block_table"][0]), "argument 'block_table' must have 2"),
    ("kv_cache", lambda a: a.update(kv_cache=a["kv_cache"][:, :100]), "argument 'kv_cache' pages hold"),
    ("max_context_len", lambda a: a.update(max_context_len=-1), "argument 'max_context_len' must be >= 0"),
    ("max_context_len 2^40", lambda a: a.update(max_context_len=2**40),
     "argument 'max_context_len' asks for an fp32 output of \\[1, 1099511627776\\] \\(4096 GiB\\)"),
    ("max_context_len 2^62", lambda a: a.update(max_context_len=2**62),
     "argument 'max_context_len' asks for an fp32 output .* more bytes than a tensor can hold"),
]


@pytest.mark.parametrize("name,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_paged_logits_bad_inputs(name, mutate, message):
    q, cache, weights, ctx, table, bs, max_len = paged_case(1, 1, 4, 64, [10], lens_2d=False)
    args = dict(q=q, kv_cache=cache, weights=weights, context_lens=ctx, block_table=table, block_size=bs,
                max_context_len=max_len, clean_logits=True)
    mutate(args)
    with pytest.raises(RuntimeError, match=f"dsv4::fp8_paged_mqa_logits: .*{message}"):
        torch.ops.dsv4.fp8_paged_mqa_logits(**args)


def test_ragged_logits_bad_inputs():
    q, k, k_scale, weights, ks, ke = ragged_case(2, 8, 4)
    with pytest.raises(RuntimeError, match="dsv4::fp8_mqa_logits: argument 'q' head dim must be a multiple of 32"):
        ops.fp8_mqa_logits(random_fp8(2, 4, 48), k[:, :48], k_scale, weights, ks, ke)
    with pytest.raises(RuntimeError, match="dsv4::fp8_mqa_logits: argument 'k_scale' must have size 8"):
        ops.fp8_mqa_logits(q, k, k_scale[:3], weights, ks, ke)
    with pytest.raises(RuntimeError, match="dsv4::fp8_mqa_logits: argument 'ks' must have size 2"):
        ops.fp8_mqa_logits(q, k, k_scale, weights, ks[:1], ke)
