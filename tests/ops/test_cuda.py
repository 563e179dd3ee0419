"""CUDA-only contract: the decode split plan (also checked on the CPU), FlashMLA's plan-on-first-use protocol on
the device, CUDA-graph capture and replay of decode, no host synchronisation, out-of-range values handled on the
device, prefill with many tokens per CTA, paged indexer logits for more requests than a grid dimension holds, and
the DeepSeek-V4.1 records (writers and gather byte for byte with the CPU ops, decode with mixed records per set).
The kernels' numerics run in the CPU test grids (the "cuda" tiers of the isa fixture and the opcheck fixture);
torch.compile on CUDA tensors is in test_compile.py."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import CUDA_TIERS, clone_storage, distinct_slots, random_pages, rope_table, storage_bytes
from dsv4 import cache, flash_mla, ops
from dsv4.reference import indexer, quant, sparse_mla
from helpers.cuda_shuttle import GpuTwins
from helpers.indexer_cases import assert_logits_match, paged_case, row_valid_mask
from helpers.sparse_mla_cases import (
    D_V,
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


# ---- the DeepSeek-V4.1 records on the device: writers byte for byte with the CPU ops, the gather, decode ----------

V41 = ("v41_fp8", "v41_fp4")
PLACEMENTS = ("page_split", "per_token")
# (record, placement) pairs that exist: V4.1 in either placement, MODEL1 page-split, V32 per-token
RECORD_PLACEMENTS = [(layout, placement) for layout in ("model1", "v32") + V41 for placement in PLACEMENTS
                     if quant.record_placement(layout, placement) == placement]
RECORD_IDS = [f"{layout}-{placement}" for layout, placement in RECORD_PLACEMENTS]
V41_PAGES = (1, 5, 61, 64)
V41_PAD_BYTES = 48  # page stride beyond the page: the kernels must honour stride(0)
V41_MAX_POSITION = 1024
V41_MIN_EXACT_BYTES = 0.98  # the compressor pools in another order: a few codes move by one step


def record_pages(num_blocks: int, block_size: int, layout: str, placement: str) -> torch.Tensor:
    return random_pages(num_blocks, cache.kv_page_bytes(block_size, layout, placement), V41_PAD_BYTES)


def record_rows(n: int, dim: int, poison: bool = False) -> torch.Tensor:
    """Rows whose 16-dim tiles span tiny (floored scales, subnormal codes), ordinary and huge magnitudes, with e2m1
    ties, -0 and (poison) tiles holding NaN, +inf and -inf."""
    magnitudes = torch.tensor([1e-6, 3e-3, 0.05, 1.0, 40.0, 3000.0, 1e20])
    tiles = magnitudes[torch.randint(0, len(magnitudes), (n, dim // 16, 1))]
    x = (torch.randn(n, dim // 16, 16) * tiles).reshape(n, dim)
    x[0, :16] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, -0.1, 0.3, -6.0, 1.0, 2.0, 3.0, 4.0])
    x[min(1, n - 1), :32] = -0.0
    if poison and n > 3:
        x[2, 19], x[3, 48], x[3, 69] = math.nan, math.inf, -math.inf
    return x


def run_on_cuda(op, *args):
    """op on GPU twins of args (strides and every storage byte kept); the GPU storage is copied back into args."""
    twins = GpuTwins()
    result = op(*twins.to_gpu(args))
    torch.cuda.synchronize()
    twins.copy_back()
    return twins.to_cpu(result)


@needs_cuda
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("block_size", V41_PAGES)
@pytest.mark.parametrize("layout,placement", RECORD_PLACEMENTS, ids=RECORD_IDS)
def test_record_insert_matches_the_cpu_bytes(layout, placement, block_size, dtype):
    num_blocks = 3
    dim = cache.KV_HEAD_DIMS[layout]
    pages = record_pages(num_blocks, block_size, layout, placement)
    expected = clone_storage(pages)
    tokens = min(num_blocks * block_size, 40)
    slots = distinct_slots(tokens, num_blocks * block_size, 0.2, index_dtype=(torch.int32, torch.int64)[block_size % 2])
    kv = record_rows(tokens, dim, poison=layout == "v41_fp4").to(dtype)
    run_on_cuda(torch.ops.dsv4.quantize_kv_insert.layout, kv, slots, pages, block_size, layout, placement)
    torch.ops.dsv4.quantize_kv_insert.layout(kv, slots, expected, block_size, layout, placement)
    assert torch.equal(storage_bytes(pages), storage_bytes(expected)), "written bytes or padding differ"
    if layout in V41:
        reference = clone_storage(pages)
        quant.write_records(reference, slots, block_size, kv.float(), layout, placement)
        assert torch.equal(storage_bytes(pages), storage_bytes(reference)), "the reference writes other bytes"


@needs_cuda
@pytest.mark.parametrize("block_size", (1, 5, 64))
@pytest.mark.parametrize("layout,placement", RECORD_PLACEMENTS, ids=RECORD_IDS)
def test_record_gather_matches_the_cpu(layout, placement, block_size):
    num_blocks = 4
    pages = record_pages(num_blocks, block_size, layout, placement)  # random bytes: every code, NaN scales too
    capacity = num_blocks * block_size
    slots = torch.tensor([[0, capacity - 1, -1, capacity // 2], [capacity, 3 % capacity, 3 % capacity, -7]],
                         dtype=torch.int32)
    got = run_on_cuda(torch.ops.dsv4.dequantize_kv_gather.layout, pages, slots, block_size, layout, placement)
    want = torch.ops.dsv4.dequantize_kv_gather.layout(pages, slots, block_size, layout, placement)
    assert got.shape == want.shape == (2, 4, cache.KV_HEAD_DIMS[layout])
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


@needs_cuda
@pytest.mark.parametrize("q_norm", (False, True))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
@pytest.mark.parametrize("layout,placement", [lp for lp in RECORD_PLACEMENTS if lp[0] != "v32"],
                         ids=[i for i, lp in zip(RECORD_IDS, RECORD_PLACEMENTS, strict=True) if lp[0] != "v32"])
def test_window_insert_matches_the_cpu_bytes(layout, placement, dtype, q_norm):
    """The kv rows' record bytes equal the CPU's (RoPE rounds alike on both); q_out equal without q_norm (RoPE
    only), within a bf16 step with it (the sum of squares adds in another order)."""
    tokens, heads, padded, block_size = 24, 8, 16, 61
    q = (torch.randn(tokens, heads, 512) * 3).to(dtype)
    kv = record_rows(tokens + 2, 512).to(dtype)
    positions = torch.randint(0, V41_MAX_POSITION, (tokens,))
    cos_sin = rope_table(V41_MAX_POSITION)
    slots = distinct_slots(tokens - 3, 2 * block_size, skip_every=4)
    pages = record_pages(2, block_size, layout, placement)
    expected = clone_storage(pages)
    q_out, want_q = torch.empty(tokens, padded, 512, dtype=dtype), torch.empty(tokens, padded, 512, dtype=dtype)
    run_on_cuda(torch.ops.dsv4.qnorm_rope_kv_insert.layout, q, kv, positions, cos_sin, slots, pages, block_size,
                1e-6, q_out, q_norm, layout, placement)
    torch.ops.dsv4.qnorm_rope_kv_insert.layout(q, kv, positions, cos_sin, slots, expected, block_size, 1e-6, want_q,
                                               q_norm, layout, placement)
    assert torch.equal(storage_bytes(pages), storage_bytes(expected)), "written bytes or padding differ"
    assert (q_out[:, heads:] == 0).all()
    if q_norm:
        torch.testing.assert_close(q_out.float(), want_q.float(), atol=1e-6, rtol=2**-7)
    else:
        assert torch.equal(q_out, want_q)


def compressor_inputs(ratio: int, block_size: int, layout: str, placement: str, tokens: int = 24):
    """compress_norm_rope_store.layout arguments: fp32 state rows (coff 2 for C4, else 1) with spread scores, windows
    with -1 and out-of-cache rows, group-closing and other positions, distinct kv slots with -1."""
    coff = 2 if ratio == 4 else 1
    state_blocks, state_block = 40, 4
    backing = torch.randn(state_blocks, state_block + 1, 2 * coff * 512 + 8)
    state = backing[:, :state_block, : 2 * coff * 512]
    state[..., coff * 512 :] *= 3.0
    rows = state_blocks * state_block
    closing = torch.randint(1, V41_MAX_POSITION // ratio, (tokens,)) * ratio - 1
    positions = torch.where(torch.arange(tokens) % 3 == 0, torch.randint(0, V41_MAX_POSITION, (tokens,)), closing)
    window = positions[:, None] - coff * ratio + 1 + torch.arange(coff * ratio)
    gather = torch.randint(0, rows, window.shape)
    gather[torch.rand(gather.shape) < 0.05] += rows
    gather[(window < 0) | (torch.rand(gather.shape) < 0.1)] = -1
    num_blocks = -(-2 * tokens // block_size) + 1
    kv_slots = distinct_slots(tokens, num_blocks * block_size, 0.1)
    pages = record_pages(num_blocks, block_size, layout, placement)
    weight = torch.rand(512) + 0.5
    args = (state, gather, positions, kv_slots, weight, 1e-6, rope_table(V41_MAX_POSITION), pages, block_size, ratio,
            layout, placement)
    closes = (positions + 1) % ratio == 0
    has_row = ((gather >= 0) & (gather < rows)).any(1)
    return args, kv_slots[closes & has_row & (kv_slots >= 0)]


def assert_records_close(got: torch.Tensor, want: torch.Tensor, slots, block_size: int, layout: str, placement: str):
    """The entries at slots decode within one code step of the other's; most of their bytes equal; every other
    byte of the storage equal."""
    a = quant.read_records(got, slots, block_size, layout, placement)
    b = quant.read_records(want, slots, block_size, layout, placement)
    if layout == "model1":
        tile_max = b.reshape(-1, 8, 64).abs().amax(-1, keepdim=True).expand(-1, 8, 64).reshape(b.shape)
        step = tile_max / 8  # e4m3 codes: neighbours 1/8 apart at the top of the range; RoPE: a bf16 step
    elif layout == "v41_fp8":
        step = 2.0 ** (quant.v41_fp8_pack(b)[1].float() - 127).repeat_interleave(32, 1) * 2.0**-3 * quant.FP8_MAX
    else:
        step = quant.decode_e4m3(quant.v41_fp4_pack(b)[1]).repeat_interleave(16, 1) * 3.0  # 4 -> 6, scales 1 apart
    assert ((a - b).abs() <= step + 1e-30).logical_or(a.isnan() & b.isnan()).all()
    differing = (storage_bytes(got) != storage_bytes(want)).sum().item()
    assert differing <= (1 - V41_MIN_EXACT_BYTES) * len(slots) * cache.KV_LAYOUTS[layout]
    filler = torch.zeros(len(slots), 512)  # the same bytes over the written entries: the rest must be equal
    quant.write_records(got, slots, block_size, filler, layout, placement)
    quant.write_records(want, slots, block_size, filler, layout, placement)
    assert torch.equal(storage_bytes(got), storage_bytes(want)), "bytes outside the written entries differ"


@needs_cuda
@pytest.mark.parametrize("ratio", (1, 2, 4, 128))
@pytest.mark.parametrize("layout,placement", [lp for lp in RECORD_PLACEMENTS if lp[0] != "v32"],
                         ids=[i for i, lp in zip(RECORD_IDS, RECORD_PLACEMENTS, strict=True) if lp[0] != "v32"])
def test_compressor_store_matches_the_cpu(layout, placement, ratio):
    args, written = compressor_inputs(ratio, 64, layout, placement)
    assert written.numel() > 0
    pages = args[7]
    expected = clone_storage(pages)
    tokens = args[2].shape[0]
    latent = torch.full((tokens, 512), float("nan"), dtype=torch.bfloat16)  # rows of no written entry stay NaN
    want_latent = latent.clone()
    run_on_cuda(torch.ops.dsv4.compress_norm_rope_store.layout, *args, latent)
    torch.ops.dsv4.compress_norm_rope_store.layout(*args[:7], expected, *args[8:], want_latent)
    assert_records_close(pages, expected, written, 64, layout, placement)
    rows = ~want_latent[:, 0].isnan()
    assert torch.equal(latent[:, 0].isnan(), ~rows) and int(rows.sum()) == written.numel()
    torch.testing.assert_close(latent[rows].float(), want_latent[rows].float(), atol=1e-6, rtol=2**-7)


def v41_decode_cases() -> list[DecodeCase]:
    """Both V4.1 pairs in both placements over page sizes 1, 61, 64 (extra 53, 64), s_q 1 and 4, h_q 64 and 128,
    lengths on and off, int32 and int64 indices; one case long enough that the plan splits requests."""
    shapes = [(1, 64, 61, 53, 128, 64), (4, 128, 64, 64, 256, 128), (1, 128, 1, 53, 96, 40), (4, 64, 64, 53, 640, 64)]
    cases = []
    for pair in (("v41_fp8", "v41_fp4"), ("v41_fp8", "v41_fp8")):
        for placement in PLACEMENTS:
            for s_q, h_q, page, extra_page, topk, extra_topk in shapes:
                i = len(cases)
                j = i + i // len(shapes)
                cases.append(DecodeCase(b=(3, 2, 5, 1)[j % 4], s_q=s_q, h_q=h_q, topk=topk, page=page,
                                        extra_topk=extra_topk, extra_page=extra_page, topk_length=i % 2 == 0,
                                        extra_topk_length=i % 3 != 0, sink=j % 4 != 3,
                                        index_dtype=(torch.int32, torch.int64)[i % 2], layout=pair[0],
                                        extra_layout=pair[1], placement=placement))
    return cases


V41_DECODE_CASES = v41_decode_cases()


def decode_layout_args(args: dict, meta=None, splits=None) -> tuple:
    """Positional arguments of torch.ops.dsv4.sparse_mla_decode.layout for decode_inputs(case)."""
    return (args["q"], args["kv_cache"], args["indices"], args["topk_length"], args.get("attn_sink"),
            args.get("extra_kv_cache"), args.get("extra_indices"), args.get("extra_topk_length"), args["block_size"],
            args.get("extra_block_size", 0), D_V, args["sm_scale"], meta, splits, args["layout"],
            args["extra_layout"], args["placement"])


@needs_cuda
@pytest.mark.parametrize("tier", CUDA_TIERS)
@pytest.mark.parametrize("case", V41_DECODE_CASES, ids=str)
def test_v41_decode_matches_the_cpu(tier, case, monkeypatch):
    """Main and extra sets in their own records (the Hopper tier hands V4.1 to the portable kernel), -1 and
    out-of-cache entries, NaN in every cache row no valid entry reads."""
    if tier == "cuda-portable":
        monkeypatch.setenv("DSV4_CUDA_TIER", "portable")
    args = decode_inputs(case)
    want_out, want_lse = torch.ops.dsv4.sparse_mla_decode.layout(*decode_layout_args(args))
    gpu = on_cuda(args)
    out, lse = torch.ops.dsv4.sparse_mla_decode.layout(*decode_layout_args(gpu))
    assert_attention_close(out.cpu(), lse.cpu(), want_out, want_lse)
    meta, splits = ops.sparse_mla_decode_schedule(gpu["q"], gpu["indices"], gpu["topk_length"], gpu["extra_indices"],
                                                  gpu["extra_topk_length"])
    planned = torch.ops.dsv4.sparse_mla_decode.layout(*decode_layout_args(gpu, meta, splits))
    assert torch.equal(planned[0], out) and torch.equal(planned[1], lse), "a given plan gives the same bits"
    ref_out, ref_lse = sparse_mla.sparse_mla_decode(**args)
    assert_attention_close(out.cpu(), lse.cpu(), ref_out, ref_lse)
