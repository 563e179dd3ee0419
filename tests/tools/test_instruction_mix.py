"""tools/perf/instruction_mix.py on the built library: a build compared with itself shows no change, and the AMX
tier's sparse attention holds tile products."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import dsv4
from tools.perf import instruction_mix

LIBRARY = str(Path(dsv4.__file__).parent / "_C.abi3.so")
pytestmark = pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump on this machine")


def test_amx_tier_has_tile_products():
    mixes = instruction_mix.function_mixes(LIBRARY, "amx")
    attention = [mix for name, mix in mixes.items() if instruction_mix.family(name) == "run_sparse_attention"]
    assert attention and sum(mix["tdpbf16ps"] for mix in attention) > 0


def test_same_build_compares_equal():
    mixes = instruction_mix.function_mixes(LIBRARY, "avx512dot")
    for line in instruction_mix.compare(mixes, mixes)[1:]:
        counts = line.split()[1:]
        assert all(a == b for a, b in (c.split("->") for c in counts)), line
