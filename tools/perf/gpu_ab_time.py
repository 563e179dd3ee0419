"""Same-run A/B timing of the CUDA attention ops across builds (tools/perf/ab.sh gpu).

``time PYTHON_DIR NAME ROUND [CASE...]`` imports dsv4 from PYTHON_DIR (one build's package), times each named case
cold (``dsv4.bench.gpu.time_cold``: CUDA-graph replays after an L2 flush, median) and prints one line per case with
a hash of its outputs, so that variants meant to give the same bits can be checked. ``table LOG`` reads those lines
back: per case, each build's rounds side by side, its median against the first build's, and whether its outputs
equal the first build's bit for bit. ``run PYTHON_DIR CASE [REPEATS]`` only runs one case REPEATS times (default 3),
for a profiler (tools/perf/gpu_profile.sh).
"""

from __future__ import annotations

import hashlib
import re
import statistics
import sys
from collections import defaultdict

# name: (constructor in dsv4.bench.gpu, arguments, replays)
CASES = {
    "pf64": ("prefill_case", (4096, 64, 640), 15),
    "pf128": ("prefill_case", (4096, 128, 1152), 10),
    "fp8pf64": ("fp8_prefill_cases", (4096, 64, 512), 10),
    "B1": ("decode_case", (1, 64, 512, "V4-Flash"), 30),
    "B8": ("decode_case", (8, 64, 512, "V4-Flash"), 30),
    "B32": ("decode_case", (32, 64, 512, "V4-Flash"), 30),
    "B128": ("decode_case", (128, 64, 512, "V4-Flash"), 30),
    "B256": ("decode_case", (256, 64, 512, "V4-Flash"), 30),
    "B512": ("decode_case", (512, 64, 512, "V4-Flash"), 20),
    "P1": ("decode_case", (1, 128, 1024, "V4-Pro"), 30),
    "P128": ("decode_case", (128, 128, 1024, "V4-Pro"), 20),
    "H16": ("decode_case", (128, 16, 512, "V4-Flash TP4"), 30),
}
DEFAULT_CASES = ("pf64", "pf128", "B1", "B128", "B512", "P128")
LINE = re.compile(r"^(\S+) r(\d+) (\S+) ([\d.]+) us hash (\S+)$")


def output_hash(out) -> str:
    import torch

    tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
    digest = hashlib.md5()
    for t in tensors:
        digest.update(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()[:12]


def time_cases(python_dir: str, name: str, round_: int, names: list[str]) -> None:
    sys.path.insert(0, python_dir)
    import torch

    from dsv4.bench import gpu

    for label in names:
        case = make_case(label)
        out = case.run()
        torch.cuda.synchronize()
        replays = CASES[label][2]
        print(f"{name} r{round_} {label} {gpu.time_cold(case, replays):.1f} us hash {output_hash(out)}", flush=True)
        del case, out
        torch.cuda.empty_cache()


def make_case(label: str):
    """The case of CASES named `label`, built on fresh random inputs (seed 0); the direct route of fp8 prefill."""
    import torch

    from dsv4.bench import gpu

    make, args, _ = CASES[label]
    torch.manual_seed(0)
    made = getattr(gpu, make)(*args)
    return made[0] if isinstance(made, list) else made


def run_case(python_dir: str, label: str, repeats: int) -> None:
    sys.path.insert(0, python_dir)
    import torch

    case = make_case(label)
    for _ in range(repeats):
        case.run()
    torch.cuda.synchronize()


def parse(lines: list[str]) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], set[str]]]:
    """({(case, build): [us per round]}, {(case, build): {output hashes}}) from the time lines of a log."""
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    hashes: dict[tuple[str, str], set[str]] = defaultdict(set)
    for line in lines:
        if m := LINE.match(line.strip()):
            build, _, case, us, digest = m.groups()
            times[(case, build)].append(float(us))
            hashes[(case, build)].add(digest)
    return times, hashes


def table(times: dict[tuple[str, str], list[float]], hashes: dict[tuple[str, str], set[str]]) -> str:
    cases = list(dict.fromkeys(case for case, _ in times))
    builds = list(dict.fromkeys(build for _, build in times))
    rows = [["case", *builds]]
    for case in cases:
        base = times.get((case, builds[0]))
        row = [case]
        for build in builds:
            rounds = times.get((case, build))
            if not rounds:
                row.append("-")
                continue
            cell = " / ".join(f"{t:.1f}" for t in rounds)
            if build != builds[0] and base:
                ratio = statistics.median(rounds) / statistics.median(base)
                same = hashes[(case, build)] == hashes[(case, builds[0])]
                cell += f" ({ratio:.3f}x{'' if same else ', other bits'})"
            row.append(cell)
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "time":
        unknown = [label for label in argv[4:] if label not in CASES]
        if unknown:  # before any case runs: a typo must not cost the cases before it
            print(f"unknown case(s) {' '.join(unknown)}; known: {' '.join(CASES)}", file=sys.stderr)
            return 2
        time_cases(argv[1], argv[2], int(argv[3]), argv[4:] or list(DEFAULT_CASES))
        return 0
    if len(argv) in (3, 4) and argv[0] == "run" and argv[2] in CASES:
        run_case(argv[1], argv[2], int(argv[3]) if len(argv) == 4 else 3)
        return 0
    if len(argv) == 2 and argv[0] == "table":
        with open(argv[1]) as log:
            print(table(*parse(log.readlines())))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
