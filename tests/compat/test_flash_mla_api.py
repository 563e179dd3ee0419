"""dsv4.flash_mla: FlashMLA's signatures, return conventions and schedule-object rules on the dsv4 ops."""

from __future__ import annotations

import pytest
import torch

from dsv4 import flash_mla, ops
from dsv4.constants import MODEL1_HEAD_DIM, V32_HEAD_DIM
from helpers.sparse_mla_cases import (
    D_V,
    DecodeCase,
    PrefillCase,
    decode_inputs,
    flashmla_kwargs,
    prefill_inputs,
)

CASE = DecodeCase(b=3, s_q=2, h_q=16, topk=96, page=61, extra_topk=64, extra_page=2, topk_length=True,
                  extra_topk_length=True)


def test_get_mla_metadata_returns_a_fresh_schedule():
    sched, splits = flash_mla.get_mla_metadata(torch.zeros(3), 64, 1, anything=True)
    assert splits is None and isinstance(sched, flash_mla.FlashMLASchedMeta)
    assert not sched.have_initialized and sched.config is None
    assert sched.tile_scheduler_metadata is None and sched.num_splits is None
    assert flash_mla.get_mla_metadata()[0] is not sched


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_decode_matches_the_op(isa, d_qk):
    args = decode_inputs(DecodeCase(d_qk, b=2, s_q=2, h_q=8, topk=70, page=5, extra_topk=20, extra_page=3,
                                    topk_length=True))
    sched, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(args, d_qk))
    expected = ops.sparse_mla_decode(**args)
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])
    assert out.shape == (2, 2, 8, D_V) and lse.shape == (2, 8, 2)


@pytest.mark.parametrize("placement", ["per_token", "page_split"])
@pytest.mark.parametrize("extra_layout", ["v41_fp4", "v41_fp8"])
def test_v41_records_are_detected_from_the_last_dimension(isa, extra_layout, placement):
    args = decode_inputs(DecodeCase(b=2, s_q=2, h_q=64, topk=128, page=64, extra_topk=64, extra_page=5,
                                    topk_length=True, layout="v41_fp8", extra_layout=extra_layout,
                                    placement=placement))
    kwargs = flashmla_kwargs(args)
    extra_bytes = 288 if extra_layout == "v41_fp4" else 528
    assert kwargs["k_cache"].shape[-1] == 528 and kwargs["extra_k_cache"].shape[-1] == extra_bytes
    if placement == "per_token":
        del kwargs["kv_placement"]  # FlashMLA upstream's placement is the default
    out, lse = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0], **kwargs)
    expected = ops.sparse_mla_decode(**args)
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


def test_unknown_record_sizes_raise():
    kwargs = flashmla_kwargs(decode_inputs(CASE))
    kwargs["k_cache"] = kwargs["k_cache"][..., :500]
    with pytest.raises(ValueError, match="bytes_per_token .* must be one of"):
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0], **kwargs)
    with pytest.raises(ValueError, match="kv_placement must be one of"):
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0],
                                         **{**flashmla_kwargs(decode_inputs(CASE)), "kv_placement": "rows"})


def test_default_scale_and_ignored_block_table():
    args = decode_inputs(DecodeCase(b=2, s_q=1, h_q=4, topk=32, page=8))
    kwargs = flashmla_kwargs(args)
    del kwargs["softmax_scale"]
    kwargs.update(block_table=torch.full((2, 3), 99, dtype=torch.int32), cache_seqlens=torch.tensor([7, 1000]))
    out, lse = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0], **kwargs)
    expected = ops.sparse_mla_decode(**args)  # sm_scale d_qk^-0.5
    assert torch.equal(out, expected[0]) and torch.equal(lse, expected[1])


def test_out_buffer_is_written_and_returned(isa):
    args = decode_inputs(CASE)
    buffer = torch.full((3, 2, 16, D_V), 7.0).bfloat16()
    out, _ = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0], out=buffer,
                                              **flashmla_kwargs(args))
    assert out is buffer and torch.equal(buffer, ops.sparse_mla_decode(**args)[0])
    with pytest.raises(ValueError, match="out must be bf16"):
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0], out=buffer[:1],
                                         **flashmla_kwargs(args))


def test_schedule_is_planned_on_first_use_and_reused():
    args = decode_inputs(CASE)
    sched, _ = flash_mla.get_mla_metadata()
    first = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(args))
    assert sched.have_initialized
    assert sched.config == flash_mla.FlashMLASchedMeta.Config(b=3, s_q=2, h_q=16, page_block_size=61, h_k=1,
                                                               causal=False, is_fp8_kvcache=True, topk=96,
                                                               extra_page_block_size=2, extra_topk=64)
    args["q"] = torch.randn_like(args["q"].float()).bfloat16()  # new values, same configuration
    second = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(args))
    assert not torch.equal(first[0], second[0])


def changed_batch(kwargs):
    for name in ("q", "indices", "topk_length", "extra_indices_in_kvcache", "extra_topk_length"):
        kwargs[name] = kwargs[name][:2]


def without_extra(kwargs):
    for name in ("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length"):
        kwargs[name] = None


MISMATCHES = [
    ("b", changed_batch),
    ("h_q", lambda k: k.update(q=k["q"][:, :, :8])),
    ("topk", lambda k: k.update(indices=k["indices"][..., :64])),
    ("extra_topk", lambda k: k.update(extra_indices_in_kvcache=k["extra_indices_in_kvcache"][..., :32])),
    ("extra_page_block_size", without_extra),
]


@pytest.mark.parametrize("field,change", MISMATCHES, ids=[m[0] for m in MISMATCHES])
def test_schedule_reused_with_another_configuration_raises(field, change):
    args = decode_inputs(CASE)
    sched, _ = flash_mla.get_mla_metadata()
    flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(args))
    kwargs = flashmla_kwargs(args)
    change(kwargs)
    with pytest.raises(flash_mla.ScheduleMismatchError, match=f"planned for {field}=") as info:
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **kwargs)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)


UNSUPPORTED = [
    (NotImplementedError, "dense attention", lambda k: k.update(indices=None)),
    (ValueError, "causal must be False", lambda k: k.update(causal=True)),
    (ValueError, "is_fp8_kvcache must be True", lambda k: k.update(is_fp8_kvcache=False)),
    (ValueError, "num_splits must be None", lambda k: k.update(num_splits=torch.zeros(4, dtype=torch.int32))),
    (TypeError, "FlashMLASchedMeta", lambda k: k.update(tile_scheduler_metadata=torch.zeros(8, 8))),
    (ValueError, "k_cache must be", lambda k: k.update(k_cache=k["k_cache"].flatten(1))),
]


@pytest.mark.parametrize("error,message,change", UNSUPPORTED, ids=[u[1] for u in UNSUPPORTED])
def test_unsupported_calls_raise(error, message, change):
    kwargs = flashmla_kwargs(decode_inputs(CASE))
    kwargs["tile_scheduler_metadata"] = flash_mla.get_mla_metadata()[0]
    change(kwargs)
    with pytest.raises(error, match=message):
        flash_mla.flash_mla_with_kvcache(**kwargs)


def test_argument_errors_come_from_the_op():
    kwargs = flashmla_kwargs(decode_inputs(CASE))
    with pytest.raises(RuntimeError, match="dsv4::sparse_mla_decode: argument 'head_dim_v'"):
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=flash_mla.get_mla_metadata()[0],
                                         **{**kwargs, "head_dim_v": 576})


def test_sparse_fwd_matches_the_op(isa):
    args = prefill_inputs(PrefillCase(s_q=4, h_q=16, s_kv=90, topk=40, topk_length=True))
    out, max_logits, lse = flash_mla.flash_mla_sparse_fwd(args["q"], args["kv"], args["indices"], args["sm_scale"],
                                                          attn_sink=args["attn_sink"], topk_length=args["topk_length"])
    expected = ops.sparse_mla_prefill(**args)
    assert all(torch.equal(a, b) for a, b in zip((out, max_logits, lse), expected, strict=True))
    assert out.shape == (4, 16, D_V) and max_logits.shape == lse.shape == (4, 16)
    with pytest.raises(RuntimeError, match="dsv4::sparse_mla_prefill: argument 'head_dim_v'"):
        flash_mla.flash_mla_sparse_fwd(args["q"], args["kv"], args["indices"], args["sm_scale"], d_v=448)
