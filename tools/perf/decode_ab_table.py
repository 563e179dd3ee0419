"""Table of a decode A/B log (tools/perf/ab.sh decode): the Hopper tier's median us per case and tree, one column per
tree with its rounds side by side."""

from __future__ import annotations

import re
import sys
from collections import defaultdict


def parse(lines: list[str]) -> dict[tuple[str, str], list[float]]:
    """{(case, tree): [us per round]} from the harness output between "=== tree round n" markers."""
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    tree = case = None
    for line in lines:
        if m := re.match(r"=== (\S+) round \d+$", line.strip()):
            tree = m.group(1)
        elif m := re.match(r"B=\d+ H=\d+ \d+\+\d+", line):
            case = m.group(0)
        elif (m := re.match(r"\s+sm90\s+([\d.]+) us", line)) and tree and case:
            times[(case, tree)].append(float(m.group(1)))
    return times


def table(times: dict[tuple[str, str], list[float]]) -> str:
    cases = list(dict.fromkeys(case for case, _ in times))
    trees = list(dict.fromkeys(tree for _, tree in times))
    rows = [["case", *trees]]
    rows += [[case, *(" / ".join(f"{t:.1f}" for t in times.get((case, tree), [])) or "-" for tree in trees)]
             for case in cases]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


if __name__ == "__main__":
    with open(sys.argv[1]) as log:
        print(table(parse(log.readlines())))
