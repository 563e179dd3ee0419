"""Sparse MLA decode and prefill over the DeepSeek-V4.1 caches (a 528-byte fp8 main cache with a 528-byte fp8 or
288-byte fp4 extra cache, page-split or per-token) on every tier, against the reference on the dequantized cache
with FlashMLA's tolerances. Unreferenced rows are NaN-filled, so a kernel that reads one fails."""

from __future__ import annotations

import pytest
import torch

from dsv4 import ops
from dsv4.cache import kv_page_bytes
from dsv4.constants import MODEL1_HEAD_DIM
from dsv4.reference import quant
from helpers.sparse_mla_cases import (
    SPLIT_THREADS,
    DecodeCase,
    assert_attention_close,
    decode_inputs,
    reference_decode,
    require_full_grid,
)

PAIRS = (("v41_fp8", "v41_fp4"), ("v41_fp8", "v41_fp8"))
PLACEMENTS = ("page_split", "per_token")


def v41_case(pair, placement, **fields) -> DecodeCase:
    return DecodeCase(MODEL1_HEAD_DIM, layout=pair[0], extra_layout=pair[1], placement=placement, **fields)


def check_decode(case: DecodeCase) -> None:
    args = decode_inputs(case)
    out, lse = ops.sparse_mla_decode(**args)
    ref_out, ref_lse = reference_decode(args)
    assert_attention_close(out, lse, ref_out, ref_lse, flashmla=True)


# Every main page size (1, 2, 5, 61, 64, 69, 576) and extra page size (1, 2, 5, 53, 61, 69, 123, 576) of the notes'
# grid, both pairs and placements, s_q 1, 3 and 4, top-k widths from 64 to 2048 and head counts from 1 to 128.
DEFAULT_CASES = [
    v41_case(PAIRS[0], "page_split", b=4, s_q=4, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64,
             topk_length=True, extra_topk_length=True),  # the production shape
    v41_case(PAIRS[0], "per_token", b=1, s_q=1, h_q=128, topk=64, page=5, extra_topk=640, extra_page=69),
    v41_case(PAIRS[1], "page_split", b=3, s_q=3, h_q=16, topk=576, page=2, extra_topk=192, extra_page=123,
             topk_length=True, index_dtype=torch.int64),
    v41_case(PAIRS[1], "per_token", b=2, s_q=1, h_q=1, topk=1024, page=61, extra_topk=256, extra_page=53,
             sink=False),
    v41_case(PAIRS[0], "page_split", b=1, s_q=4, h_q=24, topk=2048, page=576, extra_topk=64, extra_page=1,
             extra_topk_length=True),
    v41_case(PAIRS[0], "per_token", b=4, s_q=1, h_q=64, topk=1152, page=1, extra_topk=128, extra_page=576,
             index_dtype=torch.int64),
    v41_case(PAIRS[1], "page_split", b=2, s_q=3, h_q=128, topk=640, page=69, extra_topk=512, extra_page=5),
    v41_case(PAIRS[0], "page_split", b=2, s_q=1, h_q=64, topk=192, page=64, extra_topk=1024, extra_page=2),
    v41_case(PAIRS[0], "per_token", b=1, s_q=1, h_q=64, topk=128, page=64, extra_topk=2048, extra_page=61),
]


@pytest.mark.parametrize("case", DEFAULT_CASES, ids=str)
def test_decode_matches_reference(isa, case):
    check_decode(case)


def full_grid() -> list[DecodeCase]:
    """b 1, 4, 74 x s_q 1, 3, 4 x both pairs and placements, the other axes cycled through the notes' values."""
    mains = [(64, 5), (64, 69), (576, 2), (576, 61), (2048, 1), (2048, 64), (2048, 576), (128, 256)]
    extras = [(64, 5), (512, 69), (128, 2), (192, 123), (256, 1), (640, 576), (512, 53), (64, 61)]
    heads = (1, 16, 64, 128)
    cases = []
    for b in (1, 4, 74):
        for s_q in (1, 3, 4):
            for pair in PAIRS:
                for placement in PLACEMENTS:
                    i = len(cases)
                    (topk, page), (extra_topk, extra_page) = mains[i % len(mains)], extras[(i // 3) % len(extras)]
                    cases.append(v41_case(pair, placement, b=b, s_q=s_q, h_q=heads[i % len(heads)], topk=topk,
                                          page=page, extra_topk=extra_topk, extra_page=extra_page,
                                          topk_length=i % 2 == 0, extra_topk_length=i % 3 == 0,
                                          index_dtype=(torch.int32, torch.int64)[i % 2]))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("case", full_grid(), ids=str)
def test_decode_full_grid(request, isa, case):
    require_full_grid(request)
    check_decode(case)


@pytest.mark.parametrize("threads", SPLIT_THREADS)
def test_split_entries_across_threads(isa, restore_threads, threads):
    torch.set_num_threads(threads)
    check_decode(v41_case(PAIRS[0], "page_split", b=1, s_q=1, h_q=64, topk=128, page=64, extra_topk=512,
                          extra_page=64, topk_length=True))


def test_main_set_only(isa):
    check_decode(v41_case(PAIRS[1], "per_token", b=2, s_q=2, h_q=64, topk=256, page=61))


@pytest.mark.parametrize("route", ops.PREFILL_ROUTES)
@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_prefill_routes_match_the_decode_contract(isa, route, pair, placement):
    """Prefill over V4.1 caches, both routes: every token one query of the decode reference."""
    case = v41_case(pair, placement, b=12, s_q=1, h_q=64, topk=128, page=64, extra_topk=512, extra_page=61,
                    topk_length=True, extra_topk_length=True)
    args = decode_inputs(case)
    ref_out, ref_lse = reference_decode(args)
    out, lse = ops.sparse_mla_prefill_from_cache(
        args["q"][:, 0], args["kv_cache"], args["indices"][:, 0], case.page, topk_length=args["topk_length"],
        attn_sink=args["attn_sink"], extra_kv_cache=args["extra_kv_cache"], extra_indices=args["extra_indices"][:, 0],
        extra_topk_length=args["extra_topk_length"], extra_block_size=case.extra_page, sm_scale=args["sm_scale"],
        layout=pair[0], extra_layout=pair[1], placement=placement, route=route)
    assert_attention_close(out[:, None], lse.transpose(0, 1)[None].transpose(0, 2).contiguous(), ref_out, ref_lse,
                           flashmla=True)


FINITE_E4M3_CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
NAN_E4M3_CODES = (0x7F, 0xFF)
UE8M0_NAN = 255
BF16_TINY = torch.finfo(torch.bfloat16).tiny  # some tiers' bf16 products flush smaller magnitudes to zero
CODE_ENTRIES = 64  # one 64-entry tile


def raw_page(layout: str, placement: str, data: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One page of len(data) entries of `layout` holding the given raw data and scale bytes."""
    n = data.shape[0]
    page = torch.zeros(1, kv_page_bytes(n, layout, placement), dtype=torch.uint8)
    data_cols, scale_cols = quant._entry_byte_index(layout, placement, n, torch.arange(n))
    page[0, data_cols] = data
    page[0, scale_cols] = scales
    return page


def single_entry_rows(layout: str, placement: str, page: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse of query n attending entry n of the page alone with q = 0 (out: exactly that entry's row): fp8
    entries as the main set, fp4 ones as the extra set beside a main set of -1 entries."""
    n = CODE_ENTRIES
    q = torch.zeros(1, n, 2, MODEL1_HEAD_DIM).bfloat16()
    own = torch.arange(n, dtype=torch.int32).view(1, n, 1)
    if layout == "v41_fp8":
        out, lse = ops.sparse_mla_decode(q, page, own, n, layout=layout, extra_layout=layout, placement=placement)
    else:
        main = torch.zeros(1, kv_page_bytes(1, "v41_fp8", placement), dtype=torch.uint8)
        out, lse = ops.sparse_mla_decode(q, main, torch.full_like(own, -1), 1, extra_kv_cache=page, extra_indices=own,
                                         extra_block_size=n, layout="v41_fp8", extra_layout=layout,
                                         placement=placement)
    return out[0, :, 0], lse[0, 0]


def code_page(layout: str, placement: str) -> torch.Tensor:
    """Every finite e4m3 code under UE8M0 scale bytes 7-246 (fp8: 448 times the largest is still a finite bf16),
    or every e2m1 pair under every finite e4m3 scale byte (fp4)."""
    _, data_bytes, scale_bytes, *_ = quant.RECORDS[layout]
    e = torch.arange(CODE_ENTRIES)[:, None]
    if layout == "v41_fp8":
        data = FINITE_E4M3_CODES[(torch.arange(data_bytes) + 37 * e) % len(FINITE_E4M3_CODES)]
        scales = (7 + (scale_bytes * e + torch.arange(scale_bytes)) % 240).to(torch.uint8)
    else:
        data = ((torch.arange(data_bytes) + 13 * e) % 256).to(torch.uint8)
        scales = FINITE_E4M3_CODES[(scale_bytes * e + torch.arange(scale_bytes)) % len(FINITE_E4M3_CODES)]
    return raw_page(layout, placement, data, scales)


@pytest.mark.parametrize("layout", ["v41_fp8", "v41_fp4"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_code_and_scale_byte_decodes_exactly(isa, layout, placement):
    """Rows of every finite code under every scale byte but NaN (fp8: UE8M0 bytes 7-246, the large scales past
    the Hopper tier's direct route included; fp4: subnormal and zero e4m3 scales included) match the reference's
    rows bit for bit."""
    page = code_page(layout, placement)
    got, lse = single_entry_rows(layout, placement, page)
    want = quant.read_records(page, torch.arange(CODE_ENTRIES), CODE_ENTRIES, layout, placement).bfloat16()
    assert (lse == 0).all()
    comparable = (want.float().abs() >= BF16_TINY) | (want == 0)
    assert comparable.float().mean() > 0.99
    assert torch.equal(got[comparable], want[comparable])


@pytest.mark.parametrize("layout", ["v41_fp8", "v41_fp4"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_nan_codes_and_scales_give_nan_rows(isa, layout, placement):
    """An attended entry with an e4m3 NaN code (fp8) or a NaN scale byte (fp8: UE8M0 255, fp4: e4m3 0x7f or 0xff)
    gives a NaN row and lse, as the reference's dequantized NaN does; clean entries in the same tile stay exact."""
    page = code_page(layout, placement)
    _, data_bytes, scale_bytes, *_ = quant.RECORDS[layout]
    data_cols, scale_cols = quant._entry_byte_index(layout, placement, CODE_ENTRIES, torch.arange(CODE_ENTRIES))
    hit = list(range(0, CODE_ENTRIES, 3))
    for i, e in enumerate(hit):
        if layout == "v41_fp8" and i % 2 == 0:
            page[0, data_cols[e, (29 * i) % data_bytes]] = NAN_E4M3_CODES[i % 4 // 2]
        else:
            page[0, scale_cols[e, (7 * i) % scale_bytes]] = UE8M0_NAN if layout == "v41_fp8" else NAN_E4M3_CODES[i % 2]
    got, lse = single_entry_rows(layout, placement, page)
    assert torch.isnan(got[hit]).all() and torch.isnan(lse[hit]).all()
    clean = torch.ones(CODE_ENTRIES, dtype=torch.bool)
    clean[hit] = False
    want = quant.read_records(page, torch.arange(CODE_ENTRIES), CODE_ENTRIES, layout, placement).bfloat16()[clean]
    comparable = (want.float().abs() >= BF16_TINY) | (want == 0)
    assert torch.equal(got[clean][comparable], want[comparable])


def test_unsupported_pairs_and_geometry_are_rejected():
    args = decode_inputs(v41_case(PAIRS[0], "page_split", b=1, s_q=1, h_q=16, topk=64, page=64, extra_topk=64,
                                  extra_page=64))
    with pytest.raises(RuntimeError, match=r"\(v41_fp4, v41_fp4\) are not a supported pair"):
        ops.sparse_mla_decode(**{**args, "layout": "v41_fp4"})
    with pytest.raises(RuntimeError, match=r"\(model1, v41_fp4\) are not a supported pair"):
        ops.sparse_mla_decode(**{**args, "layout": "model1"})
    with pytest.raises(RuntimeError, match="argument 'extra_kv_cache' pages hold"):
        ops.sparse_mla_decode(**{**args, "extra_layout": "v41_fp8"})
    with pytest.raises(RuntimeError, match="argument 'placement' must be"):
        ops.sparse_mla_decode(**{**args, "placement": "split"})
    with pytest.raises(ValueError, match="route must be one of"):
        ops.sparse_mla_prefill_from_cache(args["q"][:, 0], args["kv_cache"], args["indices"][:, 0], 64, route="x")
