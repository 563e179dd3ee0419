"""Benchmark cases of the lightning indexer (DSv4-Flash: 64 heads x 128 dims, compressed ratio 4).

Paged decode logits at 4K-128K raw tokens of context (1K-32K compressed entries) for batch 1-32, V4.1's
32-head logits over fp8 and MXFP4 keys at the same shapes,
ragged prefill logits for 4096 query rows, the fused paged top-k against logits + top-k, and the q quantization.
"""

from __future__ import annotations

import torch

from .. import cache, ops
from ..reference import indexer as ref_indexer
from . import BLOCK, INDEXER_DIM, INDEXER_HEADS, Case, token_batch

HEADS, DIM, RATIO = INDEXER_HEADS, INDEXER_DIM, 4
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


V41_HEADS = 32  # DeepSeek-V4.1's indexer heads (ratio 1: one key per token)


def v41_paged_case(batch: int, entries: int, key_format: str) -> Case:
    """V4.1 decode logits, 32 heads, over fp8 keys (e4m3 query) or MXFP4 keys (MXFP4 query): the same shapes."""
    pages = (entries + BLOCK - 1) // BLOCK
    kv = cache.allocate_indexer_k_cache(batch * pages, BLOCK, key_format=key_format)
    data = DIM if key_format == "fp8" else DIM // 2
    kv.view(-1)[:] = torch.randint(0, 120, (kv.numel(),), dtype=torch.uint8)  # finite codes
    scales = kv[:, BLOCK * data : BLOCK * (data + 4)]
    if key_format == "fp8":
        scales.view(torch.float32).copy_(torch.exp2(torch.randint(-8, 0, (batch * pages, BLOCK)).float()))
        q, q_scale = _fp8(batch, 1, V41_HEADS, DIM), None
    else:
        scales.copy_(torch.randint(120, 130, scales.shape, dtype=torch.uint8))  # UE8M0: 2^-7 .. 2^2
        q = torch.randint(0, 256, (batch, 1, V41_HEADS, DIM // 2), dtype=torch.uint8)
        q_scale = torch.randint(120, 130, (batch, 1, V41_HEADS, DIM // 32), dtype=torch.uint8)
    weights = torch.randn(batch, V41_HEADS)
    lens = torch.full((batch,), entries, dtype=torch.int32)
    table = torch.randperm(batch * pages, dtype=torch.int32).view(batch, pages)
    return Case(
        f"paged logits V4.1 {key_format} keys", f"B={batch} H={V41_HEADS} n={entries // 1024}K",
        bytes_moved=batch * entries * (data + 4 + 4), flops=2 * batch * entries * V41_HEADS * DIM,
        run=lambda m: ops.fp8_paged_mqa_logits(q, kv, weights, lens, table, BLOCK, entries, clean_logits=False,
                                               q_scale=q_scale, key_format=key_format),
        reference=None, on_peer=False,
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


def peak_extra_mib(fn) -> float:
    """Peak resident memory fn() adds on top of what the process holds now (Linux; 0 elsewhere)."""
    def status_kib(field: str) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field))

    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # resets the VmHWM high-water mark
        before = status_kib("VmRSS:")
        fn()
        return (status_kib("VmHWM:") - before) / 1024
    except OSError:
        return 0.0


def prefill_topk_cases(tokens: int, raw_context: int) -> list[Case]:
    """Causal prefill of the last `tokens` of a `raw_context` request: fused vs logits-then-top-k."""
    entries = raw_context // RATIO
    pages = (entries + BLOCK - 1) // BLOCK
    kv = cache.allocate_indexer_k_cache(pages, BLOCK)
    kv.view(-1)[:] = torch.randint(0, 120, (kv.numel(),), dtype=torch.uint8)
    kv[:, BLOCK * DIM : BLOCK * (DIM + 4)].view(torch.float32).copy_(torch.full((pages, BLOCK), 0.125))
    q = _fp8(tokens, HEADS, DIM)
    weights = torch.randn(tokens, HEADS)
    positions = torch.arange(raw_context - tokens, raw_context)
    lengths = ((positions + 1) // RATIO).int()
    table = torch.randperm(pages, dtype=torch.int32).view(1, pages)
    rows = torch.zeros(tokens, dtype=torch.int32)
    flops = 2 * int(lengths.long().sum()) * HEADS * DIM

    def fused():
        ops.fp8_paged_mqa_topk(q, kv, weights, lengths, table, rows, BLOCK, 512)

    def unfused():
        logits = ops.fp8_paged_mqa_logits(q.unsqueeze(1), kv, weights, lengths, table.expand(tokens, -1), BLOCK,
                                          int(lengths.max()))
        ops.topk_transform(logits, lengths, 512)

    label = f"T={tokens} ctx={raw_context // 1024}K"
    return [
        Case("fp8_paged_mqa_topk (fused)", f"{label} +{peak_extra_mib(fused):.0f}MiB", bytes_moved=pages * 8640,
             flops=flops, run=lambda m: fused(), reference=None, on_peer=False),
        Case("paged logits + topk (unfused)", f"{label} +{peak_extra_mib(unfused):.0f}MiB", bytes_moved=pages * 8640,
             flops=flops, run=lambda m: unfused(), reference=None, on_peer=False),
    ]


def q_rope_quant_case(quick: bool) -> Case:
    batch = token_batch(quick)
    tokens, positions, rope = batch.count, batch.positions, batch.rope
    iq = torch.randn(tokens, HEADS, DIM)
    iw = torch.randn(tokens, HEADS)
    iq_fp8 = torch.empty(tokens, HEADS, DIM, dtype=torch.float8_e4m3fn)
    iw_out = torch.empty(tokens, HEADS)
    return Case("indexer_q_rope_quant", f"T={tokens} H={HEADS}", iq.nbytes + iq_fp8.nbytes + 2 * iw.nbytes,
                lambda m: m.fused_indexer_q_rope_quant_cpu(positions, iq, rope, iq_fp8, iw, 128**-0.5, 0.125, iw_out),
                lambda: ref_indexer.indexer_q_rope_quant(iq, positions, rope, iw, 128**-0.5, 0.125))


def k_norm_rope_store_case(quick: bool) -> Case:
    """DeepSeek-V4.1's index key writer (C4: every fourth token writes) into an MXFP4 cache."""
    batch = token_batch(quick)
    tokens, positions, rope = batch.count, batch.positions, batch.rope
    k_pre = torch.randn(tokens, DIM).to(torch.bfloat16)
    weight = torch.rand(DIM) + 0.5
    pages = (tokens + BLOCK - 1) // BLOCK
    kv = cache.allocate_indexer_k_cache(pages, BLOCK, key_format="mxfp4")
    slots = torch.arange(tokens)
    return Case("indexer_k_norm_rope_store (mxfp4)", f"T={tokens} R={RATIO}", k_pre.nbytes + tokens // RATIO * 68,
                lambda m: ops.indexer_k_norm_rope_store(k_pre, positions, rope, weight, 1e-6, kv, slots, BLOCK,
                                                        RATIO, "mxfp4"),
                lambda: ref_indexer.indexer_k_norm_rope_store(k_pre, positions, rope, weight, 1e-6, kv.clone(),
                                                              slots, BLOCK, RATIO, "mxfp4"), on_peer=False)


def cases(quick: bool = False) -> list[Case]:
    shapes = [(1, 4096), (4, 65536)] if quick else [(1, 4096), (1, 131072), (4, 65536), (32, 16384)]
    out = [paged_case(batch, ctx) for batch, ctx in shapes]
    v41_shapes = [(1, 16384)] if quick else [(1, 65536), (8, 16384)]
    out += [v41_paged_case(batch, n, key_format) for batch, n in v41_shapes for key_format in ("fp8", "mxfp4")]
    out.append(ragged_case(512 if quick else 4096, 1024 if quick else 4096))
    out += prefill_topk_cases(*((512, 16384) if quick else (8192, 131072)))
    out.append(q_rope_quant_case(quick))
    out.append(k_norm_rope_store_case(quick))
    return out
