"""Paged caches carry their geometry: every op that takes one rejects a block_size, record format or query width
that contradicts the cache, before any kernel runs and without writing a byte.

A page (the bytes of dimensions 1..) must be exactly block_size entries, unpadded or padded to a multiple of 512
or 576 bytes; a view with an entry axis (``[num_blocks, block_size, ...]``) names block_size in dimension 1."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rejects, random_pages
from dsv4.cache import indexer_k_page_bytes, kv_page_bytes
from dsv4.constants import INDEXER_K_BYTES_PER_ENTRY, MODEL1_BYTES_PER_TOKEN
from dsv4.reference import OP_IMPLS
from dsv4.rope import rope_cos_sin_cache

NUM_BLOCKS = 4
ROPE = rope_cos_sin_cache(64, 64, 10000.0)


def decode_args(cache, block_size, d_qk=512, extra=None):
    q = torch.randn(1, 1, 8, d_qk).bfloat16()
    return dict(q=q, kv_cache=cache, indices=torch.tensor([[[0, 1, -1]]], dtype=torch.int32), topk_length=None,
                attn_sink=None, extra_kv_cache=extra[0] if extra else None,
                extra_indices=torch.tensor([[[0, 2]]], dtype=torch.int32) if extra else None, extra_topk_length=None,
                block_size=block_size, extra_block_size=extra[1] if extra else 0, head_dim_v=512, sm_scale=0.1,
                tile_scheduler_metadata=None, num_splits=None)


def logits_args(cache, block_size):
    return dict(q=torch.randn(2, 1, 4, 128).to(torch.float8_e4m3fn), kv_cache=cache, weights=torch.randn(2, 4),
                context_lens=torch.tensor([5, 9], dtype=torch.int32),
                block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), block_size=block_size,
                max_context_len=16, clean_logits=True, schedule_meta=None)


def topk_args(cache, block_size):
    return dict(q=torch.randn(2, 4, 128).to(torch.float8_e4m3fn), kv_cache=cache, weights=torch.randn(2, 4),
                lengths=torch.tensor([5, 9], dtype=torch.int32), block_table=torch.tensor([[0, 1]], dtype=torch.int32),
                row_requests=torch.tensor([0, 0], dtype=torch.int32), block_size=block_size,
                topk_indices=torch.full((2, 512), -7, dtype=torch.int32))


def quantize_args(cache, block_size, dim=512):
    return dict(kv=torch.randn(3, dim), slot_mapping=torch.tensor([0, 3, -1]), kv_cache=cache, block_size=block_size)


def gather_args(cache, block_size, head_dim=512):
    return dict(kv_cache=cache, slots=torch.tensor([0, 1, -1]), block_size=block_size, head_dim=head_dim)


def qnorm_args(cache, block_size):
    return dict(q=torch.randn(2, 2, 512), kv=torch.randn(2, 512), positions=torch.tensor([3, 4]),
                cos_sin_cache=ROPE, slot_mapping=torch.tensor([0, 1]), kv_cache=cache, block_size=block_size,
                eps=1e-6, q_out=torch.empty(2, 2, 512))


def indexer_k_args(cache, block_size):
    return dict(k=torch.randn(2, 128), slot_mapping=torch.tensor([0, 1]), kv_cache=cache, block_size=block_size)


def compress_args(cache, block_size, head_dim):
    ratio = 4
    return dict(state_cache=torch.randn(2, 8, 2 * 2 * head_dim), gather_slots=torch.arange(2 * ratio)[None],
                positions=torch.tensor([7]), kv_slot_mapping=torch.tensor([0]), rms_norm_weight=torch.randn(head_dim),
                rms_norm_eps=1e-6, cos_sin_cache=ROPE, kv_cache=cache, block_size=block_size, compress_ratio=ratio)


def model1_cache(block_size, pad=64):
    return random_pages(NUM_BLOCKS, kv_page_bytes(block_size), pad)


def indexer_cache(block_size, pad=64):
    return random_pages(NUM_BLOCKS, indexer_k_page_bytes(block_size), pad)


OPS = {
    "sparse_mla_decode": (torch.ops.dsv4.sparse_mla_decode, decode_args, model1_cache, 64, ()),
    "fp8_paged_mqa_logits": (torch.ops.dsv4.fp8_paged_mqa_logits, logits_args, indexer_cache, 16, ()),
    "fp8_paged_mqa_topk": (torch.ops.dsv4.fp8_paged_mqa_topk, topk_args, indexer_cache, 16, ("topk_indices",)),
    "quantize_kv_insert": (torch.ops.dsv4.quantize_kv_insert, quantize_args, model1_cache, 4, ("kv_cache",)),
    "dequantize_kv_gather": (torch.ops.dsv4.dequantize_kv_gather, gather_args, model1_cache, 4, ()),
    "qnorm_rope_kv_insert": (torch.ops.dsv4.qnorm_rope_kv_insert, qnorm_args, model1_cache, 64, ("kv_cache", "q_out")),
    "indexer_k_quant_insert": (torch.ops.dsv4.indexer_k_quant_insert, indexer_k_args, indexer_cache, 64,
                               ("kv_cache",)),
    "compress_norm_rope_store": (torch.ops.dsv4.compress_norm_rope_store,
                                 lambda c, bs: compress_args(c, bs, 512), model1_cache, 64, ("kv_cache",)),
    "compress_norm_rope_store_indexer": (torch.ops.dsv4.compress_norm_rope_store_indexer,
                                         lambda c, bs: compress_args(c, bs, 128), indexer_cache, 64, ("kv_cache",)),
}


@pytest.mark.parametrize("name", OPS)
def test_matching_geometry_runs(name):
    op, make_args, make_cache, block_size, _ = OPS[name]
    op(**make_args(make_cache(block_size), block_size))


@pytest.mark.parametrize("wrong", ["half", "double", "one more"])
@pytest.mark.parametrize("name", OPS)
def test_block_size_that_contradicts_the_cache(name, wrong):
    op, make_args, make_cache, block_size, written = OPS[name]
    given = {"half": block_size // 2, "double": 2 * block_size, "one more": block_size + 1}[wrong]
    if make_cache is indexer_cache and wrong == "one more":
        pytest.skip("a 576-padded page of 132-byte entries has room for up to 4 more: only an entry view tells")
    args = make_args(make_cache(block_size), given)
    assert_rejects(op, args, f"dsv4::{name}: argument 'kv_cache' (pages hold|has)", unchanged=written)


def test_decode_with_block_size_32_on_a_cache_written_with_64():
    args = decode_args(model1_cache(64), 32)
    assert_rejects(torch.ops.dsv4.sparse_mla_decode, args, "block_size 32 MODEL1 entries of 584 bytes")


def test_decode_extra_cache_geometry():
    extra = model1_cache(2)
    torch.ops.dsv4.sparse_mla_decode(**decode_args(model1_cache(64), 64, extra=(extra, 2)))
    args = decode_args(model1_cache(64), 64, extra=(extra, 4))
    assert_rejects(torch.ops.dsv4.sparse_mla_decode, args, "argument 'extra_kv_cache' pages hold")


def test_decode_576_wide_q_on_a_model1_cache():
    args = decode_args(model1_cache(64), 64, d_qk=576)
    assert_rejects(torch.ops.dsv4.sparse_mla_decode, args, "V32 entries of 656 bytes")


def test_gather_with_head_dim_576_on_a_model1_cache():
    # (at 4 entries both records pad to 2880 bytes: a page size that cannot tell them apart)
    assert_rejects(torch.ops.dsv4.dequantize_kv_gather, gather_args(model1_cache(64), 64, head_dim=576), "V32")


def test_quantize_insert_with_2_on_a_4_entry_cache():
    args = quantize_args(model1_cache(4), 2)
    assert_rejects(torch.ops.dsv4.quantize_kv_insert, args, "argument 'kv_cache' pages hold", unchanged=("kv_cache",))


def test_quantize_insert_of_576_wide_rows_into_a_model1_cache():
    args = quantize_args(model1_cache(64), 64, dim=576)
    assert_rejects(torch.ops.dsv4.quantize_kv_insert, args, "V32", unchanged=("kv_cache",))


def test_paged_logits_with_17_on_a_16_entry_view():
    entries = 16 * INDEXER_K_BYTES_PER_ENTRY
    pages = indexer_cache(16)[:, :entries].view(NUM_BLOCKS, 16, INDEXER_K_BYTES_PER_ENTRY)  # DeepGEMM's entry view
    torch.ops.dsv4.fp8_paged_mqa_logits(**logits_args(pages, 16))
    assert_rejects(torch.ops.dsv4.fp8_paged_mqa_logits, logits_args(pages, 17), "has 16 entries per page")


def test_paged_logits_with_17_on_an_unpadded_16_entry_page():
    pages = random_pages(NUM_BLOCKS, 16 * INDEXER_K_BYTES_PER_ENTRY)
    assert_rejects(torch.ops.dsv4.fp8_paged_mqa_logits, logits_args(pages, 17), "pages hold 2112 bytes")


@pytest.mark.parametrize("alignment", [1, 512, 576])
def test_unpadded_and_engine_padded_pages_are_accepted(alignment):
    block_size = 64
    raw = block_size * MODEL1_BYTES_PER_TOKEN
    cache = random_pages(NUM_BLOCKS, -(-raw // alignment) * alignment, 128)
    torch.ops.dsv4.sparse_mla_decode(**decode_args(cache, block_size))


def test_flash_mla_view_names_its_block_size():
    cache = model1_cache(64, pad=0)[:, : 64 * MODEL1_BYTES_PER_TOKEN].view(NUM_BLOCKS, 64, 1, MODEL1_BYTES_PER_TOKEN)
    torch.ops.dsv4.sparse_mla_decode(**decode_args(cache, 64))
    assert_rejects(torch.ops.dsv4.sparse_mla_decode, decode_args(cache, 32), "has 64 entries per page")


def test_a_page_with_room_for_more_is_rejected():
    cache = random_pages(NUM_BLOCKS, kv_page_bytes(64) + 576)  # room for the next alignment step: not this block size
    assert_rejects(torch.ops.dsv4.sparse_mla_decode, decode_args(cache, 64), "pages hold 38016 bytes")


# The reference adapters (what stands in for a missing native kernel) hold caches to the same geometry.
REFERENCE_OPS = {
    "sparse_mla_decode": (OP_IMPLS["sparse_mla_decode"], decode_args, model1_cache, 64),
    "fp8_paged_mqa_logits": (OP_IMPLS["fp8_paged_mqa_logits"], logits_args, indexer_cache, 16),
}


@pytest.mark.parametrize("name", REFERENCE_OPS)
def test_reference_adapters_check_the_same_geometry(name):
    op, make_args, make_cache, block_size = REFERENCE_OPS[name]
    op(**make_args(make_cache(block_size), block_size))
    for given in (block_size // 2, 2 * block_size):
        with pytest.raises(RuntimeError, match=f"dsv4::{name}: argument 'kv_cache' must have pages of"):
            op(**make_args(make_cache(block_size), given))
    view = make_cache(block_size, pad=0)[:, : block_size * ENTRY_BYTES[name]]
    view = view.view(NUM_BLOCKS, block_size, ENTRY_BYTES[name])
    with pytest.raises(RuntimeError, match=f"dsv4::{name}: argument 'kv_cache' must have {block_size - 1} entries"):
        op(**make_args(view, block_size - 1))


ENTRY_BYTES = {"sparse_mla_decode": MODEL1_BYTES_PER_TOKEN, "fp8_paged_mqa_logits": INDEXER_K_BYTES_PER_ENTRY}
