"""Benchmark cases of the lightning indexer (DSv4-Flash: 64 heads x 128 dims, compressed ratio 4).

Paged decode logits at 4K-128K raw tokens of context (1K-32K compressed entries) for batch 1-32,
ragged prefill logits for 4096 query rows, and the top-k cases of :mod:`.topk` when present.
"""

from __future__ import annotations

import importlib.util

import torch

from .. import cache, ops
from ..reference import indexer as ref_indexer
from . import Case

HEADS, DIM, BLOCK, RATIO = 64, 128, 64, 4
REFERENCE_MAX_KEYS = 1 << 17  # rows x entries above which the reference is too slow to time


def _fp8(*shape: int) -> torch.Tensor:
    return (torch.randn(shape) * 8).to(torch.float8_e4m3fn)


def paged_case(batch: int, raw_context: int) -> Case:
    entries = raw_context // RATIO
    pages = (entries + BLOCK - 1) // BLOCK
    kv = cache.allocate_indexer_k_cache(batch * pages, BLOCK)
    kv.view(-1)[:] = torch.randint(0, 120, (kv.numel(),), dtype=torch.uint8)  # finite codes, positive scales
    scales = kv[:, BLOCK * DIM : BLOCK * (DIM + 4)].view(torch.float32)
    scales.copy_(torch.exp2(torch.randint(-8, 0, scales.shape).float()))
    q = _fp8(batch, HEADS, DIM)
    weights = torch.randn(batch, HEADS)
    lens = torch.full((batch,), entries, dtype=torch.int32)
    table = torch.randperm(batch * pages, dtype=torch.int32).view(batch, pages)
    return Case(
        "fp8_paged_mqa_logits", f"B={batch} ctx={raw_context // 1024}K",
        bytes_moved=batch * entries * (DIM + 4 + 4), flops=2 * batch * entries * HEADS * DIM,
        run=lambda m: m.fp8_paged_mqa_logits_cpu(q, kv, weights, lens, table, BLOCK, entries),
        reference=(lambda: ref_indexer.fp8_paged_mqa_logits(q.unsqueeze(1), kv, weights, lens, table, BLOCK, entries))
        if batch * entries <= REFERENCE_MAX_KEYS else None,
    )


def ragged_case(rows: int, keys: int) -> Case:
    q = _fp8(rows, HEADS, DIM)
    k = _fp8(keys, DIM)
    k_scale = torch.rand(keys) + 0.5
    weights = torch.randn(rows, HEADS)
    ks = torch.zeros(rows, dtype=torch.int32)
    ke = ((torch.arange(rows) + 1) * keys // rows).int()  # causal: row i sees a growing prefix
    total = int((ke - ks).sum())
    return Case(
        "fp8_mqa_logits", f"M={rows} N={keys} causal",
        bytes_moved=rows * keys * 4 + keys * (DIM + 4), flops=2 * total * HEADS * DIM,
        run=lambda m: ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits=False),
        reference=None, on_peer=False,
    )


def cases(quick: bool = False) -> list[Case]:
    shapes = [(1, 4096), (4, 65536)] if quick else [(1, 4096), (1, 131072), (4, 65536), (32, 16384)]
    out = [paged_case(batch, ctx) for batch, ctx in shapes]
    out.append(ragged_case(512 if quick else 4096, 1024 if quick else 4096))
    if importlib.util.find_spec(f"{__package__}.topk") is not None:
        out += importlib.import_module(f"{__package__}.topk").topk_cases(quick)
    return out
