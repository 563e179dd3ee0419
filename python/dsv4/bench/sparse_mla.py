"""Benchmark cases of sparse MLA attention on DeepSeek-V4 shapes.

Decode (and vLLM's prefill, which runs the same op with one query per row) goes through vLLM's entry point
``flash_mla_with_kvcache_cpu``: a sliding window of 128 entries plus the compressed entries, one softmax with the
sink; dsv4 and the peer get identical inputs. ``sparse_mla_prefill`` (FlashMLA's bf16 prefill) has no vLLM
counterpart, so it runs without a peer.
"""

from __future__ import annotations

import torch

import dsv4

from .. import cache
from ..constants import MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, SLIDING_WINDOW
from ..reference import sparse_mla as ref_sparse_mla
from . import Case

FLASH_HEADS, FLASH_COMPRESSED = 64, 512  # DeepSeek-V4-Flash: heads per rank at TP1, C4 top-k
PRO_HEADS, PRO_COMPRESSED = 128, 1024  # DeepSeek-V4-Pro
WINDOW_BLOCK, COMPRESSED_BLOCK = 256, 64  # vLLM's SWA block size and its C4 compressed block (256 / 4)
DECODE_TOKENS, QUICK_DECODE_TOKENS = (1, 8, 32, 128), (1, 8)
PREFILL_TOKENS, QUICK_PREFILL_TOKENS = 4096, 256
MAX_POOL_ENTRIES = 1 << 16  # cache entries per pool: distinct rows per token up to this, beyond any L3
REFERENCE_MAX_TOKENS = 8  # the reference is timed only up to this many query tokens
KV_SPREAD = 0.3  # keeps the scores O(1)
BF16_BYTES, FP32_BYTES = 2, 4


def filled_cache(entries: int, block_size: int, layout: str = "model1") -> torch.Tensor:
    num_blocks = -(-entries // block_size)
    pages = cache.allocate_kv_cache(num_blocks, block_size, layout)
    rows = (torch.randn(num_blocks * block_size, MODEL1_HEAD_DIM) * KV_SPREAD).bfloat16()
    dsv4.ops.quantize_kv_insert(rows, torch.arange(num_blocks * block_size), pages, block_size,
                                layout="auto" if layout == "model1" else layout)
    return pages


def random_slots(tokens: int, per_token: int, pool: int) -> torch.Tensor:
    """int64 [tokens, per_token] slots, distinct within a token, spread over the pool."""
    return torch.stack([torch.randperm(pool)[:per_token] for _ in range(tokens)])


def attention_flops(tokens: int, heads: int, entries: int) -> int:
    return 2 * 2 * heads * MODEL1_HEAD_DIM * entries * tokens  # S = QK^T and O = PV


def decode_case(tokens: int, heads: int, compressed: int, label: str = "sparse_mla_decode") -> Case:
    window_pool = min(MAX_POOL_ENTRIES, max(tokens * SLIDING_WINDOW, WINDOW_BLOCK))
    compressed_pool = min(MAX_POOL_ENTRIES, max(tokens * compressed, COMPRESSED_BLOCK))
    window_cache = filled_cache(window_pool, WINDOW_BLOCK)
    compressed_cache = filled_cache(compressed_pool, COMPRESSED_BLOCK)
    window_slots = random_slots(tokens, SLIDING_WINDOW, window_pool)
    compressed_slots = random_slots(tokens, compressed, compressed_pool)
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    sink = torch.randn(heads)
    out = torch.empty_like(q)
    scale = MODEL1_HEAD_DIM**-0.5
    entries = SLIDING_WINDOW + compressed

    def run(m):
        m.flash_mla_with_kvcache_cpu(out, q, window_cache, window_slots, WINDOW_BLOCK, compressed_cache,
                                     compressed_slots, COMPRESSED_BLOCK, sink, scale)

    def reference():
        ref_sparse_mla.sparse_mla_decode(q.unsqueeze(1), window_cache, window_slots.unsqueeze(1), WINDOW_BLOCK,
                                        attn_sink=sink, extra_kv_cache=compressed_cache,
                                        extra_indices=compressed_slots.unsqueeze(1),
                                        extra_block_size=COMPRESSED_BLOCK, sm_scale=scale)

    return Case(label, f"T={tokens} H={heads} {SLIDING_WINDOW}+{compressed}",
                tokens * (entries * MODEL1_BYTES_PER_TOKEN + 2 * heads * MODEL1_HEAD_DIM * BF16_BYTES), run,
                reference if tokens <= REFERENCE_MAX_TOKENS else None, flops=attention_flops(tokens, heads, entries))


def v41_decode_case(tokens: int, heads: int, compressed: int, extra_layout: str = "v41_fp4") -> Case:
    """DeepSeek-V4.1's decode: a 528-byte fp8 window cache and a 288-byte fp4 (or 528-byte fp8) compressed cache,
    page-split as vLLM writes them; no peer serves V4.1 on the CPU, so the V4.0 row of the same shape is its
    comparison."""
    window_pool = min(MAX_POOL_ENTRIES, max(tokens * SLIDING_WINDOW, WINDOW_BLOCK))
    compressed_pool = min(MAX_POOL_ENTRIES, max(tokens * compressed, COMPRESSED_BLOCK))
    window_cache = filled_cache(window_pool, WINDOW_BLOCK, "v41_fp8")
    compressed_cache = filled_cache(compressed_pool, COMPRESSED_BLOCK, extra_layout)
    window_slots = random_slots(tokens, SLIDING_WINDOW, window_pool).unsqueeze(1)
    compressed_slots = random_slots(tokens, compressed, compressed_pool).unsqueeze(1)
    q = torch.randn(tokens, 1, heads, MODEL1_HEAD_DIM).bfloat16()
    sink = torch.randn(heads)
    kwargs = dict(attn_sink=sink, extra_kv_cache=compressed_cache, extra_indices=compressed_slots,
                  extra_block_size=COMPRESSED_BLOCK, layout="v41_fp8", extra_layout=extra_layout)
    entries = SLIDING_WINDOW + compressed
    entry_bytes = SLIDING_WINDOW * cache.KV_LAYOUTS["v41_fp8"] + compressed * cache.KV_LAYOUTS[extra_layout]
    return Case(f"sparse_mla_decode V4.1 (528+{cache.KV_LAYOUTS[extra_layout]})",
                f"T={tokens} H={heads} {SLIDING_WINDOW}+{compressed}",
                tokens * (entry_bytes + 2 * heads * MODEL1_HEAD_DIM * BF16_BYTES),
                lambda m: dsv4.ops.sparse_mla_decode(q, window_cache, window_slots, WINDOW_BLOCK, **kwargs),
                (lambda: ref_sparse_mla.sparse_mla_decode(q, window_cache, window_slots, WINDOW_BLOCK, **kwargs))
                if tokens <= REFERENCE_MAX_TOKENS else None, on_peer=False,
                flops=attention_flops(tokens, heads, entries))


def prefill_case(tokens: int, heads: int, topk: int) -> Case:
    kv = (torch.randn(tokens, 1, MODEL1_HEAD_DIM) * KV_SPREAD).bfloat16()
    indices = torch.randint(0, tokens, (tokens, 1, topk), dtype=torch.int32)
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    sink = torch.randn(heads)
    scale = MODEL1_HEAD_DIM**-0.5
    return Case("sparse_mla_prefill", f"T={tokens} H={heads} topk={topk} bf16",
                tokens * (topk * MODEL1_HEAD_DIM + 2 * heads * MODEL1_HEAD_DIM) * BF16_BYTES + tokens * heads * 2
                * FP32_BYTES,
                lambda m: dsv4.ops.sparse_mla_prefill(q, kv, indices, scale, attn_sink=sink),
                (lambda: ref_sparse_mla.sparse_mla_prefill(q, kv, indices, scale, attn_sink=sink))
                if tokens <= REFERENCE_MAX_TOKENS else None,
                on_peer=False, flops=attention_flops(tokens, heads, topk))


def cases(quick: bool = False) -> list[Case]:
    decode_tokens = QUICK_DECODE_TOKENS if quick else DECODE_TOKENS
    prefill_tokens = QUICK_PREFILL_TOKENS if quick else PREFILL_TOKENS
    entries = SLIDING_WINDOW + FLASH_COMPRESSED
    return [
        *(decode_case(t, FLASH_HEADS, FLASH_COMPRESSED) for t in decode_tokens),
        *(decode_case(t, PRO_HEADS, PRO_COMPRESSED) for t in decode_tokens),
        *(v41_decode_case(t, FLASH_HEADS, FLASH_COMPRESSED) for t in decode_tokens),
        v41_decode_case(decode_tokens[-1], FLASH_HEADS, FLASH_COMPRESSED, extra_layout="v41_fp8"),
        decode_case(prefill_tokens, FLASH_HEADS, FLASH_COMPRESSED, label="sparse_mla_decode (vLLM prefill)"),
        prefill_case(prefill_tokens, FLASH_HEADS, entries),
    ]
