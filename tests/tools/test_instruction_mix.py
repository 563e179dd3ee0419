"""tools/perf/instruction_mix.py on the built library: a build compared with itself shows no change, and each tier
holds the products it is built for."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import dsv4
from tools.perf import instruction_mix

LIBRARY = str(Path(dsv4.__file__).parent / "_C.abi3.so")
pytestmark = pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump on this machine")


def test_tiers_have_their_products():
    """Tile products in the AMX tier, vdpbf16ps in avx512dot (however the build inlined them)."""
    assert sum(mix["tdpbf16ps"] for mix in instruction_mix.function_mixes(LIBRARY, "amx").values()) > 0
    assert sum(mix["vdpbf16ps"] for mix in instruction_mix.function_mixes(LIBRARY, "avx512dot").values()) > 0
    assert sum(mix["tdpbf16ps"] for mix in instruction_mix.function_mixes(LIBRARY, "avx512dot").values()) == 0


def test_same_build_compares_equal():
    mixes = instruction_mix.function_mixes(LIBRARY, "avx512dot")
    for line in instruction_mix.compare(mixes, mixes)[1:]:
        counts = line.split()[1:]
        assert all(a == b for a, b in (c.split("->") for c in counts)), line
