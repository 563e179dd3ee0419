"""Filters an nvcc -Xptxas=-v build log down to registers / stack / spills per function of one architecture.

Usage: ptxas_report.py LOG [--arch sm_90a]. Prints one line per function compiled for that architecture and exits
1 when any of them spills (spill stores or loads > 0), has its wgmma instructions serialized (ptxas C751x, e.g. too
few registers for the wgmma pipeline: each product then waits for the one before) or has its setmaxnreg dropped
(C7507: ptxas keeps the launch's register count instead), 0 otherwise. None of these shows as a spill.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '([^']+)' for '([^']+)'")
PROPERTIES = re.compile(r"ptxas info\s*: Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
REGISTERS = re.compile(r"ptxas info\s*: Used (\d+) registers")
SERIALIZED = re.compile(r"wgmma\.mma_async instructions are serialized.*function '([^']+)'")
SETMAXNREG_IGNORED = re.compile(r"'setmaxnreg' ignored")


@dataclass
class Function:
    name: str
    entry: bool
    registers: int | None = None
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    serialized: bool = False
    setmaxnreg_ignored: bool = False

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def parse(lines, arch: str) -> list[Function]:
    """Functions compiled for `arch`; a device function counts for the arch of the last entry seen (or for `arch`
    when no entry came before it), so feed it the log of one architecture's build when device functions matter."""
    functions: dict[str, Function] = {}
    current_arch = None
    entry: Function | None = None
    pending: str | None = None  # the function whose "Function properties" line came last
    for line in lines:
        if m := ENTRY.search(line):
            current_arch = m.group(2)
            entry = functions.setdefault(m.group(1), Function(m.group(1), True)) if current_arch == arch else None
        elif m := PROPERTIES.search(line):
            pending = m.group(1)
        elif (m := FRAME.search(line)) and pending is not None:
            if current_arch in (None, arch):
                fn = functions.setdefault(pending, Function(pending, entry is not None and entry.name == pending))
                fn.stack, fn.spill_stores, fn.spill_loads = (int(g) for g in m.groups())
            pending = None
        elif (m := REGISTERS.search(line)) and entry is not None:
            entry.registers = int(m.group(1))
        elif (m := SERIALIZED.search(line)) and current_arch in (None, arch):
            # the message names the function: the entry being compiled or a function it calls
            functions.setdefault(m.group(1), Function(m.group(1), entry is not None and entry.name == m.group(1)))
            functions[m.group(1)].serialized = True
        elif SETMAXNREG_IGNORED.search(line) and entry is not None:
            entry.setmaxnreg_ignored = True
    return list(functions.values())


def demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if cxxfilt is None or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=False).stdout
    pretty = out.splitlines()
    return dict(zip(names, pretty, strict=False)) if len(pretty) == len(names) else {n: n for n in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--arch", default="sm_90a")
    args = parser.parse_args()
    functions = parse(args.log.read_text(errors="replace").splitlines(), args.arch)
    names = demangle([f.name for f in functions])
    for f in sorted(functions, key=lambda f: names[f.name]):
        regs = "-" if f.registers is None else str(f.registers)
        kind = "kernel" if f.entry else "device"
        serial = "  wgmma serialized" if f.serialized else ""
        serial += "  setmaxnreg ignored" if f.setmaxnreg_ignored else ""
        print(f"{args.arch} {kind} regs {regs:>3} stack {f.stack:>5} B spill st/ld {f.spill_stores}/{f.spill_loads} B"
              f"{serial}  {names[f.name]}")
    failed = 0
    spilling = [names[f.name] for f in functions if f.spills]
    if spilling:
        print(f"ptxas_report: {len(spilling)} {args.arch} function(s) spill: {'; '.join(spilling)}", file=sys.stderr)
        failed = 1
    serialized = [names[f.name] for f in functions if f.serialized]
    if serialized:
        print(f"ptxas_report: wgmma serialized in {'; '.join(serialized)}", file=sys.stderr)
        failed = 1
    ignored = [names[f.name] for f in functions if f.setmaxnreg_ignored]
    if ignored:
        print(f"ptxas_report: setmaxnreg ignored in {'; '.join(ignored)}", file=sys.stderr)
        failed = 1
    if not failed:
        print(f"ptxas_report: {len(functions)} {args.arch} function(s), none spills, no wgmma serialized, "
              "setmaxnreg kept")
    return failed


if __name__ == "__main__":
    sys.exit(main())
