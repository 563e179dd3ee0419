"""Sparse MLA decode and prefill over the DeepSeek-V4.1 caches (a 528-byte fp8 main cache with a 528-byte fp8 or
288-byte fp4 extra cache, page-split or per-token) on every tier, against the reference on the dequantized cache
with FlashMLA's tolerances. Unreferenced rows are NaN-filled, so a kernel that reads one fails."""

from __future__ import annotations

import pytest
import torch

from dsv4 import ops
from dsv4.constants import MODEL1_HEAD_DIM
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
