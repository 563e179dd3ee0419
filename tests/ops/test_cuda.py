"""CUDA-only contract: the decode split plan (also checked on the CPU), FlashMLA's plan-on-first-use protocol on
the device, CUDA-graph capture and replay of decode, no host synchronisation, out-of-range values handled on the
device, prefill with many tokens per CTA, and paged indexer logits for more requests than a grid dimension holds.
The kernels' numerics run in the CPU test grids (the "cuda" tiers of the isa fixture and the opcheck fixture);
torch.compile on CUDA tensors is in test_compile.py."""

from __future__ import annotations

import pytest
import torch

from conftest import CUDA_TIERS
from dsv4 import cache, flash_mla, ops
from dsv4.reference import indexer, sparse_mla
from helpers.indexer_cases import assert_logits_match, paged_case, row_valid_mask
from helpers.sparse_mla_cases import (
    DecodeCase,
    PrefillCase,
    assert_attention_close,
    decode_inputs,
    flashmla_kwargs,
    prefill_inputs,
    reference_prefill,
)

needs_cuda = pytest.mark.skipif(not CUDA_TIERS, reason="needs a GPU and dsv4._C_cuda")
# The planner's block size, per-piece and combine costs, from the C++ that plans (csrc/common/params.h).
BLOCK_ENTRIES, FIXED_COST, COMBINE_COST = torch.ops.dsv4._sparse_mla_decode_plan_costs()
DEVICES = ["cpu"] + (["cuda"] if CUDA_TIERS else [])


def plan_pieces(meta: torch.Tensor, splits: torch.Tensor, blocks: list[int]) -> dict[int, list[tuple[int, int, int]]]:
    """(piece index, first block, end block) of every request, read off a plan."""
    pieces: dict[int, list[tuple[int, int, int]]] = {r: [] for r in range(len(blocks))}
    for begin_req, end_req, begin_block, end_block, begin_piece, *_ in meta.tolist():
        for r in range(begin_req, end_req + 1):
            first = begin_block if r == begin_req else 0
            end = end_block if r == end_req else blocks[r]
            pieces[r].append((begin_piece if r == begin_req else 0, first, end))
    return pieces


@pytest.fixture
def cpu_units(request):
    """Sets the CPU plan's partition count (intra-op threads) for the test, so that the split and whole plans of a
    132-SM GPU are planned on any machine; restores it after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(threads)


@pytest.mark.parametrize("cpu_units", [4, 132], indirect=True)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,topk,extra", [(1, 640, None), (7, 512, 128), (130, 1024, 64), (300, 64, None)])
def test_schedule_covers_every_block_once(device, b, topk, extra, cpu_units):
    q = torch.randn(b, 1, 64, 512).bfloat16().to(device)
    indices = torch.zeros(b, 1, topk, dtype=torch.int32, device=device)
    lengths = torch.randint(0, topk + 8, (b,), dtype=torch.int32)  # past topk is clamped
    extra_indices = extra_lengths = None
    if extra is not None:
        extra_indices = torch.zeros(b, 1, extra, dtype=torch.int32, device=device)
        extra_lengths = torch.randint(0, extra + 1, (b,), dtype=torch.int32)
    meta, splits = ops.sparse_mla_decode_schedule(q, indices, lengths.to(device), extra_indices,
                                                  None if extra_lengths is None else extra_lengths.to(device))
    assert meta.dtype == splits.dtype == torch.int32 and meta.shape[1] == 8 and splits.shape == (b + 1,)
    assert meta.shape[0] == ops.decode_schedule_parts(q.device, 1, 64)
    main = lengths.clamp(0, topk)
    blocks = ((main.clamp(min=1) + BLOCK_ENTRIES - 1) // BLOCK_ENTRIES).tolist()
    if extra is not None:
        extra_blocks = ((extra_lengths + BLOCK_ENTRIES - 1) // BLOCK_ENTRIES).tolist()
        blocks = [m + e for m, e in zip(blocks, extra_blocks, strict=True)]
    meta, splits = meta.cpu(), splits.cpu()
    pieces = plan_pieces(meta, splits, blocks)
    assert splits[0] == 0
    for r, got in pieces.items():
        got.sort()
        assert [p[0] for p in got] == list(range(len(got))), f"request {r}: piece numbers"
        assert splits[r + 1] - splits[r] == len(got), f"request {r}: num_splits"
        covered = [blk for _, first, end in got for blk in range(first, end)]
        assert covered == list(range(blocks[r])), f"request {r}: blocks covered {covered}"
    parts, total = meta.shape[0], sum(blocks) + FIXED_COST * b
    budget = -(-total // parts) + FIXED_COST
    whole = keeps_requests_whole(b, parts, topk, extra or 0)
    if whole:  # one piece per request, each partition within two of the largest requests of the mean cost
        assert splits.tolist() == list(range(b + 1))
        budget = -(-total // parts) + 2 * (max(blocks) + FIXED_COST)
    for begin_req, end_req, begin_block, end_block, *_ in meta[:-1].tolist():  # every partition but the last
        cost = sum((end_block if r == end_req else blocks[r]) - (begin_block if r == begin_req else 0) + FIXED_COST
                   for r in range(begin_req, end_req + 1))
        assert cost <= budget


def keeps_requests_whole(b: int, parts: int, topk: int, extra_topk: int) -> bool:
    """The plan's rule (common/decode_schedule.h): whole requests when, at full lengths, ceil(b / parts) of them
    cost no more than a split plan's budget per partition and its combine."""
    cost = -(-max(topk, 1) // BLOCK_ENTRIES) + -(-extra_topk // BLOCK_ENTRIES) + FIXED_COST
    return -(-b // parts) * cost <= -(-b * cost // parts) + FIXED_COST + COMBINE_COST


@pytest.mark.parametrize("cpu_units", [132], indirect=True)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("b,topk,extra,whole", [(1, 640, 128, False), (61, 512, 128, False), (64, 512, 128, True),
                                                (132, 512, 128, True), (264, 512, 128, True), (140, 512, 128, False)])
def test_schedule_keeps_requests_whole_at_large_batches(device, b, topk, extra, whole, cpu_units):
    q = torch.randn(b, 1, 64, 512).bfloat16().to(device)
    indices = torch.zeros(b, 1, topk, dtype=torch.int32, device=device)
    extra_indices = torch.zeros(b, 1, extra, dtype=torch.int32, device=device)
    meta, splits = ops.sparse_mla_decode_schedule(q, indices, None, extra_indices, None)
    parts = meta.shape[0]
    if parts == 132:  # the CPU plan here, or an H200's: the V4-Flash shapes' kinds of plan
        assert keeps_requests_whole(b, parts, topk, extra) == whole
    pieces = (splits[1:] - splits[:-1]).cpu()
    if keeps_requests_whole(b, parts, topk, extra):
        assert (pieces == 1).all()
        per_part = [m[1] - m[0] + 1 for m in meta.cpu().tolist() if m[0] < b]
        assert max(per_part) == -(-b // parts), "full lengths: requests dealt evenly"
    elif parts == 132:
        assert pieces.sum() > b, "a split plan at these shapes cuts some request"


CASE = DecodeCase(b=5, s_q=2, h_q=64, topk=640, page=64, extra_topk=128, extra_page=64, topk_length=True,
                  extra_topk_length=True)


def on_cuda(args: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@needs_cuda
def test_flash_mla_plans_on_the_device_once():
    args = decode_inputs(CASE)
    sched, _ = flash_mla.get_mla_metadata()
    kwargs = on_cuda(flashmla_kwargs(args))
    out, lse = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **kwargs)
    plan = sched.tile_scheduler_metadata
    assert plan is not None and plan.is_cuda and sched.num_splits.is_cuda
    assert_attention_close(out.cpu(), lse.cpu(), *sparse_mla.sparse_mla_decode(**args))
    kwargs["q"] = torch.randn_like(kwargs["q"].float()).bfloat16()
    flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **kwargs)
    assert sched.tile_scheduler_metadata is plan, "a planned schedule object is reused, not replanned"


@needs_cuda
@pytest.mark.parametrize("tier", CUDA_TIERS)
def test_decode_graph_capture_and_replay(tier, monkeypatch):
    if tier == "cuda-portable":
        monkeypatch.setenv("DSV4_CUDA_TIER", "portable")
    args = decode_inputs(CASE)
    static = on_cuda(args)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up outside the graph, as capture requires
        sched, _ = flash_mla.get_mla_metadata()
        flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(static))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sched, _ = flash_mla.get_mla_metadata()  # planned inside the capture: replays re-plan on the device
        out, lse = flash_mla.flash_mla_with_kvcache(tile_scheduler_metadata=sched, **flashmla_kwargs(static))
    planned_lengths = args["topk_length"]  # the poisoned cache has real rows only within these lengths
    for _ in range(2):  # new values and shorter lengths in the static buffers, then replay
        args["q"] = torch.randn_like(args["q"].float()).bfloat16()
        args["topk_length"] = (torch.rand(CASE.b) * (planned_lengths + 1)).int().clamp(max=CASE.topk)
        static["q"].copy_(args["q"])
        static["topk_length"].copy_(args["topk_length"])
        graph.replay()
        torch.cuda.synchronize()
        assert_attention_close(out.cpu(), lse.cpu(), *sparse_mla.sparse_mla_decode(**args))
    first = out.clone()
    graph.replay()
    assert torch.equal(out, first), "a replay on the same inputs gives the same bits"


@needs_cuda
def test_decode_does_not_synchronise():
    args = on_cuda(decode_inputs(CASE))
    torch.cuda.set_sync_debug_mode("error")
    try:
        ops.sparse_mla_decode(**args)
        meta, splits = ops.sparse_mla_decode_schedule(args["q"], args["indices"], args["topk_length"],
                                                      args["extra_indices"], args["extra_topk_length"])
        ops.sparse_mla_decode(**args, tile_scheduler_metadata=meta, num_splits=splits)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
def test_mixed_devices_are_rejected():
    args = on_cuda(decode_inputs(CASE))
    args["kv_cache"] = args["kv_cache"].cpu()
    with pytest.raises(RuntimeError, match="dsv4::sparse_mla_decode: argument 'kv_cache' must be on the same device"):
        ops.sparse_mla_decode(**args)


@needs_cuda
def test_out_of_range_slots_write_nothing_on_the_device():
    """The host does not read slot values on CUDA (that would synchronise): a slot past the cache is skipped."""
    block_size, num_blocks = 4, 3
    kv_cache = cache.allocate_kv_cache(num_blocks, block_size).cuda()
    kv_cache.random_(0, 256)
    before = kv_cache.clone()
    slots = torch.tensor([num_blocks * block_size + 7, -1, -9], device="cuda")
    ops.quantize_kv_insert(torch.randn(3, 512, device="cuda").bfloat16(), slots, kv_cache, block_size)
    torch.cuda.synchronize()
    assert torch.equal(kv_cache, before)


# Hopper prefill runs persistent CTAs over consecutive tokens: enough tokens that every CTA takes several, with
# both head-group counts, int64 indices and varied lengths (zeros included), and a kv row stride that is not
# 16-byte aligned (the portable tier's).
PREFILL_CASES = [
    (PrefillCase(s_q=700, h_q=64, s_kv=1500, topk=640, topk_length=True), 0),
    (PrefillCase(s_q=300, h_q=128, s_kv=3000, topk=1152, index_dtype=torch.int64), 0),
    (PrefillCase(s_q=400, h_q=16, s_kv=900, topk=200, topk_length=True, sink=False), 0),
    (PrefillCase(s_q=400, h_q=20, s_kv=700, topk=128, topk_length=True), 0),  # heads ending inside a warp's rows
    (PrefillCase(s_q=50, h_q=64, s_kv=700, topk=512), 3),
]


@needs_cuda
@pytest.mark.parametrize("tier", CUDA_TIERS)
@pytest.mark.parametrize("case,misalign", PREFILL_CASES, ids=[f"{c}-{m}" for c, m in PREFILL_CASES])
def test_prefill_many_tokens_per_cta(tier, case, misalign, monkeypatch):
    if tier == "cuda-portable":
        monkeypatch.setenv("DSV4_CUDA_TIER", "portable")
    args = prefill_inputs(case)
    if args["topk_length"] is not None:
        args["topk_length"][::7] = 0
    if misalign:  # same rows at a stride of 512 + misalign elements
        wide = torch.full((case.s_kv, 1, case.d_qk + misalign), float("nan")).bfloat16()
        wide[..., : case.d_qk] = args["kv"]
        args["kv"] = wide[..., : case.d_qk]
    out, max_logits, lse = ops.sparse_mla_prefill(**on_cuda(args))
    ref_out, ref_max, ref_lse = reference_prefill(args)
    assert_attention_close(out.cpu(), lse.cpu(), ref_out, ref_lse, max_logits.cpu(), ref_max)
    again = ops.sparse_mla_prefill(**on_cuda(args))
    assert torch.equal(out, again[0]) and torch.equal(lse, again[2]), "same inputs, same bits"


@needs_cuda
@pytest.mark.parametrize("tier", CUDA_TIERS)
def test_paged_logits_more_requests_than_grid_rows(tier, monkeypatch):
    """70000 requests (the Hopper grid has at most 65535 rows of them, so some CTAs score a second request after
    their first, continuing their ring of key tiles): the batch repeats 97 distinct requests, so every row must
    equal its first copy bit for bit, and the first copies match the reference. Lengths up to three tiles, some 0."""
    if tier == "cuda-portable":
        monkeypatch.setenv("DSV4_CUDA_TIER", "portable")
    distinct, batch = 97, 70000
    lens = [(37 * i) % 190 for i in range(distinct)]
    q, kv, weights, ctx, table, block_size, max_len = paged_case(distinct, 1, 16, 64, lens, lens_2d=False, pool=11)
    repeat = torch.arange(batch) % distinct
    args = [t.cuda() for t in (q[repeat], kv, weights[repeat], ctx[repeat], table[repeat])]
    want = indexer.fp8_paged_mqa_logits(q, kv, weights, ctx, table, block_size, max_len)
    valid = row_valid_mask(ctx, 1, max_len)
    for clean in (True, False):
        got = ops.fp8_paged_mqa_logits(*args, block_size, max_len, clean_logits=clean).cpu()
        first = got[:distinct]
        assert_logits_match(first, want, torch.ones_like(valid) if clean else valid)
        copies = first[repeat]
        mask = torch.ones_like(got, dtype=torch.bool) if clean else valid[repeat]
        assert torch.equal(got[mask], copies[mask]), "a repeated request scored differently"
