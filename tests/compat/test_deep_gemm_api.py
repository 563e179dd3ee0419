"""dsv4.deep_gemm: DeepGEMM's signatures and conventions on top of the dsv4 indexer ops."""

import pytest
import torch

from conftest import random_pages
from dsv4 import deep_gemm, ops
from dsv4.cache import indexer_k_page_bytes
from dsv4.reference import quant

BLOCK_KV, HEADS, DIM = 64, 8, 128


def fp8(*shape):
    return (torch.randn(shape) * 4).to(torch.float8_e4m3fn)


def deepgemm_cache(num_blocks: int) -> torch.Tensor:
    pages = random_pages(num_blocks, indexer_k_page_bytes(BLOCK_KV), 64)
    codes, scales = quant.indexer_k_pack(torch.randn(num_blocks * BLOCK_KV, DIM))
    quant.indexer_k_write(pages, torch.arange(num_blocks * BLOCK_KV), BLOCK_KV, codes, scales)
    return pages[:, : BLOCK_KV * (DIM + 4)].view(num_blocks, BLOCK_KV, 1, DIM + 4)


def test_paged_logits_uses_the_4d_view_block_size(isa):
    cache = deepgemm_cache(4)
    q = fp8(2, 1, HEADS, DIM)
    weights = torch.randn(2, HEADS)
    lens = torch.tensor([[70], [130]], dtype=torch.int32)
    table = torch.tensor([[1, 0, 3], [2, 3, 0]], dtype=torch.int32)
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 4)
    got = deep_gemm.fp8_paged_mqa_logits(q, cache, weights, lens, table, meta, 150, clean_logits=True)
    want = ops.fp8_paged_mqa_logits(q, cache, weights, lens, table, BLOCK_KV, 150, clean_logits=True)
    assert torch.equal(got, want)
    assert torch.isneginf(got[0, 70:]).all() and torch.isfinite(got[1, :130]).all()


def test_paged_logits_rejects_a_2d_cache():
    with pytest.raises(ValueError, match="kv_cache must be"):
        deep_gemm.fp8_paged_mqa_logits(fp8(1, 1, HEADS, DIM), torch.zeros(2, 8448, dtype=torch.uint8),
                                       torch.randn(1, HEADS), torch.tensor([3]), torch.zeros(1, 1, dtype=torch.int32),
                                       torch.zeros(1, 2, dtype=torch.int32), 4)


def test_metadata_splits_segments_evenly():
    lens = torch.tensor([0, 300, 1000, 256], dtype=torch.int32)  # 0 + 2 + 4 + 1 segments of 256
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, BLOCK_KV, 2)
    assert meta.dtype == torch.int32 and meta.shape == (3, 2)
    assert meta.tolist() == [[1, 0], [2, 1], [4, 0]]  # segment 0 of row 1, segment 1 of row 2, end
    assert deep_gemm.get_paged_mqa_logits_metadata(torch.zeros(3, dtype=torch.int32), 64, 4).shape == (5, 2)


def test_ragged_logits_and_compressed_columns(isa):
    q, k = fp8(5, HEADS, DIM), fp8(40, DIM)
    k_scale, weights = torch.rand(40) + 0.5, torch.randn(5, HEADS)
    ks = torch.tensor([0, 3, 10, 39, 5], dtype=torch.int32)
    ke = torch.tensor([4, 20, 10, 40, 30], dtype=torch.int32)
    full = deep_gemm.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke)
    assert torch.equal(full, ops.fp8_mqa_logits(q, k, k_scale, weights, ks, ke))
    compressed = deep_gemm.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke, clean_logits=False, max_seqlen_k=8)
    assert compressed.shape == (5, 8)
    for i in range(5):
        width = min(8, int(ke[i] - ks[i]))
        assert torch.equal(compressed[i, :width], full[i, ks[i] : ks[i] + width])
    assert torch.isneginf(compressed[3, 1:]).all()  # positions past N
    with pytest.raises(ValueError, match="clean_logits must be False"):
        deep_gemm.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke, clean_logits=True, max_seqlen_k=8)
