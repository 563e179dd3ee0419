"""The latency floor of a small decode call on this GPU: what a CUDA-graph replay costs after the bench's L2 flush
when it runs an empty kernel, a chain of dependent cold loads, or two kernels in a row (Triton kernels, one
thread each; medians of cold and warm replays in microseconds).

A small-batch decode is such a chain (plan words -> lengths -> index values -> codes, then the combine kernel), so
these numbers bound how fast any kernel of that structure can answer.

    python tools/perf/latency_floor.py [--replays N]
"""

from __future__ import annotations

import argparse
import sys

import torch

from dsv4.bench.gpu import L2_FLUSH_BYTES, replay_us

try:  # not a dsv4 dependency: torch's CUDA wheels for Linux bring it
    import triton
    import triton.language as tl
except ImportError:
    triton = None

BUFFER_INTS = 1 << 27  # 512 MB per link of the chain: every load a TLB and L2 miss
SPIN_CYCLES = 200_000


if triton is not None:  # without it, main() says so

    @triton.jit
    def chase(p0, p1, p2, p3, p4, out, STEPS: tl.constexpr):
        i = tl.load(p0)
        if STEPS >= 2:
            i = tl.load(p1 + i)
        if STEPS >= 3:
            i = tl.load(p2 + i)
        if STEPS >= 4:
            i = tl.load(p3 + i)
        if STEPS >= 5:
            i = tl.load(p4 + i)
        tl.store(out, i)

    @triton.jit
    def empty(out):
        tl.store(out, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=40)
    args = parser.parse_args()
    if triton is None:
        sys.exit("latency_floor: needs triton (pip install triton; torch's CUDA wheels for Linux bring it)")
    links = [torch.randint(0, BUFFER_INTS, (BUFFER_INTS,), device="cuda", dtype=torch.int32) for _ in range(5)]
    out = torch.zeros(1, device="cuda", dtype=torch.int32)
    flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    cases = {"empty kernel": lambda: empty[(1,)](out),
             "two empty kernels": lambda: (empty[(1,)](out), empty[(1,)](out))}
    for steps in range(1, 6):
        cases[f"{steps} dependent loads"] = lambda steps=steps: chase[(1,)](*links, out, STEPS=steps)
    cases["2 loads, then a kernel of 2 loads"] = lambda: (chase[(1,)](*links, out, STEPS=2),
                                                          chase[(1,)](*links[2:], *links[:2], out, STEPS=2))
    print(f"gpu={torch.cuda.get_device_name()}  flush={L2_FLUSH_BYTES >> 20} MB  replays={args.replays}  (us)")
    for name, fn in cases.items():  # warm: behind a spin kernel, so that the host's submission is not timed
        cold = replay_us(fn, args.replays, flush.zero_)
        warm = replay_us(fn, args.replays, lambda: torch.cuda._sleep(SPIN_CYCLES))
        print(f"{name:36s} cold {cold:7.2f}   warm {warm:7.2f}")


if __name__ == "__main__":
    main()
