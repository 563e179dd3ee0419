"""Indexer cases shared by the indexer tests (logits, fused top-k, CUDA): random fp8 q, valid random K caches, paged
logits inputs, and the logits comparison."""

from __future__ import annotations

import torch

from conftest import random_pages
from dsv4.cache import indexer_k_page_bytes
from dsv4.constants import INDEXER_HEAD_DIM
from dsv4.reference import quant

HEAD_DIM = INDEXER_HEAD_DIM
# The kernels sum the head dots in another order than the reference: fp32 rounding noise, relative to the row.
RELATIVE_TOL = 1e-5


def random_fp8(*shape: int) -> torch.Tensor:
    """e4m3 values of mixed magnitudes (normal and subnormal codes, both signs, no NaN)."""
    values = torch.randn(shape) * torch.exp2(torch.randint(-8, 5, shape).float())
    return values.clamp(-448, 448).to(torch.float8_e4m3fn)


def indexer_cache(num_blocks: int, block_size: int, pad_bytes: int, key_format: str = "fp8") -> torch.Tensor:
    """A random-byte indexer K cache whose entries all hold valid keys: e4m3 codes and positive power-of-two scales
    (fp8), or e2m1 codes and UE8M0 bytes of mixed magnitudes (mxfp4)."""
    cache = random_pages(num_blocks, indexer_k_page_bytes(block_size, key_format), pad_bytes)
    keys = torch.randn(num_blocks * block_size, HEAD_DIM) * torch.rand(num_blocks * block_size, 1) * 4
    if key_format == "mxfp4":  # blocks of different scales within a key
        keys = keys * torch.exp2(torch.randint(-6, 4, (keys.shape[0], HEAD_DIM // 32))).repeat_interleave(32, dim=1)
    data, scales = quant.indexer_key_pack(keys, key_format)
    quant.indexer_key_write(cache, torch.arange(num_blocks * block_size), block_size, data, scales, key_format)
    return cache


def random_mxfp4(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(e2m1 pairs uint8 [*shape[:-1], D/2], UE8M0 bytes [*shape[:-1], D/32]) of values of mixed magnitudes."""
    values = torch.randn(shape) * torch.exp2(torch.randint(-8, 5, (*shape[:-1], shape[-1] // 32)).float()
                                             ).repeat_interleave(32, dim=-1)
    return quant.mxfp4_pack(values)


def random_query(query_format: str, *shape: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(q, q_scale) of one query format: e4m3 q and None, or mxfp4 codes and their scale bytes."""
    if query_format == "mxfp4":
        return random_mxfp4(*shape)
    return random_fp8(*shape), None


def assert_logits_match(got: torch.Tensor, want: torch.Tensor, valid: torch.Tensor) -> None:
    """Equal -inf pattern and values within fp32 summation noise where ``valid`` (all of it when cleaning)."""
    assert got.shape == want.shape
    g, w = got[valid], want[valid]
    assert torch.equal(torch.isneginf(g), torch.isneginf(w))
    finite = ~torch.isneginf(w)
    if finite.any():
        scale = w[finite].abs().max()
        assert (g[finite] - w[finite]).abs().max() <= RELATIVE_TOL * scale + 1e-6


def paged_case(batch, next_n, heads, block_size, lens, lens_2d, pad_bytes=0, index_dtype=torch.int32, holes=False,
               pool=None):
    """pool: every page drawn from that many blocks (shared across rows, cheap to build) instead of its own."""
    max_len = int(max(lens)) + 3
    pages_per_req = (max_len + block_size - 1) // block_size
    num_blocks = pool or batch * pages_per_req + 1
    cache = indexer_cache(num_blocks, block_size, pad_bytes)
    if pool:
        table = torch.randint(0, pool, (batch, pages_per_req)).to(index_dtype)
    else:
        table = (torch.randperm(num_blocks)[: batch * pages_per_req].view(batch, pages_per_req)).to(index_dtype)
    if holes:  # missing pages: -1 and past the cache
        table[0, 0] = -1
        table[-1, -1] = num_blocks + 5
    ctx = torch.tensor(lens, dtype=index_dtype)
    if lens_2d:
        ctx = (ctx[:, None] - next_n + 1 + torch.arange(next_n)).clamp(min=0).to(index_dtype)
    q = random_fp8(batch, next_n, heads, HEAD_DIM)
    weights = torch.randn(batch * next_n, heads)
    return q, cache, weights, ctx, table, block_size, max_len


def paged_format_case(batch, next_n, heads, block_size, lens, key_format, query_format, lens_2d=False, holes=True,
                      index_dtype=torch.int32):
    """paged_case's arguments over a cache of key_format with queries of query_format: (args, q_scale)."""
    max_len = int(max(lens)) + 3
    pages_per_req = (max_len + block_size - 1) // block_size
    num_blocks = batch * pages_per_req + 1
    cache = indexer_cache(num_blocks, block_size, 24, key_format)
    table = torch.randperm(num_blocks)[: batch * pages_per_req].view(batch, pages_per_req).to(index_dtype)
    if holes:
        table[0, 0] = -1
        table[-1, -1] = num_blocks + 5
    ctx = torch.tensor(lens, dtype=index_dtype)
    if lens_2d:
        ctx = (ctx[:, None] - next_n + 1 + torch.arange(next_n)).clamp(min=0).to(index_dtype)
    q, q_scale = random_query(query_format, batch, next_n, heads, HEAD_DIM)
    weights = torch.randn(batch * next_n, heads)
    return (q, cache, weights, ctx, table, block_size, max_len), q_scale


def row_valid_mask(ctx: torch.Tensor, next_n: int, max_len: int) -> torch.Tensor:
    lens = ctx.long() if ctx.dim() == 2 else ctx.long()[:, None] - next_n + 1 + torch.arange(next_n)
    return torch.arange(max_len)[None, :] < lens.reshape(-1, 1).clamp(0, max_len)
