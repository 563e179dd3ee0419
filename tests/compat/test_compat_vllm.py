"""dsv4.compat.vllm_cpu maps vLLM's argument orders and return conventions onto dsv4.ops exactly.

Each case calls the compat function and the dsv4 op it stands for on the same inputs and asks for
identical results; the byte parity with vLLM itself is in test_peer_vllm.py.
"""

from __future__ import annotations

import pytest
import torch

from conftest import clone_storage, distinct_slots, random_pages, rope_table, storage_bytes
from dsv4 import ops
from dsv4.cache import indexer_k_page_bytes, kv_page_bytes
from dsv4.compat import vllm_cpu as compat
from dsv4.constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM, ROPE_DIM

BLOCK_SIZE = 64
NUM_BLOCKS = 3
ROPE_ROWS = 512
EPS = 1e-6
TOPK = compat.VLLM_TOPK
UNTOUCHED = -7  # fill value of output columns the op must not write
SKIP_EVERY = 4  # every fourth slot is -1: each case both writes and skips


def model1_pages() -> torch.Tensor:
    return random_pages(NUM_BLOCKS, kv_page_bytes(BLOCK_SIZE), pad_bytes=64)


def assert_same_writes(cache_compat: torch.Tensor, cache_ops: torch.Tensor, before: torch.Tensor) -> None:
    """Both paths left identical bytes (padding included), and the case did write something."""
    assert torch.equal(storage_bytes(cache_compat), storage_bytes(cache_ops))
    assert not torch.equal(storage_bytes(cache_compat), storage_bytes(before))


def test_fused_qnorm_rope_kv_insert_cpu():
    tokens, heads, padded_heads = 9, 4, 8
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    kv = torch.randn(tokens + 2, MODEL1_HEAD_DIM).bfloat16()
    positions = torch.randint(0, ROPE_ROWS, (tokens,))
    slots = distinct_slots(tokens - 1, NUM_BLOCKS * BLOCK_SIZE, skip_every=SKIP_EVERY)
    cos_sin = rope_table(ROPE_ROWS)
    cache_compat = model1_pages()
    cache_ops, before = clone_storage(cache_compat), clone_storage(cache_compat)
    got = compat.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, cache_compat, slots, cos_sin, padded_heads, EPS,
                                                BLOCK_SIZE)
    want = ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, cache_ops, BLOCK_SIZE, EPS,
                                    padded_heads=padded_heads)
    assert got.shape == (tokens, padded_heads, MODEL1_HEAD_DIM) and got.dtype == q.dtype
    assert torch.equal(got, want)
    assert_same_writes(cache_compat, cache_ops, before)


def test_fused_indexer_q_rope_quant_cpu():
    tokens, heads = 5, 8
    positions = torch.randint(0, ROPE_ROWS, (tokens,))
    index_q = torch.randn(tokens, heads, INDEXER_HEAD_DIM) * 3
    weights = torch.randn(tokens, heads)
    cos_sin = rope_table(ROPE_ROWS)
    softmax_scale, head_scale = 0.25, 0.5
    q_fp8 = torch.empty(tokens, heads, INDEXER_HEAD_DIM, dtype=torch.float8_e4m3fn)
    weights_out = torch.empty(tokens, heads)
    assert compat.fused_indexer_q_rope_quant_cpu(positions, index_q, cos_sin, q_fp8, weights, softmax_scale,
                                                 head_scale, weights_out) is None
    want_q, want_w = ops.indexer_q_rope_quant(index_q, positions, cos_sin, weights, softmax_scale, head_scale)
    assert torch.equal(q_fp8.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(weights_out, want_w)


def test_save_partial_states_cpu():
    tokens, width, ratio = 6, 256, 4
    kv, score = torch.randn(tokens, width), torch.randn(tokens, width)
    ape = torch.randn(ratio, width)
    positions = torch.randint(0, 100, (tokens,))
    slots = distinct_slots(tokens, 2 * 8, skip_every=SKIP_EVERY)
    state_compat = torch.randn(2, 8, 2 * width)
    state_ops = state_compat.clone()
    compat.save_partial_states_cpu(kv, score, ape, positions, state_compat, slots)
    ops.save_partial_states(kv, score, ape, positions, state_ops, slots)
    assert torch.equal(state_compat, state_ops)


@pytest.mark.parametrize("head_dim", [MODEL1_HEAD_DIM, INDEXER_HEAD_DIM])
def test_compress_norm_rope_store_cpu(head_dim):
    tokens, ratio, coff = 6, 4, 2
    state = torch.randn(2, 16, 2 * coff * head_dim)
    gather = torch.randint(0, 32, (tokens, coff * ratio))
    positions = torch.arange(tokens) * ratio + ratio - 1
    kv_slots = distinct_slots(tokens, NUM_BLOCKS * BLOCK_SIZE, skip_every=SKIP_EVERY)
    norm_weight = torch.rand(head_dim) + 0.5
    cos_sin = rope_table(ROPE_ROWS)
    if head_dim == MODEL1_HEAD_DIM:
        compat_fn, ops_fn, pages = compat.compress_norm_rope_store_cpu, ops.compress_norm_rope_store, model1_pages()
    else:
        compat_fn, ops_fn = compat.compress_norm_rope_store_indexer_cpu, ops.compress_norm_rope_store_indexer
        pages = random_pages(NUM_BLOCKS, indexer_k_page_bytes(BLOCK_SIZE), pad_bytes=32)
    cache_compat, cache_ops, before = pages, clone_storage(pages), clone_storage(pages)
    args = (state, gather, positions, kv_slots, norm_weight, EPS, cos_sin)
    compat_fn(*args, cache_compat, BLOCK_SIZE, ratio)
    ops_fn(*args, cache_ops, BLOCK_SIZE, ratio)
    assert_same_writes(cache_compat, cache_ops, before)


def test_inverse_gptj_rope_o_proj_cpu():
    o = torch.randn(5, 3, MODEL1_HEAD_DIM).bfloat16()
    positions = torch.randint(0, ROPE_ROWS, (5,))
    cos_sin = rope_table(ROPE_ROWS)
    got = compat.inverse_gptj_rope_o_proj_cpu(o, positions, cos_sin, ROPE_DIM)
    assert got.dtype == torch.float32 and got.shape == o.shape
    assert torch.equal(got, ops.inverse_rope(o, positions, cos_sin, out_dtype=torch.float32))
    with pytest.raises(ValueError, match="rope_dim"):
        compat.inverse_gptj_rope_o_proj_cpu(o, positions, cos_sin, ROPE_DIM // 2)


def test_fp8_paged_mqa_logits_cpu():
    rows, heads, max_seq_len = 3, 4, 2 * BLOCK_SIZE + 9
    cache = random_pages(NUM_BLOCKS, indexer_k_page_bytes(BLOCK_SIZE), pad_bytes=16)
    capacity = NUM_BLOCKS * BLOCK_SIZE
    ops.indexer_k_quant_insert(torch.randn(capacity, INDEXER_HEAD_DIM), torch.arange(capacity), cache, BLOCK_SIZE)
    q_fp8 = torch.randn(rows, heads, INDEXER_HEAD_DIM).to(torch.float8_e4m3fn)
    weights = torch.randn(rows, heads)
    seq_lens = torch.tensor([1, BLOCK_SIZE + 3, max_seq_len], dtype=torch.int32)
    page_table = torch.stack([torch.randperm(NUM_BLOCKS) for _ in range(rows)]).int()
    got = compat.fp8_paged_mqa_logits_cpu(q_fp8, cache, weights, seq_lens, page_table, BLOCK_SIZE, max_seq_len)
    want = ops.fp8_paged_mqa_logits(q_fp8.unsqueeze(1), cache, weights, seq_lens, page_table, BLOCK_SIZE,
                                    max_seq_len, clean_logits=True)
    assert got.shape == (rows, max_seq_len) and got.dtype == torch.float32
    valid = torch.isfinite(want)
    assert valid.sum(1).tolist() == seq_lens.tolist()
    assert torch.equal(got[valid], want[valid])


@pytest.mark.parametrize("with_raw", [True, False])
def test_topk_transform_512_cpu(with_raw):
    page_size, width = 16, 1200
    seq_lens = torch.tensor([0, 7, TOPK, TOPK + 1, width, width + 30])
    rows = seq_lens.numel()
    scores = torch.randn(rows, width)
    page_tables = torch.stack([torch.randperm(200)[: width // page_size] for _ in range(rows)])
    out_page = torch.full((rows, TOPK + 4), UNTOUCHED, dtype=torch.int32)
    out_raw = torch.full_like(out_page, UNTOUCHED) if with_raw else None
    assert compat.topk_transform_512_cpu(scores, seq_lens, page_tables, out_page, page_size, out_raw) is None
    want_raw, want_slots = ops.topk_transform(scores, seq_lens.clamp(max=width), TOPK, page_table=page_tables,
                                              page_size=page_size)
    assert torch.equal(out_page[:, :TOPK], want_slots)
    assert (out_page[:, TOPK:] == UNTOUCHED).all()
    if with_raw:
        assert torch.equal(out_raw[:, :TOPK], want_raw)
        assert (out_raw[:, TOPK:] == UNTOUCHED).all()


@pytest.mark.parametrize("compressed_count", [0, 12])
def test_flash_mla_with_kvcache_cpu(compressed_count):
    tokens, heads, window = 3, 4, 16
    window_block_size, compressed_block_size = BLOCK_SIZE, 16
    window_cache = random_pages(NUM_BLOCKS, kv_page_bytes(window_block_size), pad_bytes=576)
    compressed_cache = random_pages(2, kv_page_bytes(compressed_block_size))
    for cache, block_size in ((window_cache, window_block_size), (compressed_cache, compressed_block_size)):
        capacity = cache.shape[0] * block_size
        ops.quantize_kv_insert(torch.randn(capacity, MODEL1_HEAD_DIM), torch.arange(capacity), cache, block_size)
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    window_slots = torch.randint(-1, NUM_BLOCKS * window_block_size, (tokens, window))
    compressed_slots = torch.randint(-1, 2 * compressed_block_size, (tokens, compressed_count))
    attn_sink = torch.randn(heads)
    scale = 0.05
    out = torch.full_like(q, float("nan"))
    assert compat.flash_mla_with_kvcache_cpu(out, q, window_cache, window_slots, window_block_size, compressed_cache,
                                             compressed_slots, compressed_block_size, attn_sink, scale) is None
    extra = {"extra_kv_cache": compressed_cache, "extra_indices": compressed_slots.unsqueeze(1),
             "extra_block_size": compressed_block_size} if compressed_count else {}
    want, _ = ops.sparse_mla_decode(q.unsqueeze(1), window_cache, window_slots.unsqueeze(1), window_block_size,
                                    attn_sink=attn_sink, sm_scale=scale, **extra)
    assert torch.equal(out, want.squeeze(1))
