"""Benchmark cases of DeepSeek-V4.1-Flash attention layers against the V4.0-Flash ones in the same run (decode).

A batch of one-token requests over a long context whose caches hold random entries; V4.1-Flash's shapes
(hidden 5120, 64 heads, 32 indexer heads, 1280 q rank) in six layers, one of each role: window only, a ratio-2
kv + index source, a ratio-2 consumer, a ratio-1 kv + index + candidate source, a ratio-1 two-level index layer, a
ratio-1 consumer. V4.1-Flash's 40 layers are 2, 3, 15, 1, 4 and 15 of these.
The V4.0-Flash rows (window only, C4A, C128A) are the :mod:`.layer` decode cases. Bytes moved count the weights
and the attended records (V4.1: 528 B window and compressed entries; V4.0: 584 B).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .. import ops
from ..constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM, SWA_BLOCK_SIZE, V41_FP8_BYTES_PER_TOKEN
from ..metadata import LayerType
from ..model.attention_step import COMPRESSED_GROUP, INDEXER_GROUP
from ..model.cache_manager import CacheGroup, ScheduledBatch
from ..model.config import V4_1_FLASH
from ..model.stack import AttentionStack
from . import Case
from . import layer as v40_layer

# One layer of each V4.1 role, with V4.1-Flash's shapes (its first layers are sources; these are their kinds).
ROLES = replace(V4_1_FLASH, name="DSv4.1-Flash layers", compress_ratios=(0, 2, 2, 1, 1, 1),
                kv_source_layer_ids=(1, 3), index_source_layer_ids=(1, 3, 4), candidate_source_layer_id=3)
ROLE_NAMES = ("swaonly", "c2a kv+index source", "c2a consumer", "c1a sources+candidates", "c1a two-level index",
              "c1a consumer")


def _fill_v41_context(stack: AttentionStack, requests: list[int], context: int) -> None:
    """Random window entries of every layer; random compressed entries, keys and states of every kv source."""

    def rows(cache, block_size, layout):
        return lambda slots: ops.quantize_kv_insert(torch.randn(slots.numel(), MODEL1_HEAD_DIM), slots, cache,
                                                    block_size, layout=layout)

    for index, layer in enumerate(stack.layers):
        caches = stack.manager.layer_caches[index]
        v40_layer._fill_entries(stack, CacheGroup.SWA, requests, context, SWA_BLOCK_SIZE,
                                rows(caches.swa, SWA_BLOCK_SIZE, caches.window_layout))
        if not layer.is_kv_source:
            continue
        caches.compressor_state.normal_()
        block, count = caches.compressed_block_size, context // layer.compress_ratio
        v40_layer._fill_entries(stack, COMPRESSED_GROUP[layer.layer_type], requests, count, block,
                                rows(caches.compressed, block, caches.compressed_layout))
        v40_layer._fill_entries(stack, INDEXER_GROUP[layer.layer_type], requests, count, block,
                                lambda slots, c=caches, b=block: ops.indexer_k_quant_insert(
                                    torch.randn(slots.numel(), INDEXER_HEAD_DIM), slots, c.indexer_k, b,
                                    c.index_key_format))


def _attended(layer, context: int) -> int:
    compressed = 0 if layer.layer_type is LayerType.SWA_ONLY else min(layer.config.index_topk,
                                                                       context // layer.compress_ratio)
    return layer.config.sliding_window + compressed


def v41_cases(batch: int, context: int, key_format: str) -> list[Case]:
    config = replace(ROLES, index_key_format=key_format)
    stack = AttentionStack(config, max_model_len=context + 1, max_num_reqs=batch, max_num_batched_tokens=batch)
    requests = list(range(batch))
    for request in requests:
        stack.manager.reserve(request, context + 1)
    _fill_v41_context(stack, requests, context)
    step = stack.prepare(ScheduledBatch(tuple(requests), (1,) * batch, (context + 1,) * batch))
    hidden = torch.randn(batch, config.hidden_size).bfloat16()
    out = []
    for index, layer in enumerate(stack.layers):
        weights, entries = sum(t.nbytes for t in layer.state_dict().values()), _attended(layer, context)
        out.append(Case(
            f"V4.1 layer {ROLE_NAMES[index]}", f"decode B={batch} ctx={context} {key_format}",
            bytes_moved=weights + batch * entries * V41_FP8_BYTES_PER_TOKEN,
            flops=v40_layer._flops(stack, index, batch, entries),
            run=lambda m, i=index: stack.run_layer(i, hidden, step), reference=None, on_peer=False))
    return out


def cases(quick: bool = False) -> list[Case]:
    batch, context = (2, 640) if quick else (8, 4096)  # as the V4.0 decode cases
    v40 = [case for case in v40_layer.cases(quick) if case.shape.startswith("decode")]
    for case in v40:
        case.op = case.op.replace("layer", "V4.0 layer")
    return v40 + v41_cases(batch, context, "fp8") + v41_cases(batch, context, "mxfp4")
