"""The reference DeepSeek-V4 attention layer against the dense float reference, for every layer type, over a
chunked prefill, a mixed decode + prefill step and decode steps; cache contents, the short-context boundary,
weights and the paged cache manager.

Tolerances (dsv4.reference.layer): the layer stores keys in fp8 (e4m3 with power-of-two tile scales, a few
percent per element) and projects in bf16, so against the pure float reference the outputs agree to cosine
>= 0.99 per token and 3-4 % relative error overall (bound 6 %); with the reference's fp8 round trip of the
keys (``fp8_storage=True``) about 1.5 % (bound 3 %). Zeroing the compressed cache of a C128A layer (two of
130 attended entries) already moves the output by 12 %, of a C4A layer by 65 %.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from conftest import CUDA_TIERS
from dsv4 import ops
from dsv4.metadata import LayerType, all_compressed_local_indices, layer_types
from dsv4.model.cache_manager import CacheGroup, PagedCacheManager, ScheduledBatch
from dsv4.model.config import TINY, V4_FLASH, V4_PRO, DeepseekV4AttentionConfig, get_config
from dsv4.model.layer import DeepseekV4Attention
from dsv4.model.stack import AttentionStack
from dsv4.model.timing import OpTimer
from dsv4.reference import quant
from dsv4.reference.layer import (
    MAX_RELATIVE_ERROR,
    MAX_RELATIVE_ERROR_FP8_STORAGE,
    MIN_COSINE,
    agreement,
    compressed_entries,
    dense_attention,
    indexer_round_trip,
    model1_round_trip,
)

MAX_ENTRY_ERROR = 0.03  # compressed / indexer cache entries vs the reference pooling (relative, per entry)
MAX_MODEL_LEN = 2304


class Harness:
    """Single-layer stacks of the tiny config with fixed per-request token inputs."""

    def __init__(self, ratio: int, total_lens: list[int], max_num_batched_tokens: int, device: str = "cpu"):
        config = replace(TINY, compress_ratios=(ratio,))
        self.stack = AttentionStack(config, max_model_len=MAX_MODEL_LEN, max_num_reqs=len(total_lens),
                                    max_num_batched_tokens=max_num_batched_tokens, seed=ratio, device=device)
        self.layer = self.stack.layers[0]
        self.caches = self.stack.manager.layer_caches[0]
        self.inputs = [torch.randn(n, config.hidden_size).bfloat16().to(device) for n in total_lens]

    def step(self, batch: ScheduledBatch, timer=None):
        step = self.stack.prepare(batch)
        x = torch.cat([self.inputs[r][s - q : s] for r, q, s in zip(batch.request_ids, batch.query_lens,
                                                                      batch.seq_lens, strict=True)])
        return self.stack.run_layer(0, x, step, timer or OpTimer()).float()

    def reference(self, batch: ScheduledBatch, fp8_storage: bool = False) -> torch.Tensor:
        return torch.cat([dense_attention(self.layer, self.inputs[r][:s], torch.arange(s - q, s), fp8_storage)
                          for r, q, s in zip(batch.request_ids, batch.query_lens, batch.seq_lens, strict=True)])

    def check(self, batch: ScheduledBatch, out: torch.Tensor) -> None:
        cosine, error = agreement(out, self.reference(batch))
        assert cosine > MIN_COSINE and error < MAX_RELATIVE_ERROR, f"{batch}: cosine {cosine:.4f}, error {error:.4f}"
        _, error = agreement(out, self.reference(batch, fp8_storage=True))
        assert error < MAX_RELATIVE_ERROR_FP8_STORAGE, f"{batch}: error {error:.4f} against fp8 storage"

    def entry_slots(self, group: CacheGroup, request: int, count: int, block_size: int) -> torch.Tensor:
        table = self.stack.manager.allocators[group].block_table([request])
        return ops.map_local_to_global_slots(torch.arange(count)[None], torch.tensor([0]), table, block_size)[0]


# r0: a 390-token prompt in two chunks (256, then 134 with a 256-token prefix); r1: a 140-token prompt.
# Compressed entries cross C4 page 63 -> 64 (p = 255 | 259) and C128 page 1 -> 2 (p = 383) in the second chunk.
SCHEDULE = [
    ScheduledBatch((0, 1), (256, 140), (256, 140)),
    ScheduledBatch((1, 0), (1, 134), (141, 390)),  # a decode, then a chunked prefill with a prefix
    ScheduledBatch((0, 1), (1, 1), (391, 142)),
    ScheduledBatch((0, 1), (1, 1), (392, 143)),
]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_TIERS else []))
@pytest.mark.parametrize("ratio", [0, 4, 128], ids=["swaonly", "c4a", "c128a"])
def test_layer_matches_dense_reference(ratio, device):
    harness = Harness(ratio, [392, 143], max_num_batched_tokens=512, device=device)
    for batch in SCHEDULE:
        harness.check(batch, harness.step(batch))


@pytest.mark.parametrize("ratio, group", [(4, CacheGroup.C4_KV), (128, CacheGroup.C128_KV)], ids=["c4a", "c128a"])
def test_compressed_cache_holds_the_pooled_entries(ratio, group):
    harness = Harness(ratio, [390, 143], max_num_batched_tokens=512)
    for batch in SCHEDULE[:2]:
        harness.step(batch)
    layer, caches = harness.layer, harness.caches
    weights = {name: value.float() for name, value in layer.state_dict().items()}
    expected = model1_round_trip(compressed_entries(harness.inputs[0].float(), weights, "compressor.", ratio, 512,
                                                    layer.config.rms_norm_eps, layer.cos_sin_cache))
    slots = harness.entry_slots(group, 0, 390 // ratio, caches.compressed_block_size)
    stored = ops.dequantize_kv_gather(caches.compressed, slots, caches.compressed_block_size).float()
    errors = (stored - expected).norm(dim=-1) / expected.norm(dim=-1)
    assert errors.max() < MAX_ENTRY_ERROR


def test_indexer_cache_holds_the_pooled_keys():
    harness = Harness(4, [390, 143], max_num_batched_tokens=512)
    for batch in SCHEDULE[:2]:
        harness.step(batch)
    layer = harness.layer
    weights = {name: value.float() for name, value in layer.state_dict().items()}
    expected = indexer_round_trip(compressed_entries(harness.inputs[0].float(), weights, "indexer.compressor.", 4,
                                                     128, layer.config.rms_norm_eps, layer.cos_sin_cache))
    slots = harness.entry_slots(CacheGroup.C4_INDEXER_K, 0, 390 // 4, 64)
    codes, scales = quant.indexer_k_read(harness.caches.indexer_k, slots, 64)
    stored = quant.decode_e4m3(codes) * scales[:, None]
    assert ((stored - expected).norm(dim=-1) / expected.norm(dim=-1)).max() < MAX_ENTRY_ERROR


def test_short_context_boundary():
    """``max_seq_len // 4 == 512`` fills the top-k rows (no indexer); ``513`` runs the indexer, which keeps every
    entry of a short request (identical rows) and picks 512 of a long request's 513."""
    harness = Harness(4, [2052, 103], max_num_batched_tokens=2147)
    timer = OpTimer()
    harness.step(ScheduledBatch((0, 1), (2048, 99), (2048, 99)), timer)
    for step in range(1, 4):
        harness.step(ScheduledBatch((0, 1), (1, 1), (2048 + step, 99 + step)), timer)
    assert timer.calls["short_context_fill"] == 4 and "fp8_paged_mqa_logits" not in timer.calls
    boundary = ScheduledBatch((0, 1), (1, 1), (2052, 103))
    out = harness.step(boundary, timer)
    assert timer.calls["fp8_paged_mqa_logits"] == 1 and timer.calls["short_context_fill"] == 4
    rows = harness.layer.topk_indices_buffer[:2]
    assert (rows[0] >= 0).sum() == 512 and sorted(rows[0].tolist()) != list(range(512))
    assert torch.equal(rows[1], all_compressed_local_indices(torch.tensor([102]), 4, 512)[0].int())
    harness.check(boundary, out)


def test_weights_from_a_state_dict():
    config = replace(TINY, compress_ratios=(4,))
    layer = DeepseekV4Attention(config, 0, max_model_len=256, max_num_batched_tokens=16, seed=3)
    copy = DeepseekV4Attention(config, 0, max_model_len=256, max_num_batched_tokens=16,
                               state_dict=layer.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(layer.state_dict().values(), copy.state_dict().values(), strict=True))
    assert "indexer.compressor.ape" in layer.state_dict() and "compressor.wkv_wgate" in layer.state_dict()
    other = DeepseekV4Attention(config, 0, max_model_len=256, max_num_batched_tokens=16, seed=4)
    assert not torch.equal(layer.wq_b, other.wq_b)
    with pytest.raises(RuntimeError, match="Missing key"):
        DeepseekV4Attention(config, 0, max_model_len=256, max_num_batched_tokens=16,
                            state_dict={k: v for k, v in layer.state_dict().items() if k != "attn_sink"})


def test_layer_rejects_mismatched_inputs():
    harness = Harness(0, [8], max_num_batched_tokens=16)
    step = harness.stack.prepare(ScheduledBatch((0,), (8,), (8,)))
    with pytest.raises(ValueError, match=r"hidden_states must be \[8, 256\]"):
        harness.layer(torch.zeros(7, 256, dtype=torch.bfloat16), step, harness.caches)


def test_presets():
    flash_types = [LayerType.SWA_ONLY] * 2 + [LayerType.C4A if i % 2 == 0 else LayerType.C128A for i in range(2, 43)]
    assert V4_FLASH.num_hidden_layers == 43 and layer_types(V4_FLASH.compress_ratios) == flash_types
    assert (V4_FLASH.num_attention_heads, V4_FLASH.index_topk, V4_FLASH.o_groups) == (64, 512, 8)
    assert (V4_PRO.num_hidden_layers, V4_PRO.num_attention_heads, V4_PRO.index_topk) == (61, 128, 1024)
    assert (TINY.head_dim, TINY.qk_rope_head_dim, TINY.index_head_dim, TINY.sliding_window) == (512, 64, 128, 128)
    assert get_config("v4-flash") is V4_FLASH and V4_FLASH.first_layers(4).compress_ratios == (0, 0, 4, 128)
    with pytest.raises(ValueError, match=r"supported: \[.tiny., .tiny-v4.1., .v4-flash., .v4-pro., .v4.1-flash.\]"):
        get_config("v4-max")


@pytest.mark.parametrize("change, message", [
    ({"compress_ratios": (0, 8)}, "unsupported compress ratio"),
    ({"index_topk": 300}, r"index_topk must be one of \(512, 1024, 2048\)"),
    ({"o_groups": 3}, "o_groups"),
    ({"head_dim": 576}, "head_dim must be 512"),
])
def test_bad_configs(change, message):
    with pytest.raises(ValueError, match=message):
        replace(TINY, **change)


def test_config_from_hf_dict():
    hf = {"hidden_size": 4096, "num_attention_heads": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
          "compress_ratios": [0, 0, 4, 128], "index_topk": 512,
          "rope_scaling": {"factor": 16, "original_max_position_embeddings": 65536}}
    config = DeepseekV4AttentionConfig.from_hf_config(hf)
    assert config.compress_ratios == (0, 0, 4, 128) and config.rope_scaling.factor == 16


def test_cache_manager_allocates_every_kind():
    manager = PagedCacheManager(TINY, max_model_len=1024, max_num_reqs=2)
    swa_only, c4a, c128a = manager.layer_caches
    assert (swa_only.compressed, swa_only.compressor_state, swa_only.indexer_k) == (None, None, None)
    assert swa_only.swa.shape == (2 * 16, 37440)  # 64 tokens x 584 B, padded to 576 B
    assert c4a.compressed.stride(0) == 37440 and c4a.compressed_block_size == 64
    assert c4a.indexer_k.stride(0) == 8640 and c4a.compressor_state.shape[1:] == (4, 2048)
    assert c4a.indexer_state.shape[1:] == (4, 512) and c4a.compressor_state.stride(0) * 4 == 32832
    assert c128a.compressed.stride(0) == 1728 and c128a.compressed_block_size == 2
    assert c128a.compressor_state.shape[1:] == (8, 1024) and c128a.indexer_k is None
    manager.reserve(1, 300)
    table = manager.allocators[CacheGroup.SWA].block_table([1], 16)
    assert (table[0] >= 0).sum() == 5 and (table[0, 5:] == -1).all()
    assert (manager.allocators[CacheGroup.C4_STATE].block_table([1]) >= 0).sum() == 75
    with pytest.raises(ValueError, match="exceed max_model_len = 1024"):
        manager.reserve(0, 1025)
    free_before = manager.allocators[CacheGroup.C128_STATE].num_free_blocks
    manager.free(1)
    assert manager.allocators[CacheGroup.C128_STATE].num_free_blocks == free_before + 38
