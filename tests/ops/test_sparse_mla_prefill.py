"""Native sparse_mla_prefill against the reference on every CPU tier: a grid (a representative subset by
default; all of it with DSV4_FULL_GRID=1 or -m slow), rows with nothing valid, thread splits, the op contract.
kv rows that no valid index reads are NaN."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4 import ops
from dsv4.constants import MODEL1_HEAD_DIM, V32_HEAD_DIM
from helpers.sparse_mla_cases import (
    D_V,
    DEFAULT_PREFILL_CASES,
    SPLIT_THREADS,
    PrefillCase,
    assert_attention_close,
    prefill_grid,
    prefill_inputs,
    q_off_16_bytes,
    reference_prefill,
    require_full_grid,
)


def check_prefill(args: dict):
    out, max_logits, lse = ops.sparse_mla_prefill(**args)
    ref_out, ref_max, ref_lse = reference_prefill(args)
    assert max_logits.dtype == torch.float32 and max_logits.shape == ref_max.shape
    assert_attention_close(out, lse, ref_out, ref_lse, max_logits, ref_max)
    return out, max_logits, lse


@pytest.mark.parametrize("case", DEFAULT_PREFILL_CASES, ids=str)
def test_prefill_matches_reference(isa, case):
    check_prefill(prefill_inputs(case))


@pytest.mark.slow
@pytest.mark.parametrize("case", prefill_grid(), ids=str)
def test_prefill_full_grid(request, isa, case):
    require_full_grid(request)
    check_prefill(prefill_inputs(case))


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_rows_with_nothing_valid(isa, d_qk):
    args = prefill_inputs(PrefillCase(d_qk, s_q=4, h_q=6, s_kv=30, topk=20, topk_length=True))
    args["indices"][0] = -1
    args["indices"][1] = torch.tensor([30, -4, 2**31 - 1, 31]).repeat(5)  # negative or >= s_kv
    args["topk_length"][2] = 0
    args["topk_length"][3] = 21
    out, max_logits, lse = check_prefill(args)
    assert torch.equal(out[:3], torch.zeros_like(out[:3]))
    assert (max_logits[:3] == -math.inf).all() and (lse[:3] == math.inf).all()


def test_q_rows_off_16_byte_alignment(isa):
    """q rows starting 2 bytes past a 16-byte boundary (no tensor copies of q on the Hopper tier: element loads)."""
    args = prefill_inputs(PrefillCase(s_q=5, h_q=70, s_kv=300, topk=192, topk_length=True))
    args["q"] = q_off_16_bytes(args["q"])
    check_prefill(args)


def test_rising_scores_raise_the_running_max(isa):
    """Scores climbing by far more than the lazy-max slack from one 64-entry tile to the next (head 0), and falling
    (head 1): out, lse and max_logits (the largest score, not the weights' offset) as in the reference."""
    s_kv = 400
    q_row = torch.randn(MODEL1_HEAD_DIM)
    rows = torch.linspace(0, 2, s_kv)[:, None] * q_row + 0.1 * torch.randn(s_kv, MODEL1_HEAD_DIM)
    q = torch.stack([q_row, -q_row]).bfloat16().view(1, 2, MODEL1_HEAD_DIM)
    kv = rows.bfloat16().view(s_kv, 1, MODEL1_HEAD_DIM)
    indices = torch.arange(s_kv, dtype=torch.int32).view(1, 1, s_kv)
    check_prefill(dict(q=q, kv=kv, indices=indices, sm_scale=MODEL1_HEAD_DIM**-0.5))


def test_nan_in_q_gives_nan_rows(isa):
    """A NaN in one head's q makes that (token, head)'s out, max_logits and lse NaN, as in the reference; every
    other row keeps its bits."""
    args = prefill_inputs(PrefillCase(s_q=3, h_q=16, topk=192))
    out, max_logits, lse = ops.sparse_mla_prefill(**args)
    args["q"] = args["q"].clone()
    args["q"][2, 5, 100] = math.nan
    got, got_max, got_lse = ops.sparse_mla_prefill(**args)
    ref, ref_max, ref_lse = reference_prefill(args)
    assert torch.isnan(ref[2, 5]).all() and torch.isnan(ref_max[2, 5]) and torch.isnan(ref_lse[2, 5])
    assert torch.isnan(got[2, 5]).all() and torch.isnan(got_max[2, 5]) and torch.isnan(got_lse[2, 5])
    hit = torch.zeros(3, 16, dtype=torch.bool)
    hit[2, 5] = True
    assert torch.equal(got[~hit], out[~hit])
    assert torch.equal(got_max[~hit], max_logits[~hit]) and torch.equal(got_lse[~hit], lse[~hit])


@pytest.mark.parametrize("scale", [-0.05, 0.0, 0.3])
def test_any_softmax_scale(isa, scale):
    """Negative, zero and large scales: max_logits and the running max are those of the scaled scores."""
    args = prefill_inputs(PrefillCase(s_q=3, h_q=8, topk=96, topk_length=True))
    args["sm_scale"] = scale
    check_prefill(args)


def test_strided_query(isa):
    args = prefill_inputs(PrefillCase(s_q=6, h_q=10, s_kv=200, topk=96))
    wide = torch.randn(6, 16, MODEL1_HEAD_DIM + 32).bfloat16()
    wide[:, :10, :MODEL1_HEAD_DIM] = args["q"]
    args["q"] = wide[:, :10, :MODEL1_HEAD_DIM]
    check_prefill(args)


@pytest.mark.parametrize("threads", SPLIT_THREADS)
def test_split_entries_across_threads(isa, restore_threads, threads):
    torch.set_num_threads(threads)
    check_prefill(prefill_inputs(PrefillCase(s_q=1, h_q=64, s_kv=3000, topk=1000, topk_length=True)))


def test_more_tokens_than_workers(isa):
    # Several tokens per GPU CTA (and per CPU thread), some with no entry (zero lengths) between attended ones.
    check_prefill(prefill_inputs(PrefillCase(s_q=300, h_q=64, s_kv=400, topk=192, topk_length=True)))


def test_same_inputs_same_bits(isa):
    args = prefill_inputs(PrefillCase(s_q=5, h_q=64, s_kv=500, topk=300))
    first, second = ops.sparse_mla_prefill(**args), ops.sparse_mla_prefill(**args)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.parametrize("case", DEFAULT_PREFILL_CASES[:2], ids=str)
def test_opcheck(case, opcheck):
    args = prefill_inputs(case)
    opcheck(torch.ops.dsv4.sparse_mla_prefill.default,
                          (args["q"], args["kv"], args["indices"], args["sm_scale"], D_V, args.get("attn_sink"),
                           args["topk_length"]))


BAD_INPUTS = [
    ("q", lambda a: a.update(q=a["q"][:, :, ::2]), "head dim"),
    ("kv", lambda a: a.update(kv=a["kv"][:, 0]), "3 dimensions"),
    ("kv", lambda a: a.update(kv=a["kv"].expand(-1, 2, -1)), "size 1 in dimension 1"),
    ("indices", lambda a: a.update(indices=a["indices"][:, :, :0]), "at least 1 columns"),
    ("topk_length", lambda a: a.update(topk_length=a["topk_length"][:2]), "size"),
    ("attn_sink", lambda a: a.update(attn_sink=a["attn_sink"][None]), "1 dimensions"),
]


@pytest.mark.parametrize("arg,corrupt,message", BAD_INPUTS, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_INPUTS)])
def test_bad_inputs_raise_before_running(arg, corrupt, message):
    args = prefill_inputs(PrefillCase(s_q=3, h_q=4, s_kv=20, topk=8, topk_length=True))
    corrupt(args)
    with pytest.raises(RuntimeError, match=f"dsv4::sparse_mla_prefill: argument '{arg}' .*{message}"):
        ops.sparse_mla_prefill(**args)
