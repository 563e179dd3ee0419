"""Attention prefill chunk plan: groups of consecutive prefill requests whose bf16 gather workspace fits.

A prefill request gathers its ``L // R`` compressed entries (none for sliding-window-only layers)
and its last ``gather_len = q_len + min(prefix, W - 1)`` raw tokens into workspace rows; a chunk of
``count`` requests needs ``count * (N + max gather_len)`` rows with ``N`` its largest compressed
count. The budget is the area of ``chunk_size`` requests at their largest possible sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PREFILL_CHUNK_SIZE = 4  # requests per chunk at the largest sizes


@dataclass(frozen=True)
class AttentionPrefillChunk:
    """Prefill requests ``[start, end)`` (indices among the step's prefill requests) and their workspace:
    ``num_compressed`` (N) rows of compressed entries, then the window tokens, ``workspace_rows`` (M) per request."""

    start: int
    end: int
    num_compressed: int
    workspace_rows: int


def plan_attention_prefill_chunks(
    prefill_seq_lens_cpu: torch.Tensor,
    prefill_gather_lens_cpu: torch.Tensor,
    compress_ratio: int,
    max_model_len: int,
    window: int,
    max_num_batched_tokens: int,
    chunk_size: int = PREFILL_CHUNK_SIZE,
) -> list[AttentionPrefillChunk]:
    """Greedy chunks: a request joins the current chunk while ``count * (N + G) <= budget`` still holds
    (N, G the chunk's largest compressed count and gather length); a request over budget alone forms
    its own chunk."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    most_compressed = math.ceil(max_model_len / compress_ratio) if compress_ratio > 1 else 0
    budget = chunk_size * (most_compressed + window + max_num_batched_tokens)
    compressed = (prefill_seq_lens_cpu.long() // compress_ratio if compress_ratio > 1
                  else torch.zeros_like(prefill_seq_lens_cpu.long())).tolist()
    gathers = prefill_gather_lens_cpu.long().tolist()
    chunks: list[AttentionPrefillChunk] = []
    start, top_n, top_g = 0, 0, 0
    for i, (n, g) in enumerate(zip(compressed, gathers, strict=True)):
        grown_n, grown_g = max(top_n, n), max(top_g, g)
        if i > start and (i - start + 1) * (grown_n + grown_g) > budget:
            chunks.append(AttentionPrefillChunk(start, i, top_n, top_n + top_g))
            start, grown_n, grown_g = i, n, g
        top_n, top_g = grown_n, grown_g
    if start < len(compressed):
        chunks.append(AttentionPrefillChunk(start, len(compressed), top_n, top_n + top_g))
    return chunks
