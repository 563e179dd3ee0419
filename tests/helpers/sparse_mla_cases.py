"""Sparse MLA test inputs (not a test file): FlashMLA-style decode and prefill cases, NaN-poisoned caches, the
comparison against the reference, and the switch between the default subset and the full grid.

Caches hold real rows only at the slots some valid entry attends; every other byte decodes to NaN, so a kernel
that reads an entry it must skip (-1, outside the cache, at or past the length) produces NaN and fails.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pytest
import torch

from conftest import random_pages
from dsv4.cache import KV_LAYOUTS, kv_page_bytes
from dsv4.constants import MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, V32_BYTES_PER_TOKEN, V32_HEAD_DIM
from dsv4.reference import quant, sparse_mla

FULL_GRID_ENV = "DSV4_FULL_GRID"  # =1 runs the whole grid (as does selecting the slow marker: -m slow)
LAYOUTS = {MODEL1_HEAD_DIM: "model1", V32_HEAD_DIM: "v32"}
WRITERS = {MODEL1_HEAD_DIM: quant.model1_write, V32_HEAD_DIM: quant.v32_write}
NAN_BYTE = 0xFF  # e4m3 code and UE8M0 scale byte that both decode to NaN
KV_SPREAD = 0.3  # keeps scores O(1) so the softmax weights spread over many entries
PAD_BYTES = 64  # page stride beyond the page: the kernels must honour stride(0)
OUT_TOL = 1e-2  # bf16 output, atol and rtol (FlashMLA's and SGLang's tolerance)
LSE_TOL = 5e-3  # lse and max_logits on finite entries, atol and rtol
INVALID_FRACTION = 0.2  # entries replaced by -1, a negative id or an id past the cache
SPLIT_THREADS = (1, 2, 3, 8)  # intra-op thread counts: a single query's entries split 1, 2, 3 and 8 ways
D_V = sparse_mla.HEAD_DIM_V


def require_full_grid(request) -> None:
    if os.environ.get(FULL_GRID_ENV) != "1" and "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"full grid: set {FULL_GRID_ENV}=1 or select -m slow")


# FlashMLA's decode tolerances against a reference on the dequantized cache (the V4.1 tests hold to them)
FLASHMLA_OUT_ATOL, FLASHMLA_OUT_RTOL, FLASHMLA_COSINE_DIFF = 1e-3, 2.01 / 128, 5e-6
FLASHMLA_LSE_ATOL, FLASHMLA_LSE_RTOL = 1e-6, 8.01 / 65536


def poisoned_cache(d_qk: int, num_blocks: int, block_size: int, written: torch.Tensor, layout: str | None = None,
                   placement: str = "page_split") -> torch.Tensor:
    """A cache with random rows at the ``written`` slots and NaN everywhere else, padded pages (``layout``: the
    record, by default the one d_qk names)."""
    layout = layout or LAYOUTS[d_qk]
    cache = random_pages(num_blocks, kv_page_bytes(block_size, layout, placement), PAD_BYTES)
    cache.fill_(NAN_BYTE)
    slots = torch.unique(written.long())
    quant.write_records(cache, slots, block_size, torch.randn(len(slots), d_qk) * KV_SPREAD, layout, placement)
    return cache


def random_indices(shape, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """Slot ids in [0, capacity) (duplicates included), about INVALID_FRACTION of them invalid in some way."""
    idx = torch.randint(0, capacity, shape)
    kind = torch.rand(shape)
    idx[kind < INVALID_FRACTION / 2] = -1
    idx[(kind >= INVALID_FRACTION / 2) & (kind < 3 * INVALID_FRACTION / 4)] = capacity + 3
    idx[(kind >= 3 * INVALID_FRACTION / 4) & (kind < INVALID_FRACTION)] = -5
    return idx.to(dtype)


def valid_mask(indices: torch.Tensor, capacity: int, lengths: torch.Tensor | None) -> torch.Tensor:
    valid = (indices >= 0) & (indices < capacity)
    if lengths is not None:
        valid &= torch.arange(indices.shape[-1]) < lengths.long().reshape(-1, *[1] * (indices.dim() - 1))
    return valid


@dataclass(frozen=True)
class DecodeCase:
    d_qk: int = MODEL1_HEAD_DIM
    b: int = 2
    s_q: int = 1
    h_q: int = 16
    topk: int = 64
    page: int = 64
    extra_topk: int | None = None  # None: no extra cache
    extra_page: int = 64
    topk_length: bool = False
    extra_topk_length: bool = False
    sink: bool = True
    index_dtype: torch.dtype = torch.int32
    layout: str = "auto"  # the records of the two caches (sparse_mla.decode_records)
    extra_layout: str = "auto"
    placement: str = "page_split"

    def __str__(self) -> str:
        extra = f"+{self.extra_topk}p{self.extra_page}" if self.extra_topk is not None else ""
        flags = "".join(c for c, on in (("L", self.topk_length), ("E", self.extra_topk_length), ("S", self.sink)) if on)
        records = "" if self.layout == "auto" else f"{self.layout}+{self.extra_layout}-{self.placement}-"
        return (f"{records}d{self.d_qk}-b{self.b}-s{self.s_q}-h{self.h_q}-k{self.topk}p{self.page}{extra}-"
                f"{flags or 'plain'}-{str(self.index_dtype).removeprefix('torch.')}")


def lengths_for(b: int, topk: int) -> torch.Tensor:
    """Per-batch lengths from 0 to past topk (0 and topk + 5 always present when b allows)."""
    lengths = torch.randint(0, topk + 1, (b,))
    lengths[0] = topk + 5
    if b > 1:
        lengths[1] = 0
    return lengths.to(torch.int32)


def index_set(d_qk: int, b: int, s_q: int, topk: int, page: int, with_length: bool, dtype: torch.dtype,
              layout: str | None = None, placement: str = "page_split"):
    """(cache, indices, lengths) with about 2 * topk distinct slots of capacity; NaN where nothing attends."""
    num_blocks = max(2, math.ceil(2 * topk / page))
    capacity = num_blocks * page
    indices = random_indices((b, s_q, topk), capacity, dtype)
    lengths = lengths_for(b, topk).to(dtype) if with_length else None
    written = indices[valid_mask(indices, capacity, lengths)]
    return poisoned_cache(d_qk, num_blocks, page, written, layout, placement), indices, lengths


def decode_inputs(case: DecodeCase) -> dict:
    """Keyword arguments of dsv4.ops.sparse_mla_decode (and of the reference) for a case."""
    main, extra = sparse_mla.decode_records(case.d_qk, case.layout, case.extra_layout)
    cache, indices, lengths = index_set(case.d_qk, case.b, case.s_q, case.topk, case.page, case.topk_length,
                                        case.index_dtype, main, case.placement)
    args = dict(q=(torch.randn(case.b, case.s_q, case.h_q, case.d_qk)).bfloat16(), kv_cache=cache, indices=indices,
                block_size=case.page, topk_length=lengths, sm_scale=case.d_qk**-0.5)
    if case.layout != "auto":
        args.update(layout=main, extra_layout=extra, placement=case.placement)
    if case.sink:  # finite sinks of both signs plus the two infinities
        sink = torch.randn(case.h_q) * 2
        sink[1::5] = math.inf
        sink[3::5] = -math.inf
        args["attn_sink"] = sink
    if case.extra_topk is not None:
        extra_cache, extra_indices, extra_lengths = index_set(case.d_qk, case.b, case.s_q, case.extra_topk,
                                                              case.extra_page, case.extra_topk_length,
                                                              case.index_dtype, extra, case.placement)
        args.update(extra_kv_cache=extra_cache, extra_indices=extra_indices, extra_topk_length=extra_lengths,
                    extra_block_size=case.extra_page)
    return args


def assert_attention_close(out, lse, ref_out, ref_lse, max_logits=None, ref_max_logits=None, *,
                           flashmla: bool = False) -> None:
    """Outputs within OUT_TOL, lse (and max_logits) within LSE_TOL where finite (``flashmla``: FlashMLA's decode
    tolerances and cosine difference); exact zeros / infinities where the reference has them (empty queries, +inf
    sinks)."""
    assert out.dtype == torch.bfloat16 and out.shape == ref_out.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape and lse.is_contiguous()
    assert not out.isnan().any() and not lse.isnan().any(), "NaN leaked from an entry that must not be read"
    out_atol, out_rtol = (FLASHMLA_OUT_ATOL, FLASHMLA_OUT_RTOL) if flashmla else (OUT_TOL, OUT_TOL)
    lse_atol, lse_rtol = (FLASHMLA_LSE_ATOL, FLASHMLA_LSE_RTOL) if flashmla else (LSE_TOL, LSE_TOL)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=out_atol, rtol=out_rtol)
    if flashmla and ref_out.abs().sum() > 0:
        a, b = out.double().flatten(), ref_out.double().flatten()
        cosine_diff = 1 - 2 * (a * b).sum() / max((a * a + b * b).sum(), 1e-12)
        assert cosine_diff < FLASHMLA_COSINE_DIFF, f"cosine difference {cosine_diff:.3g}"
    zero_rows = (ref_out == 0).all(-1)
    assert (out[zero_rows] == 0).all(), "empty queries and +inf sinks must give exact zeros"
    pairs = [(lse, ref_lse)] + ([(max_logits, ref_max_logits)] if max_logits is not None else [])
    for got, want in pairs:
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got[got.isinf()], want[want.isinf()])
        finite = torch.isfinite(want)
        torch.testing.assert_close(got[finite], want[finite], atol=lse_atol, rtol=lse_rtol)


def reference_decode(args: dict):
    return sparse_mla.sparse_mla_decode(**args)


def decode_grid() -> list[DecodeCase]:
    """The FlashMLA-style grid: every (layout, b, s_q, h_q) with the other axes cycled through their values."""
    topk_pages = [(64, 2), (128, 61), (512, 64), (576, 69), (1024, 256)]
    extras = [None, (128, 64), (576, 2), (64, 69), (512, 61)]
    flags = [(False, False, True), (True, False, True), (True, True, False), (False, True, True)]
    cases = []
    for d_qk in LAYOUTS:
        for b in (1, 4, 74):
            for s_q in (1, 2, 3):
                for h_q in (1, 16, 64, 128):
                    i = len(cases)
                    topk, page = topk_pages[i % len(topk_pages)]
                    extra = extras[(i // len(topk_pages)) % len(extras)]
                    topk_length, extra_topk_length, sink = flags[i % len(flags)]
                    cases.append(DecodeCase(d_qk, b, s_q, h_q, topk, page, extra[0] if extra else None,
                                            extra[1] if extra else 64, topk_length, extra_topk_length and bool(extra),
                                            sink, (torch.int32, torch.int64)[i % 2]))
    return cases


# The default run's representative subset: both layouts, both index dtypes, every page size, extra on and off,
# each length flag, sinks, odd head counts and a topk that is not a multiple of 64.
DEFAULT_DECODE_CASES = [
    DecodeCase(MODEL1_HEAD_DIM, b=4, s_q=2, h_q=64, topk=128, page=61, extra_topk=64, extra_page=2, topk_length=True,
               extra_topk_length=True),
    DecodeCase(MODEL1_HEAD_DIM, b=1, s_q=1, h_q=128, topk=512, page=256, extra_topk=128, extra_page=64,
               index_dtype=torch.int64),
    DecodeCase(MODEL1_HEAD_DIM, b=3, s_q=3, h_q=1, topk=100, page=69, topk_length=True, sink=False),
    DecodeCase(V32_HEAD_DIM, b=2, s_q=2, h_q=16, topk=576, page=64, topk_length=True, index_dtype=torch.int64),
    DecodeCase(V32_HEAD_DIM, b=1, s_q=1, h_q=24, topk=37, page=2, extra_topk=64, extra_page=69, extra_topk_length=True),
]


@dataclass(frozen=True)
class PrefillCase:
    d_qk: int = MODEL1_HEAD_DIM
    s_q: int = 4
    h_q: int = 16
    s_kv: int = 100
    topk: int = 64
    topk_length: bool = False
    sink: bool = True
    index_dtype: torch.dtype = torch.int32

    def __str__(self) -> str:
        flags = "".join(c for c, on in (("L", self.topk_length), ("S", self.sink)) if on)
        return (f"d{self.d_qk}-s{self.s_q}-h{self.h_q}-kv{self.s_kv}-k{self.topk}-{flags or 'plain'}-"
                f"{str(self.index_dtype).removeprefix('torch.')}")


def q_off_16_bytes(q: torch.Tensor) -> torch.Tensor:
    """The same values as q in a view whose rows start 2 bytes past a 16-byte boundary (one bf16 element in)."""
    wide = torch.randn(*q.shape[:-1], q.shape[-1] + 1).bfloat16()
    wide[..., 1:] = q
    return wide[..., 1:]


def prefill_inputs(case: PrefillCase) -> dict:
    """Keyword arguments of dsv4.ops.sparse_mla_prefill (and of the reference): kv rows that no valid index
    reads are NaN, and kv is a row-strided view."""
    indices = random_indices((case.s_q, 1, case.topk), case.s_kv, case.index_dtype)
    lengths = lengths_for(case.s_q, case.topk).to(case.index_dtype) if case.topk_length else None
    read = torch.unique(indices[:, 0][valid_mask(indices[:, 0], case.s_kv, lengths)].long())
    wide = torch.full((case.s_kv, 1, case.d_qk + PAD_BYTES), math.nan).bfloat16()
    wide[read, :, : case.d_qk] = (torch.randn(len(read), 1, case.d_qk) * KV_SPREAD).bfloat16()
    args = dict(q=torch.randn(case.s_q, case.h_q, case.d_qk).bfloat16(), kv=wide[..., : case.d_qk], indices=indices,
                sm_scale=case.d_qk**-0.5, topk_length=lengths)
    if case.sink:
        sink = torch.randn(case.h_q) * 2
        sink[1::5] = math.inf
        sink[3::5] = -math.inf
        args["attn_sink"] = sink
    return args


def reference_prefill(args: dict):
    return sparse_mla.sparse_mla_prefill(**args)


def prefill_grid() -> list[PrefillCase]:
    """Every (layout, s_q, h_q) with (topk, s_kv), the flags and the index dtype cycled."""
    topk_kv = [(64, 100), (128, 1000), (640, 2048), (2048, 4096), (37, 50)]
    flags = [(False, True), (True, True), (True, False), (False, False)]
    cases = []
    for d_qk in LAYOUTS:
        for s_q in (1, 3, 64):
            for h_q in (1, 16, 64, 128):
                i = len(cases)
                topk, s_kv = topk_kv[i % len(topk_kv)]
                topk_length, sink = flags[i % len(flags)]
                index_dtype = (torch.int32, torch.int64)[i % 2]
                cases.append(PrefillCase(d_qk, s_q, h_q, s_kv, topk, topk_length, sink, index_dtype))
    return cases


DEFAULT_PREFILL_CASES = [
    PrefillCase(MODEL1_HEAD_DIM, s_q=9, h_q=64, s_kv=700, topk=640, topk_length=True),
    PrefillCase(V32_HEAD_DIM, s_q=3, h_q=128, s_kv=300, topk=128, index_dtype=torch.int64),
    PrefillCase(MODEL1_HEAD_DIM, s_q=5, h_q=3, s_kv=40, topk=37, topk_length=True, sink=False),
]


ENTRY_BYTES = {MODEL1_HEAD_DIM: MODEL1_BYTES_PER_TOKEN, V32_HEAD_DIM: V32_BYTES_PER_TOKEN}


def flashmla_view(cache: torch.Tensor, block_size: int, d_qk: int, layout: str | None = None) -> torch.Tensor:
    """FlashMLA's [num_blocks, page_block_size, 1, bytes_per_token] view of padded 2-D pages."""
    entry = KV_LAYOUTS[layout] if layout else ENTRY_BYTES[d_qk]
    return cache[:, : block_size * entry].view(cache.shape[0], block_size, 1, entry)


def flashmla_kwargs(args: dict, d_qk: int = MODEL1_HEAD_DIM) -> dict:
    """flash_mla_with_kvcache keyword arguments for the decode_inputs of a case."""
    kwargs = dict(q=args["q"], k_cache=flashmla_view(args["kv_cache"], args["block_size"], d_qk, args.get("layout")),
                  block_table=None, cache_seqlens=None, head_dim_v=D_V, softmax_scale=args["sm_scale"],
                  is_fp8_kvcache=True, indices=args["indices"], attn_sink=args.get("attn_sink"),
                  topk_length=args["topk_length"])
    if "placement" in args:
        kwargs["kv_placement"] = args["placement"]
    if "extra_kv_cache" in args:
        extra_view = flashmla_view(args["extra_kv_cache"], args["extra_block_size"], d_qk, args.get("extra_layout"))
        kwargs.update(extra_k_cache=extra_view,
                      extra_indices_in_kvcache=args["extra_indices"], extra_topk_length=args["extra_topk_length"])
    return kwargs
