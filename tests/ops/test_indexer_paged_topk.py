"""The fused prefill indexer equals topk_transform(fp8_paged_mqa_logits(...)) exactly, on every tier."""

import pytest
import torch

from conftest import assert_rejects
from dsv4 import ops
from dsv4.reference import indexer
from helpers.indexer_cases import indexer_cache, random_fp8

HEAD_DIM, BLOCK = 128, 64


def prefill_case(requests, heads=16, block_size=BLOCK, index_dtype=torch.int32, holes=False, pad_bytes=24):
    """Causal prefill rows: request i contributes q_len rows whose lengths grow from prefix + 1."""
    pages = [(prefix + q_len + block_size - 1) // block_size for prefix, q_len in requests]
    num_blocks = sum(pages) + 2
    cache = indexer_cache(num_blocks, block_size, pad_bytes)
    table = torch.full((len(requests), max(pages)), -1, dtype=index_dtype)
    free = torch.randperm(num_blocks).tolist()
    for i, n in enumerate(pages):
        table[i, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=index_dtype)
    if holes:
        table[0, 1] = -1
    lengths = torch.cat([prefix + 1 + torch.arange(q_len) for prefix, q_len in requests]).to(index_dtype)
    rows = torch.cat([torch.full((q_len,), i) for i, (_, q_len) in enumerate(requests)]).to(index_dtype)
    q = random_fp8(len(lengths), heads, HEAD_DIM)
    weights = torch.randn(len(lengths), heads)
    return q, cache, weights, lengths, table, rows, block_size


def unfused(q, cache, weights, lengths, table, rows, block_size, k):
    width = int(lengths.max())
    logits = ops.fp8_paged_mqa_logits(q.unsqueeze(1), cache, weights, lengths, table[rows.long()], block_size, width)
    return ops.topk_transform(logits, lengths, k)[0]


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("requests", [[(0, 40)], [(900, 21), (10, 5), (2000, 17)], [(505, 12)]])
def test_fused_equals_unfused(isa, k, requests):
    args = prefill_case(requests)
    got = ops.fp8_paged_mqa_topk(*args, k=k)
    assert torch.equal(got, unfused(*args, k))


@pytest.mark.parametrize("block_size,pad_bytes", [(1, 24), (61, 24), (256, 24), (64, 0), (128, 0)])
def test_fused_page_sizes_holes_and_int64(isa, block_size, pad_bytes):
    args = prefill_case([(1500, 9), (700, 8)], heads=64, block_size=block_size, index_dtype=torch.int64, holes=True,
                        pad_bytes=pad_bytes)
    assert torch.equal(ops.fp8_paged_mqa_topk(*args, k=512), unfused(*args, 512))


def test_fused_matches_reference_selection_where_scores_are_separated():
    args = prefill_case([(700, 3)], heads=1)
    got = ops.fp8_paged_mqa_topk(*args, k=512)
    want = indexer.fp8_paged_mqa_topk(*args, 512)
    assert torch.equal(got.sort(dim=1).values, want.sort(dim=1).values)


def test_short_rows_and_empty_batch():
    q, cache, weights, lengths, table, rows, bs = prefill_case([(0, 4)])
    lengths = torch.tensor([0, 1, 512, -3], dtype=torch.int32)
    got = ops.fp8_paged_mqa_topk(q, cache, weights, lengths, table, rows, bs)
    assert got[0].eq(-1).all() and got[1, 0] == 0 and got[1, 1:].eq(-1).all()
    assert torch.equal(got[2], torch.arange(512, dtype=torch.int32)) and got[3].eq(-1).all()
    assert ops.fp8_paged_mqa_topk(q[:0], cache, weights[:0], lengths[:0], table, rows[:0], bs).shape == (0, 512)


def test_bad_inputs():
    q, cache, weights, lengths, table, rows, bs = prefill_case([(0, 3)])
    args = dict(q=q, kv_cache=cache, weights=weights, lengths=lengths, block_table=table, row_requests=rows,
                block_size=bs, topk_indices=torch.empty(3, 512, dtype=torch.int32))
    op = torch.ops.dsv4.fp8_paged_mqa_topk
    assert_rejects(op, {**args, "row_requests": rows + 5}, "argument 'row_requests' entry 0 is 5")
    assert_rejects(op, {**args, "topk_indices": torch.empty(3, 100, dtype=torch.int32)}, "512, 1024 or 2048 columns")
    assert_rejects(op, {**args, "lengths": lengths[:2]}, "argument 'lengths' must have size 3")
    beyond = lengths.clone()
    beyond[1] = max(table.shape[1] * bs, 512) + 1  # scored (> k) and past what the table addresses
    assert_rejects(op, {**args, "lengths": beyond}, "argument 'lengths' entry 1 is .* block_table can address")
    assert_rejects(op, {**args, "q": q.float()}, "argument 'q' must have dtype")
