"""Benchmark cases of whole attention layers (DSv4-Flash: 64 heads, hidden 4096), one per layer type.

Decode: a batch of one-token requests over a long context whose caches are filled with random entries
(C4A past 2048 tokens runs the real indexer); the dense reference is not timed there (it would need the
whole token history). Prefill: one prompt from position 0, timed against the dense float reference.
Each case reruns one step, which rewrites the same cache slots.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .. import ops
from ..compat import vllm_cpu
from ..constants import C4_RATIO, C128_RATIO, INDEXER_HEAD_DIM, MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, SWA_BLOCK_SIZE
from ..metadata import LayerType
from ..model.attention_step import COMPRESSED_GROUP
from ..model.cache_manager import CacheGroup, ScheduledBatch
from ..model.config import V4_FLASH
from ..model.stack import AttentionStack
from ..reference.layer import dense_attention
from . import Case
from .peer_ops import layer_ops, peer_ops


def _fill_entries(stack: AttentionStack, group: CacheGroup, requests: list[int], count: int, entries_per_page: int,
                  write) -> None:
    """Calls ``write(slots)`` with the slots of entries ``0 .. count-1`` of every request in one cache group."""
    table = stack.manager.allocators[group].block_table(requests, stack.manager.max_blocks[group])
    local = torch.arange(count).expand(len(requests), count)
    slots = ops.map_local_to_global_slots(local, torch.arange(len(requests)), table, entries_per_page).reshape(-1)
    write(slots)


def _fill_context(stack: AttentionStack, requests: list[int], context: int) -> None:
    """Random window, compressed and indexer entries and compressor states for ``context`` tokens per request."""

    def model1_rows(cache, block_size):
        return lambda slots: ops.quantize_kv_insert(torch.randn(slots.numel(), MODEL1_HEAD_DIM), slots, cache,
                                                    block_size)

    for index, layer in enumerate(stack.layers):
        caches = stack.manager.layer_caches[index]
        _fill_entries(stack, CacheGroup.SWA, requests, context, SWA_BLOCK_SIZE, model1_rows(caches.swa, SWA_BLOCK_SIZE))
        if layer.layer_type is LayerType.SWA_ONLY:
            continue
        caches.compressor_state.normal_()
        block = caches.compressed_block_size
        _fill_entries(stack, COMPRESSED_GROUP[layer.layer_type], requests, context // layer.compress_ratio, block,
                      model1_rows(caches.compressed, block))
        if layer.layer_type is LayerType.C4A:
            caches.indexer_state.normal_()
            _fill_entries(stack, CacheGroup.C4_INDEXER_K, requests, context // C4_RATIO, block,
                          lambda slots, c=caches, b=block: ops.indexer_k_quant_insert(
                              torch.randn(slots.numel(), INDEXER_HEAD_DIM), slots, c.indexer_k, b))


def _compressed_attended(layer_type: LayerType, context: int, topk: int) -> int:
    """Compressed entries a token at the end of ``context`` attends."""
    return {LayerType.SWA_ONLY: 0, LayerType.C4A: min(topk, context // C4_RATIO),
            LayerType.C128A: context // C128_RATIO}[layer_type]


def _flops(stack: AttentionStack, index: int, tokens: int, entries: int) -> int:
    """Projections (2 per weight per token) plus attention (QK^T and PV over ``entries`` per token)."""
    config = stack.config
    weights = sum(w.numel() for name, w in stack.layers[index].state_dict().items()
                  if w.dim() == 2 and not name.endswith("ape"))
    return 2 * tokens * weights + 4 * tokens * config.num_attention_heads * config.head_dim * entries


def run_decode(stack: AttentionStack, index: int, hidden: torch.Tensor, step, module) -> None:
    """One decode step of a layer with dsv4's ops, or with each op replaced by the vLLM peer's (``module``)."""
    if module is vllm_cpu:
        stack.run_layer(index, hidden, step)
        return
    with layer_ops(peer_ops(module)):
        stack.run_layer(index, hidden, step)


def cases(quick: bool = False) -> list[Case]:
    batch, context, prompt = (2, 640, 128) if quick else (8, 4096, 1024)
    config = replace(V4_FLASH, name="DSv4-Flash layers", compress_ratios=(0, 4, 128))
    stack = AttentionStack(config, max_model_len=max(context + 1, prompt), max_num_reqs=batch + 1,
                           max_num_batched_tokens=max(prompt, batch))
    decoders = list(range(batch))
    for request in decoders:
        stack.manager.reserve(request, context + 1)
    _fill_context(stack, decoders, context)
    decode_step = stack.prepare(ScheduledBatch(tuple(decoders), (1,) * batch, (context + 1,) * batch))
    decode_input = torch.randn(batch, config.hidden_size).bfloat16()
    prefill_step = stack.prepare(ScheduledBatch((batch,), (prompt,), (prompt,)))
    prompt_input = torch.randn(prompt, config.hidden_size).bfloat16()
    results = []
    for index, layer in enumerate(stack.layers):
        kind, weights = layer.layer_type.value, sum(t.nbytes for t in layer.state_dict().values())
        entries = config.sliding_window + _compressed_attended(layer.layer_type, context, config.index_topk)
        results.append(Case(
            f"layer {kind}", f"decode B={batch} ctx={context}",
            bytes_moved=weights + batch * entries * MODEL1_BYTES_PER_TOKEN,
            flops=_flops(stack, index, batch, entries),
            run=lambda m, i=index: run_decode(stack, i, decode_input, decode_step, m),
            reference=None))
        entries = config.sliding_window + _compressed_attended(layer.layer_type, prompt, config.index_topk)
        results.append(Case(
            f"layer {kind}", f"prefill T={prompt}",
            bytes_moved=weights + prompt * (2 * config.hidden_size + MODEL1_BYTES_PER_TOKEN),
            flops=_flops(stack, index, prompt, entries),  # an upper bound: early tokens attend fewer entries
            run=lambda m, i=index: stack.run_layer(i, prompt_input, prefill_step),
            reference=lambda i=index: dense_attention(stack.layers[i], prompt_input, torch.arange(prompt)),
            on_peer=False))
    return results
