"""``python -m dsv4 info | demo | bench``: build information, the DeepSeek-V4 attention demo, benchmarks."""

from __future__ import annotations

import argparse
import json
import sys

import dsv4

from .bench import GROUPS as BENCH_GROUPS
from .model.config import PRESETS

# Demo defaults: a long prompt past the short-context bound (2052 tokens; the indexer selects 512 of its
# entries) plus shorter ones, chunked under a 1024-token step budget; V4-Flash layers 0-3 (all three types).
DEMO_PROMPTS = "2200,700,300,100"
DEMO_DECODE_STEPS = 32
DEMO_LAYERS = 4
DEMO_STEP_TOKENS = 1024


def info(as_json: bool) -> None:
    data = dsv4.build_info()
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for key, value in data.items():
        print(f"{key:26s} {value}")


def prompt_lengths(text: str) -> list[int]:
    """``--prompts``: comma-separated positive token counts."""
    try:
        lengths = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token counts such as 2200,700, got {text!r}") from None
    if min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"prompt lengths must be positive, got {text!r}")
    return lengths


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4", description=__doc__.replace("``", "'"))
    parser.add_argument("--version", action="version", version=f"dsv4 {dsv4.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = argparse.ArgumentDefaultsHelpFormatter
    p_info = sub.add_parser("info", help="version, torch, CPU tiers, threads, CUDA kernels")
    p_info.add_argument("--json", action="store_true", help="print the build information as JSON")
    p_demo = sub.add_parser("demo", help="DSv4-Flash attention layers: prefill + decode of a batch, checked",
                            formatter_class=defaults)
    p_demo.add_argument("--prompts", type=prompt_lengths, default=DEMO_PROMPTS,
                        help="comma-separated prompt lengths, one per request")
    p_demo.add_argument("--decode-steps", type=positive, default=DEMO_DECODE_STEPS,
                        help="decode steps after the prefill (one token per request each)")
    p_demo.add_argument("--layers", type=positive, default=argparse.SUPPRESS,
                        help=f"first N layers of the preset ({DEMO_LAYERS}, or all if it has fewer)")
    p_demo.add_argument("--step-tokens", type=positive, default=DEMO_STEP_TOKENS,
                        help="prefill tokens per step (the chunked-prefill budget)")
    p_demo.add_argument("--preset", default="v4-flash", choices=sorted(PRESETS), help="model shape")
    p_demo.add_argument("--seed", type=int, default=0, help="seed of the random weights and inputs")
    p_demo.add_argument("--kv-cache-dtype", choices=["fp8", "nvfp4_ds_mla"], default=argparse.SUPPRESS,
                        help="V4.1 presets: the engines' kv-cache dtype (nvfp4_ds_mla: fp4 compressed caches; "
                             "default: the preset's)")
    p_demo.add_argument("--index-key-format", choices=["fp8", "mxfp4"], default=argparse.SUPPRESS,
                        help="V4.1 presets: the indexer keys (default: the preset's)")
    p_bench = sub.add_parser("bench", help="time the CPU ops against the reference and the vLLM peer")
    p_bench.add_argument("--op", choices=["all", *BENCH_GROUPS, "gpu"], default="all",
                         help="a CPU case group, all of them, or gpu (the CUDA kernels on the current GPU)")
    p_bench.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    p_bench.add_argument("--no-reference", action="store_true", help="skip timing the (slow) references")
    p_bench.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        info(args.json)
    elif args.command == "demo":
        from .model.demo import run_demo

        layers = len(PRESETS[args.preset].compress_ratios)
        requested = getattr(args, "layers", None)  # absent: the default depends on the preset
        if requested is not None and requested > layers:
            p_demo.error(f"--layers {requested}: the {args.preset} preset has {layers} layers")
        num_layers = requested or min(DEMO_LAYERS, layers)
        chosen = ("kv_cache_dtype", "index_key_format")
        overrides = {name: getattr(args, name) for name in chosen if hasattr(args, name)}
        if overrides and PRESETS[args.preset].model_version != "v4.1":
            p_demo.error(f"--kv-cache-dtype and --index-key-format choose V4.1 records; {args.preset} is a V4.0 preset")
        passed = run_demo(args.prompts, args.decode_steps, num_layers, args.step_tokens, args.preset, args.seed,
                          **overrides)
        print("check passed" if passed else "check FAILED")
        return 0 if passed else 1
    elif args.command == "bench":
        from . import bench

        if args.op == "gpu":
            from .bench import gpu

            print(gpu.main(args.quick, args.json))
            return 0
        groups = list(BENCH_GROUPS) if args.op == "all" else [args.op]
        if not args.json:  # the hardware first, then each case as it finishes (a full run takes minutes)
            print(bench.hardware_lines(bench.hardware()), flush=True)
            count = iter(range(1, 1 << 30))
            on_result = lambda result: print(bench.progress_line(next(count), result), file=sys.stderr, flush=True)  # noqa: E731
        hardware, results = bench.run(groups, quick=args.quick, with_reference=not args.no_reference,
                                      on_result=None if args.json else on_result)
        print(bench.report(hardware, results, args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
