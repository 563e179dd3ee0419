"""Where a kernel's warps stall, from an Nsight Compute SASS export.

Reads the CSV of ``ncu --import REPORT --page source --csv --print-source sass`` (the first kernel in it) and
prints the stall reasons over all warp-state samples, the code regions with the most samples (a region is a run of
instructions executed equally often: one loop body, one role's start or end; instructions never executed join the
run they sit in) with their leading reasons, and the instructions with the most samples.

    python tools/perf/ncu_stalls.py SASS_CSV [--min-samples N] [--top N]
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys
from dataclasses import dataclass, field

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
REASON_PREFIX = "stall_"


@dataclass
class Instruction:
    index: int
    source: str
    executed: int
    samples: int
    reasons: collections.Counter


@dataclass
class Region:
    first: int
    last: int
    executed: int
    samples: int = 0
    reasons: collections.Counter = field(default_factory=collections.Counter)


def _count(text: str) -> int:
    return int(text.replace(",", "")) if text.strip() else 0


def read_instructions(lines: list[str]) -> list[Instruction]:
    """The instructions of the export's first kernel, in address order."""
    rows = list(csv.reader(lines))
    starts = [i for i, row in enumerate(rows) if row and row[0] == "Address"]
    if not starts:
        raise ValueError("no 'Address' header: not an ncu SASS source export")
    header = rows[starts[0]]
    column = {name: i for i, name in enumerate(header)}
    for name in (SAMPLES, EXECUTED, "Source"):
        if name not in column:
            raise ValueError(f"the export has no {name!r} column")
    reasons = [name for name in header if name.startswith(REASON_PREFIX) and not name.endswith("(Not Issued)")]
    end = next((i for i, row in enumerate(rows) if i > starts[0] and row and row[0] == "Kernel Name"), len(rows))
    out = []
    for row in rows[starts[0] + 1 : end]:
        if len(row) < len(header):
            continue
        counts = collections.Counter({name[len(REASON_PREFIX) :]: _count(row[column[name]]) for name in reasons})
        out.append(Instruction(len(out), row[column["Source"]].strip(), _count(row[column[EXECUTED]]),
                               _count(row[column[SAMPLES]]), +counts))
    return out


def regions(instructions: list[Instruction]) -> list[Region]:
    """Runs of instructions executed equally often (never-executed ones stay in the run around them)."""
    out: list[Region] = []
    for ins in instructions:
        if not out or (ins.executed and ins.executed != out[-1].executed):
            out.append(Region(ins.index, ins.index, ins.executed))
        region = out[-1]
        if not region.executed:
            region.executed = ins.executed
        region.last = ins.index
        region.samples += ins.samples
        region.reasons.update(ins.reasons)
    return out


def _reasons(counter: collections.Counter, n: int = 3) -> str:
    return ", ".join(f"{name} {count}" for name, count in counter.most_common(n))


def report(instructions: list[Instruction], min_samples: int, top: int) -> str:
    total = sum(ins.samples for ins in instructions)
    reasons: collections.Counter = collections.Counter()
    for ins in instructions:
        reasons.update(ins.reasons)
    lines = [f"{len(instructions)} instructions, {total} samples",
             "reasons: " + _reasons(reasons, 8), "", "regions (first-last, executed, samples, share, reasons):"]
    for r in regions(instructions):
        if r.samples >= min_samples:
            share = 100.0 * r.samples / total if total else 0.0
            span = f"{r.first:>6}-{r.last:<6}"
            lines.append(f"  {span} {r.executed:>9} {r.samples:>7} {share:5.1f}%  {_reasons(r.reasons)}")
    lines += ["", f"top {top} instructions (index, samples, executed, source, reasons):"]
    for ins in sorted(instructions, key=lambda i: -i.samples)[:top]:
        source = ins.source[:64]
        lines.append(f"  {ins.index:>6} {ins.samples:>6} {ins.executed:>9}  {source:<64}  {_reasons(ins.reasons, 2)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--min-samples", type=int, default=25, help="smallest region to list")
    parser.add_argument("--top", type=int, default=20, help="instructions to list")
    args = parser.parse_args(argv)
    with open(args.csv, newline="") as f:
        instructions = read_instructions(f.read().splitlines())
    print(report(instructions, args.min_samples, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
