"""The DeepSeek-V4.1 attention layers against their dense float reference: a stack of the tiny V4.1 preset (a
window-only layer, a ratio-2 kv source and its consumer, a ratio-1 kv source, a two-level index layer) over a
chunked prefill, a mixed decode + prefill step and decode steps, for both indexer key formats and both
compressed records; the caches the sources write, the sharing of the caches, the candidate blocks, the
configuration.

Tolerances: those of the V4.0 layer (dsv4.reference.layer), the compressed entries within one fp8 (or fp4) step.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dsv4 import ops
from dsv4.metadata import LayerType
from dsv4.model.cache_manager import CacheGroup, PagedCacheManager, ScheduledBatch
from dsv4.model.config import TINY_V41, V4_1_FLASH, DeepseekV4AttentionConfig
from dsv4.model.layer_v41 import mask_to_candidates, select_candidate_blocks
from dsv4.model.stack import AttentionStack
from dsv4.reference import layer_v41 as reference
from dsv4.reference import quant
from dsv4.reference.layer import MAX_RELATIVE_ERROR, MAX_RELATIVE_ERROR_FP8_STORAGE, MIN_COSINE, agreement

MAX_MODEL_LEN = 2304
# Entries pooled by the kernels vs the float reference, relative per entry: fp8 codes about 3 % (e4m3 tiles of
# 32), fp4 about 15 %.
MAX_ENTRY_ERROR = {"v41_fp8": 0.04, "v41_fp4": 0.2}
MAX_KEY_ERROR = {"fp8": 0.04, "mxfp4": 0.2}


class Stack:
    """The tiny V4.1 stack with fixed per-request inputs of every layer (each layer's input its own random rows)."""

    def __init__(self, total_lens: list[int], max_num_batched_tokens: int, **changes):
        self.config = replace(TINY_V41, **changes)
        self.stack = AttentionStack(self.config, max_model_len=MAX_MODEL_LEN, max_num_reqs=len(total_lens),
                                    max_num_batched_tokens=max_num_batched_tokens, seed=11)
        layers = self.config.num_hidden_layers
        self.inputs = [[torch.randn(n, self.config.hidden_size).bfloat16() for n in total_lens] for _ in range(layers)]

    def step(self, batch: ScheduledBatch) -> list[torch.Tensor]:
        step = self.stack.prepare(batch)
        outputs = []
        for index in range(self.config.num_hidden_layers):
            x = torch.cat([self.inputs[index][r][s - q : s]
                           for r, q, s in zip(batch.request_ids, batch.query_lens, batch.seq_lens, strict=True)])
            outputs.append(self.stack.run_layer(index, x, step).float())
        return outputs

    def reference(self, index: int, batch: ScheduledBatch, stored: bool) -> torch.Tensor:
        """The layer's rows of the batch from the dense reference, given the selection its index source made."""
        layer, rows, start = self.stack.layers[index], [], 0
        source = self.config.kv_source_of(index) if layer.selection_source is not None else None
        for r, q, s in zip(batch.request_ids, batch.query_lens, batch.seq_lens, strict=True):
            selection = (layer.selection_source.topk_indices_buffer[start : start + q].clone()
                         if source is not None else None)
            rows.append(reference.dense_attention(
                layer, self.inputs[index][r][:s], torch.arange(s - q, s),
                None if source is None else self.stack.layers[source],
                None if source is None else self.inputs[source][r][:s], selection, stored))
            start += q
        return torch.cat(rows)


# r0: a 1400-token prompt in two chunks (1024, then 376 with a prefix), so the ratio-1 layers select (1400 > 512
# entries) and the two-level layer chooses inside 96 blocks of 8; r1: a 140-token prompt.
SCHEDULE = [
    ScheduledBatch((0, 1), (1024, 140), (1024, 140)),
    ScheduledBatch((1, 0), (1, 376), (141, 1400)),
    ScheduledBatch((0, 1), (1, 1), (1401, 142)),
]


@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "nvfp4_ds_mla"])
def test_layers_match_dense_reference(key_format, kv_cache_dtype):
    stack = Stack([1401, 142], max_num_batched_tokens=1400, index_key_format=key_format, kv_cache_dtype=kv_cache_dtype)
    for batch in SCHEDULE:
        outputs = stack.step(batch)
        for index, out in enumerate(outputs):
            # the fp4 compressed record alone moves the output by several percent: only the stored comparison
            # bounds it (the float one holds for the fp8 records)
            cosine, error = agreement(out, stack.reference(index, batch, stored=True))
            assert cosine > MIN_COSINE and error < MAX_RELATIVE_ERROR_FP8_STORAGE, (
                f"layer {index}, {batch}: cosine {cosine:.4f}, error {error:.4f} against the stored records")
            if kv_cache_dtype == "fp8":
                cosine, error = agreement(out, stack.reference(index, batch, stored=False))
                assert cosine > MIN_COSINE and error < MAX_RELATIVE_ERROR, (
                    f"layer {index}, {batch}: cosine {cosine:.4f}, error {error:.4f}")
    rows = stack.stack.layers[4].topk_indices_buffer[:2]
    blocks = stack.stack.layers[3].candidate_blocks[:2]
    for row, block_row in zip(rows, blocks, strict=True):  # the two-level layer chose inside the published blocks
        chosen = row[row >= 0].long()
        assert torch.isin(chosen // TINY_V41.candidate_block_size, block_row[block_row >= 0].long()).all()
    assert (rows[0] >= 0).sum() == 512


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "nvfp4_ds_mla"])
@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
def test_sources_write_the_pooled_entries_and_keys(kv_cache_dtype, key_format):
    stack = Stack([1400, 142], max_num_batched_tokens=1400, index_key_format=key_format, kv_cache_dtype=kv_cache_dtype)
    for batch in SCHEDULE[:2]:
        stack.step(batch)
    manager = stack.stack.manager
    for index, group, key_group in ((1, CacheGroup.C2_KV, CacheGroup.C2_INDEXER_K),
                                    (3, CacheGroup.C1_KV, CacheGroup.C1_INDEXER_K)):
        source, caches = stack.stack.layers[index], manager.layer_caches[index]
        count = 1400 // source.compress_ratio
        table = manager.allocators[group].block_table([0])
        slots = ops.map_local_to_global_slots(torch.arange(count)[None], torch.tensor([0]), table,
                                              caches.compressed_block_size)[0]
        expected = reference.compressed_entries(source, stack.inputs[index][0])
        stored = ops.dequantize_kv_gather(caches.compressed, slots, caches.compressed_block_size,
                                          layout=caches.compressed_layout).float()
        errors = (stored - expected).norm(dim=-1) / expected.norm(dim=-1)
        assert errors.max() < MAX_ENTRY_ERROR[caches.compressed_layout], f"layer {index}: {errors.max():.4f}"
        key_table = manager.allocators[key_group].block_table([0])
        key_slots = ops.map_local_to_global_slots(torch.arange(count)[None], torch.tensor([0]), key_table,
                                                  caches.compressed_block_size)[0]
        values, scales = quant.indexer_key_unpack(*quant.indexer_key_read(caches.indexer_k, key_slots,
                                                                          caches.compressed_block_size, key_format),
                                                  key_format)
        keys = values * scales[:, None]
        expected_keys = reference.index_keys(source, stack.inputs[index][0])
        errors = (keys - expected_keys).norm(dim=-1) / expected_keys.norm(dim=-1)
        assert errors.max() < MAX_KEY_ERROR[key_format], f"layer {index} keys: {errors.max():.4f}"


def test_consumers_share_their_sources_caches():
    manager = PagedCacheManager(TINY_V41, max_model_len=1024, max_num_reqs=2)
    window, c2_source, c2_consumer, c1_source, c1_index = manager.layer_caches
    assert window.compressed is None and window.indexer_k is None
    assert c2_consumer.compressed is c2_source.compressed and c2_consumer.indexer_k is c2_source.indexer_k
    assert c1_index.compressed is c1_source.compressed and c1_index.compressor_state is None
    assert c2_source.compressed is not c1_source.compressed
    assert c2_source.compressed_block_size == 128 and c1_source.compressed_block_size == 256
    assert window.swa.stride(0) % 512 == 0 and window.window_layout == "v41_fp8"
    assert c1_source.indexer_k.stride(0) >= 256 * 68 and c1_source.index_key_format == "mxfp4"
    fp4 = PagedCacheManager(replace(TINY_V41, kv_cache_dtype="nvfp4_ds_mla"), max_model_len=1024, max_num_reqs=1)
    assert fp4.layer_caches[1].compressed_layout == "v41_fp4" and fp4.layer_caches[1].window_layout == "v41_fp8"
    groups = set(manager.groups)
    assert {CacheGroup.C1_KV, CacheGroup.C2_STATE, CacheGroup.C1_INDEXER_K} <= groups
    assert CacheGroup.C4_KV not in groups


def test_candidate_blocks_against_a_direct_count():
    torch.manual_seed(0)
    logits = torch.randn(5, 37)
    lengths = torch.tensor([37, 20, 0, 8, 1])
    out = torch.empty(5, 3, dtype=torch.int32)
    select_candidate_blocks(logits, lengths, 8, 3, out)
    for row in range(5):
        n = int(lengths[row])
        if n == 0:
            assert (out[row] == -1).all()
            continue
        blocks = -(-n // 8)
        scores = torch.stack([logits[row, b * 8 : min((b + 1) * 8, n)].max() for b in range(blocks)])
        scores[blocks - 1] = float("inf")  # the newest block is always kept
        expected = scores.topk(min(3, blocks)).indices
        assert out[row, : len(expected)].tolist() == expected.tolist()
        assert (out[row, len(expected) :] == -1).all()
    masked = mask_to_candidates(logits, out, 8)
    keep = torch.isin(torch.arange(37) // 8, out[0][out[0] >= 0].long())
    assert torch.equal(masked[0].isfinite(), keep) and torch.equal(masked[0][keep], logits[0][keep])


def test_presets_and_sources():
    assert V4_1_FLASH.num_hidden_layers == 40 and V4_1_FLASH.index_n_heads == 32
    assert V4_1_FLASH.layer_types[:3] == [LayerType.SWA_ONLY, LayerType.SWA_ONLY, LayerType.C2A]
    assert V4_1_FLASH.layer_types[20:] == [LayerType.C1A] * 20
    assert [V4_1_FLASH.kv_source_of(i) for i in (2, 7, 8, 19, 20, 39)] == [2, 2, 8, 14, 20, 20]
    assert [V4_1_FLASH.index_source_of(i) for i in (3, 21, 24, 27, 39)] == [2, 20, 24, 24, 36]
    assert V4_1_FLASH.uses_candidates(24) and not V4_1_FLASH.uses_candidates(25) and not V4_1_FLASH.uses_candidates(20)
    assert V4_1_FLASH.cache_record("window") == "v41_fp8" and V4_1_FLASH.cache_record("compressed") == "v41_fp8"
    assert replace(V4_1_FLASH, kv_cache_dtype="nvfp4_ds_mla").cache_record("compressed") == "v41_fp4"
    assert V4_1_FLASH.first_layers(10).index_source_layer_ids == (2, 8)


@pytest.mark.parametrize("change, message", [
    ({"compress_ratios": (0, 4, 2, 1, 1)}, "unsupported compress ratio 4 for DeepSeek-V4.1"),
    ({"kv_source_layer_ids": (3,)}, "layer 1 has no kv or index source"),
    ({"kv_source_layer_ids": (1, 4)}, r"layer 3 \(c1a\) would read the cache of layer 1 \(c2a\)"),
    ({"compress_ratios": (0, 2, 2, 1, 1), "kv_source_layer_ids": (1, 3, 4), "index_source_layer_ids": (1, 3)},
     "layer 4 reads the cache of layer 4 but takes the selection of layer 3"),
    ({"kv_source_layer_ids": (0, 3)}, "kv_source_layer_ids must name compressed layers"),
    ({"compress_ratios": (0, 2, 1, 1, 1)}, r"layer 2 \(c1a\) would read the cache of layer 1 \(c2a\)"),
    ({"candidate_source_layer_id": 2}, "must be an index-source layer"),
    ({"kv_cache_dtype": "bf16"}, "kv_cache_dtype 'bf16' is not supported for DeepSeek v4.1"),
    ({"index_key_format": "int8"}, "index_key_format"),
])
def test_bad_v41_configs(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TINY_V41, **change)


def test_config_from_a_v41_hf_dict():
    hf = {"architectures": ["DeepseekV41ForCausalLM"], "hidden_size": 5120, "num_attention_heads": 64,
          "q_lora_rank": 1280, "o_lora_rank": 1024, "o_groups": 8, "compress_ratios": [0, 0, 2, 2, 1],
          "index_topk": 512, "index_n_heads": 32, "kv_source_layer_ids": [2, 4], "index_source_layer_ids": [2, 4],
          "candidate_source_layer_id": 4, "candidate_topk_blocks": 2048, "candidate_block_size": 8,
          "rope_scaling": {"factor": 16, "original_max_position_embeddings": 65536}}
    config = DeepseekV4AttentionConfig.from_hf_config(hf)
    assert config.model_version == "v4.1" and config.layer_types[-1] is LayerType.C1A
    assert config.kv_source_of(3) == 2 and config.candidate_block_size == 8
    v40 = {k: v for k, v in hf.items() if "source" not in k and "candidate" not in k}
    v40 |= {"architectures": ["DeepseekV4ForCausalLM"], "compress_ratios": [0, 0, 4, 128, 4]}
    assert DeepseekV4AttentionConfig.from_hf_config(v40).model_version == "v4"
