"""Instruction mix of one CPU tier's kernels in two builds of ``_C``: how a change moved the instructions of a tier
this machine cannot run (the AMX tier on an AMD CPU), function by function, from ``objdump -d``.

    python tools/perf/instruction_mix.py OLD/_C.abi3.so NEW/_C.abi3.so --tier amx
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess

# The products and the data movement around them: what a kernel change should or should not touch.
WATCHED = ("tdpbf16ps", "tileloadd", "tilestored", "tilezero", "vdpbf16ps", "vfmadd231ps", "vpbroadcastd",
           "prefetcht0", "prefetcht1")
FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def function_mixes(library: str, tier: str) -> dict[str, collections.Counter]:
    """Mnemonic counts of every function of namespace dsv4::cpu::<tier> in the library."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", library], capture_output=True, text=True,
                             check=True).stdout
    mixes: dict[str, collections.Counter] = {}
    current = None
    for line in listing.splitlines():
        header = FUNCTION.match(line)
        if header:
            current = header.group(1) if header.group(1).startswith(f"dsv4::cpu::{tier}::") else None
            if current:
                mixes[current] = collections.Counter()
        elif current and "\t" in line:
            fields = line.split("\t")
            if len(fields) >= 2 and fields[1].strip():
                mixes[current][fields[1].split()[0]] += 1
    return mixes


def family(function: str) -> str:
    """The kernel a function belongs to: its name up to the first template or argument list, without the tier."""
    name = function.split("::", 3)[-1]
    return re.split(r"[<(]", name, maxsplit=1)[0]


def compare(old: dict[str, collections.Counter], new: dict[str, collections.Counter]) -> list[str]:
    def by_family(mixes):
        totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for function, mix in mixes.items():
            totals[family(function)] += mix
        return totals

    before, after = by_family(old), by_family(new)
    lines = [f"{'kernel':40s} {'instructions':>17s}  " + "  ".join(f"{w:>13s}" for w in WATCHED)]
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name, collections.Counter()), after.get(name, collections.Counter())
        cells = "  ".join(f"{a[w]:>6d}->{b[w]:<6d}" for w in WATCHED)
        lines.append(f"{name[:40]:40s} {sum(a.values()):>8d}->{sum(b.values()):<8d}  {cells}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the _C library before the change")
    parser.add_argument("new", help="the _C library after it")
    parser.add_argument("--tier", default="amx", help="CPU tier namespace (default amx)")
    args = parser.parse_args(argv)
    print("\n".join(compare(function_mixes(args.old, args.tier), function_mixes(args.new, args.tier))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
