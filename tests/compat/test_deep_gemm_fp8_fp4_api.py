"""dsv4.deep_gemm's unified fp8 / MXFP4 names (fp8_fp4_paged_mqa_logits, fp8_fp4_mqa_logits) and the varlen
``indices`` of the paged logits and their metadata."""

import pytest
import torch

from conftest import random_pages
from dsv4 import deep_gemm, ops
from dsv4.cache import indexer_k_page_bytes
from dsv4.reference import indexer, quant
from helpers.indexer_cases import assert_logits_match, random_fp8, random_mxfp4

BLOCK_KV, HEADS, DIM = 64, 32, 128
ENTRY_BYTES = {"fp8": DIM + 4, "mxfp4": DIM // 2 + 4}


def deepgemm_cache(num_blocks: int, key_format: str) -> torch.Tensor:
    """DeepGEMM's [num_blocks, block_kv, 1, bytes] view of valid keys on padded pages."""
    pages = random_pages(num_blocks, indexer_k_page_bytes(BLOCK_KV, key_format), 64)
    keys = torch.randn(num_blocks * BLOCK_KV, DIM)
    data, scales = quant.indexer_key_pack(keys, key_format)
    quant.indexer_key_write(pages, torch.arange(num_blocks * BLOCK_KV), BLOCK_KV, data, scales, key_format)
    return pages[:, : BLOCK_KV * ENTRY_BYTES[key_format]].view(num_blocks, BLOCK_KV, 1, ENTRY_BYTES[key_format])


def packed_int32(scale_bytes: torch.Tensor) -> torch.Tensor:
    """DeepGEMM's packed UE8M0: four scale bytes per int32 word."""
    return scale_bytes.contiguous().view(torch.int32).squeeze(-1)


def query(query_format: str, *shape: int, packed: bool = True):
    if query_format == "fp8":
        return random_fp8(*shape), None
    codes, scales = random_mxfp4(*shape)
    return codes.view(torch.int8), packed_int32(scales) if packed else scales


@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("query_format", ["fp8", "mxfp4"])
def test_paged_fp8_fp4_names_the_key_format_by_the_last_dim(isa, key_format, query_format):
    cache = deepgemm_cache(5, key_format)
    values, scales = query(query_format, 2, 1, HEADS, DIM)
    weights = torch.randn(2, HEADS)
    lens = torch.tensor([[70], [200]], dtype=torch.int32)
    table = torch.tensor([[1, 0, 3, 4], [2, 3, 0, 4]], dtype=torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 4)
    got = deep_gemm.fp8_fp4_paged_mqa_logits((values, scales), cache, weights, lens, table, meta, 210,
                                             clean_logits=True)
    q_scale = None if scales is None else scales.view(torch.uint8).reshape(2, 1, HEADS, 4)
    want = indexer.fp8_paged_mqa_logits(values.view(torch.uint8) if scales is not None else values, cache, weights,
                                        lens, table, BLOCK_KV, 210, q_scale=q_scale, key_format=key_format)
    assert_logits_match(got, want, torch.ones_like(got, dtype=torch.bool))
    assert torch.isneginf(got[0, 70:]).all() and torch.isfinite(got[1, :200]).all()


def test_paged_fp8_fp4_unpacked_scales_and_bf16_logits(isa):
    cache = deepgemm_cache(3, "mxfp4")
    packed = query("mxfp4", 1, 1, HEADS, DIM)
    unpacked = (packed[0], packed[1].view(torch.uint8).reshape(1, 1, HEADS, 4))
    args = (cache, torch.randn(1, HEADS), torch.tensor([[150]], dtype=torch.int32),
            torch.tensor([[2, 0, 1]], dtype=torch.int32), None, 150)
    a = deep_gemm.fp8_fp4_paged_mqa_logits(packed, *args, clean_logits=True)
    b = deep_gemm.fp8_fp4_paged_mqa_logits(unpacked, *args, clean_logits=True, logits_dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16 and torch.equal(a.to(torch.bfloat16), b)


def test_varlen_indices_leave_the_logits_unchanged(isa):
    """Varlen rows: one block-table row and length per query row, next_n 1, indices the request of each row."""
    cache = deepgemm_cache(6, "mxfp4")
    tokens_per_request = torch.tensor([3, 1, 2])
    indices = torch.arange(3, dtype=torch.int32).repeat_interleave(tokens_per_request)
    rows = len(indices)
    tables = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 2, 1]], dtype=torch.int32)[indices.long()]
    lens = (torch.tensor([100, 180, 60])[indices.long()] + torch.tensor([0, 1, 2, 0, 0, 1])).int()[:, None]
    q = query("mxfp4", rows, 1, HEADS, DIM)
    weights = torch.randn(rows, HEADS)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 8, indices=indices)
    plain = deep_gemm.fp8_fp4_paged_mqa_logits(q, cache, weights, lens, tables, meta, 192, clean_logits=True)
    varlen = deep_gemm.fp8_fp4_paged_mqa_logits(q, cache, weights, lens, tables, meta, 192, clean_logits=True,
                                                indices=indices)
    assert torch.equal(plain, varlen)
    with pytest.raises(ValueError, match="indices must be int32"):
        deep_gemm.fp8_fp4_paged_mqa_logits(q, cache, weights, lens, tables, meta, 192, indices=indices.long())
    with pytest.raises(ValueError, match="need next_n 1"):
        q2 = (q[0].view(rows // 2, 2, HEADS, DIM // 2), q[1].view(rows // 2, 2, HEADS))
        deep_gemm.fp8_fp4_paged_mqa_logits(q2, cache, weights, lens.view(3, 2), tables[::2], meta, 192,
                                           indices=indices[:3])
    with pytest.raises(ValueError, match="indices must be int32"):
        deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 8, indices=indices[:2])


def test_paged_fp8_fp4_rejects():
    cache = deepgemm_cache(2, "fp8")
    q = query("fp8", 1, 1, HEADS, DIM)
    base = (torch.randn(1, HEADS), torch.tensor([[5]], dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32),
            None, 10)
    with pytest.raises(ValueError, match="132 \\(fp8\\) or 68 \\(mxfp4\\)"):
        deep_gemm.fp8_fp4_paged_mqa_logits(q, cache.view(2, -1), *base)
    with pytest.raises(ValueError, match="q must be a pair"):
        deep_gemm.fp8_fp4_paged_mqa_logits(q[0], cache, *base)
    with pytest.raises(ValueError, match="q scales must be packed int32"):
        bad = query("mxfp4", 1, 1, HEADS, DIM)
        deep_gemm.fp8_fp4_paged_mqa_logits((bad[0], bad[1][..., :3]), cache, *base)
    with pytest.raises(RuntimeError, match="argument 'q' must have size 128 in dimension 3"):
        deep_gemm.fp8_fp4_paged_mqa_logits(query("fp8", 1, 1, HEADS, 64), cache, *base)


@pytest.mark.parametrize("key_format", ["fp8", "mxfp4"])
@pytest.mark.parametrize("query_format", ["fp8", "mxfp4"])
def test_ragged_fp8_fp4_and_compressed_columns(isa, key_format, query_format):
    values, scales = query(query_format, 5, HEADS, DIM)
    keys = torch.randn(40, DIM)
    if key_format == "mxfp4":
        k, k_bytes = quant.mxfp4_pack(keys)
        kv, k_ref, k_scale_ref = (k.view(torch.int8), packed_int32(k_bytes)), k, k_bytes
    else:
        k, k_scale = quant.indexer_k_pack(keys)
        kv = k_ref, k_scale_ref = (k.view(torch.float8_e4m3fn), k_scale)
    weights = torch.randn(5, HEADS)
    ks = torch.tensor([0, 3, 10, 39, 5], dtype=torch.int32)
    ke = torch.tensor([4, 20, 10, 40, 30], dtype=torch.int32)
    full = deep_gemm.fp8_fp4_mqa_logits((values, scales), kv, weights, ks, ke)
    q_scale = None if scales is None else scales.view(torch.uint8).reshape(5, HEADS, 4)
    q_values = values if scales is None else values.view(torch.uint8)
    want = ops.fp8_mqa_logits(q_values, k_ref, k_scale_ref, weights, ks, ke, q_scale=q_scale, key_format=key_format)
    assert torch.equal(full, want)
    compressed = deep_gemm.fp8_fp4_mqa_logits((values, scales), kv, weights, ks, ke, clean_logits=False,
                                              max_seqlen_k=8)
    for i in range(5):
        width = min(8, int(ke[i] - ks[i]))
        assert torch.equal(compressed[i, :width], full[i, ks[i] : ks[i] + width])
    with pytest.raises(ValueError, match="clean_logits must be False"):
        deep_gemm.fp8_fp4_mqa_logits((values, scales), kv, weights, ks, ke, clean_logits=True, max_seqlen_k=8)
