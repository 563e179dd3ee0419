"""``python -m dsv4 info | demo | bench``: build information, a demo of the cache writers, benchmarks."""

from __future__ import annotations

import argparse
import json
import sys

import torch

import dsv4

from . import cache, ops
from .constants import INDEXER_HEAD_DIM, MODEL1_HEAD_DIM


def info(as_json: bool) -> None:
    data = dsv4.build_info()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        print(f"{key:26s} {value}")


def _rope_table(max_pos: int, rope_dim: int = 64) -> torch.Tensor:
    inv_freq = 10000.0 ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def demo(num_tokens: int, num_heads: int) -> None:
    """Prefill one request through the SWA writer and the indexer K writer, then read the cache back."""
    torch.manual_seed(0)
    block_size = 64
    rope = _rope_table(4096)
    positions = torch.arange(num_tokens)
    alloc = cache.BlockAllocator(num_blocks=8, block_size=block_size)
    alloc.ensure_capacity(0, num_tokens)
    slots = alloc.slot_mapping(0, positions)
    swa_cache = cache.allocate_kv_cache(8, block_size)
    q = torch.randn(num_tokens, num_heads, MODEL1_HEAD_DIM).bfloat16()
    kv = torch.randn(num_tokens, MODEL1_HEAD_DIM).bfloat16()
    q_out = ops.qnorm_rope_kv_insert(q, kv, positions, rope, slots, swa_cache, block_size, padded_heads=num_heads)
    back = ops.dequantize_kv_gather(swa_cache, slots, block_size).float()
    # The cache holds RoPE(kv): compare its NoPE part (quantized) and measure the fp8 error.
    nope_err = ((back[:, :448] - kv.float()[:, :448]).abs().max() / kv.float()[:, :448].abs().max()).item()
    rms = q_out.float().pow(2).mean(-1).sqrt()
    print(f"cpu tier            {dsv4.cpu_isa()}")
    print(f"tokens x heads      {num_tokens} x {num_heads}, SWA page {swa_cache.stride(0)} B (block {block_size})")
    print(f"q rms after norm    min {rms.min().item():.4f} max {rms.max().item():.4f} (expect ~1)")
    print(f"SWA fp8 round trip  max relative NoPE error {nope_err:.4f} (e4m3: <= 1/16)")
    k_cache = cache.allocate_indexer_k_cache(8)
    k = torch.randn(num_tokens, INDEXER_HEAD_DIM).bfloat16()
    ops.indexer_k_quant_insert(k, slots, k_cache, 64)
    codes, scales = cache.quantize_indexer_k(k)
    page = k_cache[slots[0] // 64]
    print(f"indexer K entry 0   bytes match reference: {torch.equal(page[:128], codes[0])}, scale {scales[0].item()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="version, torch, CPU tiers, threads, CUDA kernels")
    p_info.add_argument("--json", action="store_true")
    p_demo = sub.add_parser("demo", help="run the KV-cache writers on a small prefill and check the bytes")
    p_demo.add_argument("--tokens", type=int, default=200)
    p_demo.add_argument("--heads", type=int, default=64)
    p_bench = sub.add_parser("bench", help="time the CPU ops against the reference and the vLLM peer")
    p_bench.add_argument("--op", choices=["all", "writers", "indexer", "attention"], default="all")
    p_bench.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    p_bench.add_argument("--no-reference", action="store_true", help="skip timing the (slow) references")
    p_bench.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "info":
        info(args.json)
    elif args.command == "demo":
        demo(args.tokens, args.heads)
    elif args.command == "bench":
        from . import bench

        groups = list(bench.GROUPS) if args.op == "all" else [args.op]
        hardware, results = bench.run(groups, quick=args.quick, with_reference=not args.no_reference)
        print(bench.report(hardware, results, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
