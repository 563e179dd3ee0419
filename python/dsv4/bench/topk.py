"""Benchmark cases of topk_transform through vLLM's ``topk_transform_512_cpu`` (k = 512, slot ids and raw indices)."""

from __future__ import annotations

import torch

from ..compat.vllm_cpu import VLLM_TOPK
from ..reference import topk as ref_topk
from . import Case

PAGE_SIZE = 64  # indexer K cache block size
SHAPES = ((4, 16384), (1, 32768), (32, 4096))  # (batch, columns): prefill-like, one long decode row, a decode batch
QUICK_DIVISOR = 4  # quick runs shorten every row by this factor


def topk_case(batch: int, columns: int) -> Case:
    scores = torch.randn(batch, columns)
    lengths = torch.full((batch,), columns, dtype=torch.int32)
    pages = -(-columns // PAGE_SIZE)
    page_table = torch.randperm(batch * pages, dtype=torch.int32).view(batch, pages)
    out_slots = torch.empty(batch, VLLM_TOPK, dtype=torch.int32)
    out_raw = torch.empty_like(out_slots)
    return Case(
        "topk_transform",
        f"B={batch} S={columns} k={VLLM_TOPK}",
        scores.nbytes,
        lambda m: m.topk_transform_512_cpu(scores, lengths, page_table, out_slots, PAGE_SIZE, out_raw),
        lambda: ref_topk.topk_transform(scores, lengths, VLLM_TOPK, page_table=page_table, page_size=PAGE_SIZE),
    )


def cases(quick: bool = False) -> list[Case]:
    divisor = QUICK_DIVISOR if quick else 1
    return [topk_case(batch, columns // divisor) for batch, columns in SHAPES]
