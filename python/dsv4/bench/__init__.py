"""Benchmarks of the CPU ops: median time, bytes/s or FLOP/s, ratio to the reference and to the vLLM peer.

Each group module, named after its op family (kv_cache, compressor, rope_slots, indexer, topk, sparse_mla) or
``layer`` (one whole attention layer), builds cases on DeepSeek-V4 shapes. dsv4 and the
peer are called through the same vLLM-named entry points (``dsv4.compat.vllm_cpu`` and
``torch.ops._C``) where the peer has the op, so both run identical inputs in the same process.
"""

from __future__ import annotations

import json
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.utils.benchmark as benchmark

import dsv4

from .. import cache
from ..compat import vllm_cpu
from ..compat.vllm_peer import load_peer_reason
from ..rope import rope_cos_sin_cache

MIN_RUN_SECONDS = 0.3
ROPE_DIM, ROPE_THETA = 64, 10000.0
# DeepSeek-V4-Flash shapes the op groups share: 64 query heads x 512, the indexer's 64 heads x 128, 64-entry blocks.
HEADS, HEAD_DIM, INDEXER_HEADS, INDEXER_DIM, BLOCK = 64, 512, 64, 128, 64


@dataclass
class Result:
    op: str
    shape: str
    dsv4_us: float
    gbytes_per_s: float
    gflops: float | None
    reference_us: float | None
    peer_us: float | None
    ceiling_gflops: float | None = None  # the same run's bf16 matmul rate (run() sets it)

    @property
    def of_ceiling(self) -> float | None:
        return self.gflops / self.ceiling_gflops if self.gflops and self.ceiling_gflops else None

    @property
    def vs_reference(self) -> float | None:
        return self.reference_us / self.dsv4_us if self.reference_us else None

    @property
    def vs_peer(self) -> float | None:
        return self.peer_us / self.dsv4_us if self.peer_us else None


@dataclass
class Case:
    op: str
    shape: str
    bytes_moved: int
    run: Callable[[object], None]  # takes the module with vLLM's op names (compat or peer)
    reference: Callable[[], None] | None  # None: too slow to time at this size
    on_peer: bool = True
    flops: int = 0


def median_us(fn: Callable[[], None]) -> float:
    # Timer runs with one thread unless told otherwise: time with the threads the ops will really use.
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return statistics.median(timer.blocked_autorange(min_run_time=MIN_RUN_SECONDS).times) * 1e6


def rope_table(max_pos: int) -> torch.Tensor:
    return rope_cos_sin_cache(max_pos, ROPE_DIM, ROPE_THETA)


@dataclass
class Tokens:
    """The token batch the writer-side groups share: positions 0.., their RoPE table, and distinct random slots of
    a MODEL1 SWA cache two blocks larger than they need."""

    count: int
    positions: torch.Tensor
    rope: torch.Tensor
    num_blocks: int
    slots: torch.Tensor
    swa: torch.Tensor


def token_batch(quick: bool) -> Tokens:
    count = 64 if quick else 256
    num_blocks = count // BLOCK + 2
    return Tokens(count, torch.arange(count), rope_table(max(8192, 4 * count + 8)), num_blocks,
                  torch.randperm(num_blocks * BLOCK)[:count], cache.allocate_kv_cache(num_blocks, BLOCK))


CEILING_SIZE = 2048  # the ceiling: a bf16 [n, n] x [n, n] matmul through torch (oneDNN on x86)


def bf16_ceiling_gflops() -> float:
    """This machine's bf16 matmul rate now, with the threads the ops use: what a product-bound kernel can hope for."""
    a = torch.randn(CEILING_SIZE, CEILING_SIZE).bfloat16()
    b = torch.randn(CEILING_SIZE, CEILING_SIZE).bfloat16()
    return 2 * CEILING_SIZE**3 / median_us(lambda: torch.matmul(a, b)) / 1e3


def measure(cases: list[Case], with_reference: bool = True, on_result=None) -> list[Result]:
    peer, _ = load_peer_reason()
    results = []
    for case in cases:
        ours = median_us(lambda case=case: case.run(vllm_cpu))
        theirs = median_us(lambda case=case: case.run(peer)) if peer is not None and case.on_peer else None
        reference = median_us(case.reference) if with_reference and case.reference is not None else None
        gflops = case.flops / ours / 1e3 if case.flops else None
        results.append(Result(case.op, case.shape, ours, case.bytes_moved / ours / 1e3, gflops, reference, theirs))
        if on_result is not None:
            on_result(results[-1])
    return results


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def hardware(ceiling_gflops: float | None = None) -> dict:
    _, peer_reason = load_peer_reason()
    return {
        "cpu": cpu_model(),
        "threads": torch.get_num_threads(),
        "cpu_isa": dsv4.cpu_isa(),
        "isa_order": torch.ops.dsv4.cpu_isa_order(),
        "bf16_ceiling_gflops": round(ceiling_gflops, 1) if ceiling_gflops else None,
        "torch": torch.__version__,
        "dsv4": dsv4.__version__,
        "peer": "vllm-cpu 0.32.0" if not peer_reason else "unavailable (the reason is printed above)",
        "peer_reason": peer_reason or None,
    }


def _fmt(value: float | None, spec: str) -> str:
    width = spec.split(".")[0]  # an empty column keeps the column's width
    return format(value, spec) if value is not None else format("-", f">{width}")


def report(info: dict, results: list[Result], as_json: bool) -> str:
    if as_json:
        rows = [{**asdict(r), "vs_reference": r.vs_reference, "vs_peer": r.vs_peer, "of_ceiling": r.of_ceiling}
                for r in results]
        return json.dumps({"hardware": info, "results": rows}, indent=2)
    lines = [f"{'op':34s} {'shape':24s} {'dsv4 us':>10s} {'GB/s':>7s} {'GFLOP/s':>8s} {'% ceil':>6s} {'ref us':>11s} "
             f"{'x ref':>7s} {'peer us':>10s} {'x peer':>7s}"]
    for r in results:
        ceiling = r.of_ceiling * 100 if r.of_ceiling else None
        lines.append(f"{r.op:34s} {r.shape:24s} {r.dsv4_us:10.1f} {r.gbytes_per_s:7.2f} {_fmt(r.gflops, '8.1f')} "
                     f"{_fmt(ceiling, '6.0f')} {_fmt(r.reference_us, '11.1f')} {_fmt(r.vs_reference, '7.1f')} "
                     f"{_fmt(r.peer_us, '10.1f')} {_fmt(r.vs_peer, '7.2f')}")
    return "\n".join([f"bf16 ceiling: {info['bf16_ceiling_gflops']} GFLOP/s (median of this run's measurements)",
                      *lines, LEGEND])


def hardware_lines(info: dict) -> str:
    return "\n".join(f"{k}: {v}" for k, v in info.items() if k not in ("bf16_ceiling_gflops", "peer_reason"))


GROUPS = ("kv_cache", "compressor", "rope_slots", "indexer", "topk", "sparse_mla", "layer", "layer_v41")


LEGEND = """\
dsv4 us: median time of one call. GB/s, GFLOP/s: bytes moved and flops per second of it.
% ceil: GFLOP/s as a share of the bf16 matmul ceiling above (torch's 2048^3 bf16 matmul, measured in this run).
ref us, x ref: the plain-PyTorch reference's time and ref us / dsv4 us. peer us, x peer: vLLM's CPU kernel on
the same inputs and peer us / dsv4 us (above 1: dsv4 is faster). -: not measured for that case."""


def progress_line(index: int, result: Result) -> str:
    """One finished case, for the progress of a long run."""
    extra = "".join(f", {label} {value:.1f} us" for label, value in (("ref", result.reference_us),
                                                                       ("peer", result.peer_us)) if value)
    return f"  [{index}] {result.op} {result.shape}: {result.dsv4_us:.1f} us{extra}"


def run(groups: list[str], quick: bool = False, with_reference: bool = True, on_result=None
        ) -> tuple[dict, list[Result]]:
    """Measures the named case groups (each a module of this package with ``cases(quick)``); ``on_result`` is
    called with each case's result as it finishes."""
    import importlib

    torch.manual_seed(0)
    results, ceilings = [], []
    for group in groups:
        module = importlib.import_module(f"{__name__}.{group}")
        ceilings.append(bf16_ceiling_gflops())
        results += measure(module.cases(quick), with_reference, on_result)
    ceilings.append(bf16_ceiling_gflops())
    # The ceiling is measured before every group and at the end (shared machines drift): the median of those.
    ceiling = statistics.median(ceilings)
    for r in results:
        r.ceiling_gflops = ceiling
    return hardware(ceiling), results
