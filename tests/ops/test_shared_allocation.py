"""Caches that are views of one shared allocation, as engines allocate them: the overlap checks accept views whose
bytes interleave page by page without touching, and still reject views that share a byte."""

from __future__ import annotations

import pytest
import torch

from dsv4 import cache, ops

BLOCK = 4
PAGE = cache.kv_page_bytes(BLOCK)  # the cache view's page
ROW = 512 * 2  # one bf16 kv row


def shared(kv_offset: int):
    """A [blocks, PAGE + ROW + 64] allocation: the cache at byte 0 of each page, kv rows at kv_offset."""
    stride = PAGE + ROW + 64
    pool = torch.zeros(8, stride, dtype=torch.uint8)
    kv_cache = pool[:, :PAGE]
    kv_bytes = pool[:, kv_offset : kv_offset + ROW]
    kv_bytes.view(torch.bfloat16).copy_(torch.randn(8, 512, dtype=torch.bfloat16))
    return kv_cache, kv_bytes.view(torch.bfloat16)


def test_interleaved_views_are_accepted():
    kv_cache, kv = shared(PAGE)  # kv rows right after each cache page: disjoint bytes, overlapping spans
    slots = torch.tensor([0, 5, 9, -1, 14, 2, 30, 21])
    ops.quantize_kv_insert(kv, slots, kv_cache, BLOCK)
    got = ops.dequantize_kv_gather(kv_cache, slots[None], BLOCK)[0]
    want = cache.dequantize_kv(cache.quantize_kv(kv.float().bfloat16()))
    valid = slots >= 0
    assert torch.equal(got[valid], want[valid])


@pytest.mark.parametrize("offset", [PAGE - 2, 0])
def test_views_sharing_bytes_are_rejected(offset):
    kv_cache, kv = shared(offset)
    with pytest.raises(RuntimeError, match="argument 'kv_cache' overlaps argument 'kv'"):
        ops.quantize_kv_insert(kv, torch.arange(8), kv_cache, BLOCK)
