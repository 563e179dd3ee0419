"""GPU benchmarks (``python -m dsv4 bench --op gpu``): the CUDA kernels on DeepSeek-V4 shapes against the
H200 roofline.

Each case is captured once in a CUDA graph; a timed replay follows an L2 flush (cold cache), and the median of
the replays is reported as time per call, per query token, TFLOP/s, TB/s of the counted bytes, and the fraction
of the roofline time max(FLOPs / peak FLOP/s, bytes / peak bandwidth). Two sections follow the table: each decode
record's bytes per query token with its memory and compute rooflines, and a batch-1 decode call taken apart (the
launch floor, the plan, each kernel's device time and the gaps between them).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

import dsv4

from .. import cache, flash_mla, ops
from ..constants import MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, SLIDING_WINDOW

PEAK_TFLOPS, PEAK_TBPS = 989.0, 4.8  # H200 SXM datasheet: dense bf16, HBM3e
REPLAYS, QUICK_REPLAYS = 30, 5
L2_FLUSH_BYTES = 256 << 20  # several times the 60 MB L2
KV_SPREAD = 0.3
FLASH = (64, 512)  # heads, compressed top-k (DeepSeek-V4-Flash C4A)
PRO = (128, 1024)  # DeepSeek-V4-Pro C4A
TP_LOCAL_HEADS = 16  # V4-Flash heads per GPU under tensor parallelism over 4 GPUs
PAGE = 64
INDEXER_HEADS, INDEXER_DIM = 64, 128


@dataclass
class GpuCase:
    op: str
    shape: str
    query_tokens: int
    flops: int
    bytes_moved: int
    run: Callable[[], object]
    plan: Callable[[], object] | None = field(default=None, repr=False)  # the decode's split plan, made per step


@dataclass
class GpuResult:
    op: str
    shape: str
    us: float
    ns_per_token: float
    tflops: float
    tbps: float
    roofline_us: float

    @property
    def roofline_fraction(self) -> float:
        return self.roofline_us / self.us


def replay_us(run: Callable[[], object], replays: int, before: Callable[[], object]) -> float:
    """Median microseconds of a CUDA-graph replay of run, each after `before` (queued GPU work, so that the host's
    submission of the replay is not timed)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # warm-up: module load, plans, allocator pools
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        before()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_cold(case: GpuCase, replays: int) -> float:
    """Median microseconds of a graph replay of case.run after an L2 flush."""
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    return replay_us(case.run, replays, flush.zero_)


def flashmla_view(pages: torch.Tensor) -> torch.Tensor:
    return pages[:, : PAGE * MODEL1_BYTES_PER_TOKEN].view(pages.shape[0], PAGE, 1, MODEL1_BYTES_PER_TOKEN)


def random_slots(batch: int, per_request: int, pool: int) -> torch.Tensor:
    """int32 [batch, 1, per_request]: distinct slots per request spread over the pool."""
    keys = torch.rand(batch, pool, device="cuda")
    return keys.argsort(dim=1)[:, :per_request].to(torch.int32).unsqueeze(1)


def model1_pages(rows: int) -> torch.Tensor:
    """A FlashMLA-view MODEL1 cache holding `rows` random rows at slots 0 .. rows - 1."""
    pages = flashmla_view(cache.allocate_kv_cache(-(-rows // PAGE), PAGE, device="cuda"))
    values = (torch.randn(rows, MODEL1_HEAD_DIM, device="cuda") * KV_SPREAD).bfloat16()
    ops.quantize_kv_insert(values, torch.arange(rows, device="cuda"), pages.view(pages.shape[0], -1), PAGE)
    return pages


def decode_bytes_per_query(heads: int, compressed: int, main_record: int, extra_record: int) -> int:
    """Bytes a decode reads and writes per query token: the window's records in the main cache, the compressed
    entries' in the extra cache, an int32 index per entry, the bf16 query in and the bf16 output out."""
    return SLIDING_WINDOW * (main_record + 4) + compressed * (extra_record + 4) + 4 * heads * MODEL1_HEAD_DIM


def decode_flops_per_query(heads: int, compressed: int) -> int:
    """S = q K^T and P V over every attended entry: 2 x 2 FLOPs per head, dim and entry."""
    return 4 * heads * MODEL1_HEAD_DIM * (SLIDING_WINDOW + compressed)


def decode_case(batch: int, heads: int, compressed: int, preset: str) -> GpuCase:
    window, compressed_cache = model1_pages(batch * SLIDING_WINDOW), model1_pages(batch * compressed)
    window_slots = random_slots(batch, SLIDING_WINDOW, window.shape[0] * PAGE)
    compressed_slots = random_slots(batch, compressed, compressed_cache.shape[0] * PAGE)
    q = torch.randn(batch, 1, heads, MODEL1_HEAD_DIM, device="cuda").bfloat16()
    sink = torch.randn(heads, device="cuda")
    sched, _ = flash_mla.get_mla_metadata()

    def run():
        return flash_mla.flash_mla_with_kvcache(q, compressed_cache, None, None, MODEL1_HEAD_DIM, sched,
                                                is_fp8_kvcache=True, indices=compressed_slots, attn_sink=sink,
                                                extra_k_cache=window, extra_indices_in_kvcache=window_slots)

    return GpuCase("sparse_mla_decode", f"{preset} B={batch} H={heads} {SLIDING_WINDOW}+{compressed}", batch,
                   flops=batch * decode_flops_per_query(heads, compressed),
                   bytes_moved=batch * decode_bytes_per_query(heads, compressed, MODEL1_BYTES_PER_TOKEN,
                                                              MODEL1_BYTES_PER_TOKEN),
                   run=run, plan=lambda: ops.sparse_mla_decode_schedule(q, compressed_slots, None, window_slots, None))


def v41_pages(rows: int, layout: str) -> torch.Tensor:
    """A page-split V4.1 cache of `layout` records (as vLLM writes them) holding `rows` random rows at slots
    0 .. rows - 1."""
    pages = cache.allocate_kv_cache(-(-rows // PAGE), PAGE, layout, device="cuda")
    values = (torch.randn(rows, MODEL1_HEAD_DIM, device="cuda") * KV_SPREAD).bfloat16()
    ops.quantize_kv_insert(values, torch.arange(rows, device="cuda"), pages, PAGE, layout=layout)
    return pages


def v41_decode_case(batch: int, heads: int, compressed: int, extra_layout: str, preset: str) -> GpuCase:
    """DeepSeek-V4.1's decode: the window in a 528-byte fp8 main cache, the compressed entries in a 288-byte fp4
    (or 528-byte fp8) extra cache; the plan is made once, outside the timed call, as FlashMLA's callers do."""
    window, compressed_cache = v41_pages(batch * SLIDING_WINDOW, "v41_fp8"), v41_pages(batch * compressed, extra_layout)
    window_slots = random_slots(batch, SLIDING_WINDOW, window.shape[0] * PAGE)
    compressed_slots = random_slots(batch, compressed, compressed_cache.shape[0] * PAGE)
    q = torch.randn(batch, 1, heads, MODEL1_HEAD_DIM, device="cuda").bfloat16()
    sink = torch.randn(heads, device="cuda")
    def plan():
        return ops.sparse_mla_decode_schedule(q, window_slots, None, compressed_slots, None)

    meta, splits = plan()

    def run():
        return ops.sparse_mla_decode(q, window, window_slots, PAGE, attn_sink=sink, extra_kv_cache=compressed_cache,
                                     extra_indices=compressed_slots, extra_block_size=PAGE,
                                     tile_scheduler_metadata=meta, num_splits=splits, layout="v41_fp8",
                                     extra_layout=extra_layout)

    return GpuCase(f"sparse_mla_decode V4.1 (528+{cache.KV_LAYOUTS[extra_layout]})",
                   f"{preset} B={batch} H={heads} {SLIDING_WINDOW}+{compressed}", batch,
                   flops=batch * decode_flops_per_query(heads, compressed),
                   bytes_moved=batch * decode_bytes_per_query(heads, compressed, cache.KV_LAYOUTS["v41_fp8"],
                                                              cache.KV_LAYOUTS[extra_layout]),
                   run=run, plan=plan)


def prefill_case(tokens: int, heads: int, topk: int) -> GpuCase:
    kv_rows = 2 * tokens
    kv = (torch.randn(kv_rows, 1, MODEL1_HEAD_DIM, device="cuda") * KV_SPREAD).bfloat16()
    indices = torch.randint(0, kv_rows, (tokens, 1, topk), dtype=torch.int32, device="cuda")
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM, device="cuda").bfloat16()
    sink = torch.randn(heads, device="cuda")
    return GpuCase("sparse_mla_prefill", f"T={tokens} H={heads} topk={topk} bf16", tokens,
                   flops=4 * tokens * heads * MODEL1_HEAD_DIM * topk,
                   bytes_moved=2 * kv_rows * MODEL1_HEAD_DIM + tokens * (4 * topk + 4 * heads * MODEL1_HEAD_DIM),
                   run=lambda: ops.sparse_mla_prefill(q, kv, indices, MODEL1_HEAD_DIM**-0.5, attn_sink=sink))


def fp8_prefill_cases(tokens: int, heads: int, compressed: int) -> list[GpuCase]:
    """The last `tokens` of a 4 x (`tokens` + `compressed`) prompt over its MODEL1 caches (window of 128 raw
    entries, `compressed` of the ratio-4 entries before each position), two ways: the decode op reading the fp8
    caches directly (one request per token), and dequantize-gather of the rows the chunk reads into a bf16
    workspace + bf16 prefill."""
    context = 4 * (tokens + compressed)  # the chunk's first token sees `compressed` compressed entries
    window, compressed_cache = model1_pages(context), model1_pages(context // 4)
    positions = torch.arange(context - tokens, context, device="cuda")
    window_slots = (positions[:, None] - torch.arange(SLIDING_WINDOW - 1, -1, -1, device="cuda")).int()
    visible = positions[:, None] // 4 > torch.arange(context // 4, device="cuda")  # compressed entries before p
    keys = torch.rand(tokens, context // 4, device="cuda").masked_fill(~visible, -1.0)
    compressed_slots = keys.topk(compressed, dim=1).indices.int()
    q = torch.randn(tokens, 1, heads, MODEL1_HEAD_DIM, device="cuda").bfloat16()
    sink = torch.randn(heads, device="cuda")
    sched, _ = flash_mla.get_mla_metadata()
    first_window = context - tokens - SLIDING_WINDOW + 1  # the workspace: the chunk's window rows, then all compressed
    window_rows = torch.arange(first_window, context, device="cuda").int()
    compressed_rows = torch.arange(context // 4, device="cuda").int()
    local = torch.cat([window_slots - first_window, compressed_slots + len(window_rows)], dim=1).unsqueeze(1)
    scale = MODEL1_HEAD_DIM**-0.5
    compressed_indices, window_indices = compressed_slots.unsqueeze(1), window_slots.unsqueeze(1)

    def direct():
        return flash_mla.flash_mla_with_kvcache(q, compressed_cache, None, None, MODEL1_HEAD_DIM, sched,
                                                is_fp8_kvcache=True, indices=compressed_indices, attn_sink=sink,
                                                extra_k_cache=window, extra_indices_in_kvcache=window_indices)

    def gathered():
        rows = torch.cat([ops.dequantize_kv_gather(window.view(window.shape[0], -1), window_rows, PAGE),
                          ops.dequantize_kv_gather(compressed_cache.view(compressed_cache.shape[0], -1),
                                                   compressed_rows, PAGE)])
        return ops.sparse_mla_prefill(q.squeeze(1), rows.unsqueeze(1), local, scale, attn_sink=sink)

    entries = SLIDING_WINDOW + compressed
    flops = 4 * tokens * heads * MODEL1_HEAD_DIM * entries
    cache_bytes = (context + context // 4) * (MODEL1_BYTES_PER_TOKEN + 4)
    shape = f"T={tokens} H={heads} {SLIDING_WINDOW}+{compressed} fp8"
    return [GpuCase("prefill_fp8_direct", shape, tokens, flops, cache_bytes, direct),
            GpuCase("prefill_fp8_gathered", shape, tokens, flops, cache_bytes, gathered)]


def logits_case(batch: int, context: int) -> GpuCase:
    pages = context // PAGE
    kv = cache.allocate_indexer_k_cache(batch * pages, PAGE, device="cuda")
    kv.view(-1).copy_(torch.randint(0, 120, (kv.numel(),), dtype=torch.uint8, device="cuda"))
    scales = kv[:, PAGE * INDEXER_DIM : PAGE * (INDEXER_DIM + 4)].view(torch.float32)
    scales.copy_(torch.exp2(torch.randint(-8, 0, scales.shape, device="cuda").float()))
    q = (torch.randn(batch, 1, INDEXER_HEADS, INDEXER_DIM, device="cuda") * 8).to(torch.float8_e4m3fn)
    weights = torch.randn(batch, INDEXER_HEADS, device="cuda")
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    table = torch.randperm(batch * pages, dtype=torch.int32, device="cuda").view(batch, pages)
    return GpuCase("fp8_paged_mqa_logits", f"B={batch} ctx={context // 1024}K", batch,
                   flops=2 * batch * context * INDEXER_HEADS * INDEXER_DIM,
                   bytes_moved=batch * context * (INDEXER_DIM + 4 + 4),
                   run=lambda: ops.fp8_paged_mqa_logits(q, kv, weights, lens, table, PAGE, context))


def topk_case(rows: int, width: int, k: int) -> GpuCase:
    scores = torch.randn(rows, width, device="cuda")
    lengths = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    return GpuCase("topk_transform", f"{rows} x {width} k={k}", rows, flops=0, bytes_moved=rows * (width + k) * 4,
                   run=lambda: ops.topk_transform(scores, lengths, k))


def cases(quick: bool) -> list[GpuCase]:
    batches = (1, 128) if quick else (1, 8, 32, 64, 128, 256, 512)
    pro_batches = (1, 128) if quick else (1, 32, 128, 256)
    return [
        *(decode_case(b, *FLASH, "V4-Flash") for b in batches),
        *(decode_case(b, *PRO, "V4-Pro") for b in pro_batches),
        *(decode_case(b, TP_LOCAL_HEADS, FLASH[1], "V4-Flash TP4") for b in ((128,) if quick else (128, 512))),
        *(v41_decode_case(b, *FLASH, "v41_fp4", "V4.1-Flash") for b in batches),
        *(v41_decode_case(b, *FLASH, "v41_fp8", "V4.1-Flash") for b in ((128,) if quick else (128, 256, 512))),
        prefill_case(512 if quick else 4096, FLASH[0], SLIDING_WINDOW + FLASH[1]),
        prefill_case(512 if quick else 4096, PRO[0], SLIDING_WINDOW + PRO[1]),
        *fp8_prefill_cases(512 if quick else 4096, *FLASH),
        *fp8_prefill_cases(512 if quick else 4096, *PRO),
        *(logits_case(b, 1 << 16) for b in ((1, 64) if quick else (1, 8, 32, 64, 128))),
        topk_case(128, 1 << 14, 512),
        topk_case(64, 1 << 16, 512),
    ]


def measure(quick: bool = False) -> list[GpuResult]:
    torch.manual_seed(0)
    results = []
    for case in cases(quick):
        us = time_cold(case, QUICK_REPLAYS if quick else REPLAYS)
        roofline = max(case.flops / (PEAK_TFLOPS * 1e6), case.bytes_moved / (PEAK_TBPS * 1e6))
        results.append(GpuResult(case.op, case.shape, us, us * 1e3 / case.query_tokens, case.flops / us / 1e6,
                                 case.bytes_moved / us / 1e6, roofline))
    return results


@dataclass
class RecordRoofline:
    record: str
    bytes_per_query: int
    memory_ns: float  # per query token at peak bandwidth
    compute_ns: float  # per query token at peak bf16 FLOP/s


# The decode records: (label with the main and extra records' sizes to fill in, main layout, extra layout).
DECODE_RECORDS = (("V4.0 MODEL1 {} + {}", "model1", "model1"), ("V4.1 fp8 {} + fp4 {}", "v41_fp8", "v41_fp4"),
                  ("V4.1 fp8 {} + fp8 {}", "v41_fp8", "v41_fp8"))


def record_rooflines(heads: int = FLASH[0], compressed: int = FLASH[1]) -> list[RecordRoofline]:
    """Each decode record's bytes per query token and the time per query token its bytes and its FLOPs take at the
    roofline: the floor a decode of that record can approach, whatever the batch."""
    flops = decode_flops_per_query(heads, compressed)
    rows = []
    for label, main_layout, extra_layout in DECODE_RECORDS:
        main_record, extra_record = cache.KV_LAYOUTS[main_layout], cache.KV_LAYOUTS[extra_layout]
        moved = decode_bytes_per_query(heads, compressed, main_record, extra_record)
        rows.append(RecordRoofline(label.format(main_record, extra_record), moved, moved / PEAK_TBPS / 1e3,
                                   flops / PEAK_TFLOPS / 1e3))
    return rows


@dataclass
class LatencyPart:
    case: str
    part: str
    us: float


def kernel_spans(run: Callable[[], object], flush: torch.Tensor, calls: int) -> list[list[tuple[str, float, float]]]:
    """Per eager call after an L2 flush: its kernels in order as (name, start, end) in device microseconds, from
    the profiler's trace (the flush's own kernel left out)."""
    import warnings

    from torch.profiler import ProfilerActivity, profile

    warnings.filterwarnings("ignore", message="Profiler clears events")  # one profile, one cycle: nothing is lost
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush.zero_()
            run()
        torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[1])
    calls_out, current = [], None
    for name, start, end in kernels:
        if end - start > 20 and "elementwise" in name:  # the 256 MB flush: a new call starts after it
            current = []
            calls_out.append(current)
        elif current is not None:
            current.append((name, start, end))
    return [c for c in calls_out if c]


def short_kernel_name(name: str) -> str:
    for key, short in (("decode_sm90", "attention kernel"), ("sparse_mla_decode", "attention kernel"),
                       ("combine", "combine kernel"), ("schedule", "plan kernel")):
        if key in name:
            return short
    return name.split("(")[0].split("<")[0][-40:]


def batch1_breakdown(quick: bool) -> list[LatencyPart]:
    """A batch-1 decode call taken apart: the graph replay of the whole call and of one tiny kernel (the launch
    floor), the split plan made once per step (outside the timed call), and from the profiler's trace of eager
    calls each kernel's device time, the gaps between them and the span from the first kernel's start to the last
    one's end; the rest of the replay is launch and submission."""
    replays = QUICK_REPLAYS if quick else REPLAYS
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    tiny = torch.zeros(1, device="cuda")
    parts = [LatencyPart("-", "launch floor: one tiny kernel", replay_us(lambda: tiny.add_(1), replays, flush.zero_))]
    for case in (decode_case(1, *FLASH, "V4-Flash"), v41_decode_case(1, *FLASH, "v41_fp4", "V4.1-Flash")):
        name = f"{case.op} {case.shape}"
        parts.append(LatencyPart(name, "whole call (graph replay)", replay_us(case.run, replays, flush.zero_)))
        parts.append(LatencyPart(name, "split plan (per step, outside the call)", replay_us(case.plan, replays,
                                                                                            flush.zero_)))
        try:
            spans = kernel_spans(case.run, flush, replays)
        except Exception as error:  # a profiler without CUDA activity: the replays above still stand
            parts.append(LatencyPart(name, f"kernel trace unavailable ({type(error).__name__}: {error})", 0.0))
            continue
        width = min(len(s) for s in spans)
        for k in range(width):
            label = short_kernel_name(spans[0][k][0])
            parts.append(LatencyPart(name, f"{label} (device time)",
                                     statistics.median(s[k][2] - s[k][1] for s in spans)))
            if k + 1 < width:
                parts.append(LatencyPart(name, f"gap after the {label}",
                                         statistics.median(s[k + 1][1] - s[k][2] for s in spans)))
        parts.append(LatencyPart(name, "kernels' span, first start to last end",
                                 statistics.median(s[width - 1][2] - s[0][1] for s in spans)))
    return parts


def hardware() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda, "dsv4": dsv4.__version__,
            "roofline": f"{PEAK_TFLOPS:.0f} TFLOP/s bf16, {PEAK_TBPS} TB/s"}


def report(info: dict, results: list[GpuResult], rooflines: list[RecordRoofline], latency: list[LatencyPart],
           as_json: bool) -> str:
    if as_json:
        rows = [{**asdict(r), "roofline_fraction": r.roofline_fraction} for r in results]
        return json.dumps({"hardware": info, "results": rows, "record_rooflines": [asdict(r) for r in rooflines],
                           "batch1_breakdown": [asdict(p) for p in latency]}, indent=2)
    lines = ["  ".join(f"{k}={v}" for k, v in info.items()),
             f"{'op':32s} {'shape':36s} {'us':>9s} {'ns/token':>9s} {'TFLOP/s':>8s} {'TB/s':>6s} {'roof us':>8s} "
             f"{'of roof':>7s}"]
    for r in results:
        lines.append(f"{r.op:32s} {r.shape:36s} {r.us:9.1f} {r.ns_per_token:9.0f} {r.tflops:8.1f} {r.tbps:6.2f} "
                     f"{r.roofline_us:8.1f} {r.roofline_fraction:7.1%}")
    lines += ["", f"decode records at the Flash shape (H={FLASH[0]}, {SLIDING_WINDOW}+{FLASH[1]}), per query token:",
              f"{'record':26s} {'bytes':>8s} {'memory roof ns':>15s} {'compute roof ns':>16s}"]
    for r in rooflines:
        lines.append(f"{r.record:26s} {r.bytes_per_query:8d} {r.memory_ns:15.1f} {r.compute_ns:16.1f}")
    lines += ["", "batch-1 decode taken apart (us, medians):"]
    for p in latency:
        lines.append(f"{p.case:58s} {p.part:44s} {p.us:8.2f}")
    return "\n".join(lines)


def main(quick: bool, as_json: bool) -> str:
    """The bench's whole output: the table, the record rooflines and the batch-1 breakdown."""
    results = measure(quick)
    return report(hardware(), results, record_rooflines(), batch1_breakdown(quick), as_json)
