"""Benchmark cases of the indexer ops (added with their CPU kernels)."""

from __future__ import annotations

from . import Case


def cases(quick: bool = False) -> list[Case]:
    return []
