"""Every CPU kernel header is self-contained: it compiles on its own (g++ -fsyntax-only) with each tier's flags from
CMakeLists.txt, so an editor can parse it and its includes say what it uses."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import dsv4

ROOT = Path(__file__).resolve().parents[2]
HEADERS = sorted((ROOT / "csrc" / "cpu" / "kernels").rglob("*.h"))
TIERS = dsv4.CPU_ISAS


def tier_flags(tier: str) -> list[str]:
    """The -m flags CMakeLists.txt compiles the tier with (nested ${DSV4_ISA_FLAGS_x} expanded)."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    value = re.search(rf'set\(DSV4_ISA_FLAGS_{tier} ([^)]*)\)', cmake).group(1).strip('"')
    flags: list[str] = []
    for word in value.split():
        nested = re.fullmatch(r"\$\{DSV4_ISA_FLAGS_(\w+)\}", word)
        flags += tier_flags(nested.group(1)) if nested else [word]
    return flags


def tier_defines(tier: str) -> list[str]:
    """The extra definitions CMakeLists.txt gives the tier (DSV4_TIER_DEFS_<tier>), as -D flags."""
    found = re.search(rf'set\(DSV4_TIER_DEFS_{tier} ([^)]*)\)', (ROOT / "CMakeLists.txt").read_text())
    return [f"-D{name}" for name in found.group(1).split()] if found else []


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
@pytest.mark.parametrize("tier", TIERS)
def test_each_header_compiles_alone(tier):
    command = ["g++", "-std=c++17", "-fsyntax-only", f"-I{ROOT / 'csrc'}", f"-DDSV4_ISA={tier}", *tier_defines(tier),
               *tier_flags(tier), "-x", "c++", *map(str, HEADERS)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def test_every_op_is_exported_once_per_tier():
    """Each op of the op list has exactly one DSV4_CPU_KERNEL line, in its family's translation unit (a missing one
    would only show as an undefined symbol when _C loads)."""
    op_list = (ROOT / "csrc" / "common" / "op_list.h").read_text()
    ops = re.findall(r"^\s*X\((\w+),", op_list, re.MULTILINE)
    exported = [name for source in sorted((ROOT / "csrc" / "cpu" / "kernels").rglob("*.cpp"))
                for name in re.findall(r"^DSV4_CPU_KERNEL\((\w+),", source.read_text(), re.MULTILINE)]
    assert sorted(exported) == sorted(ops)
