"""Wall-clock time per named step (the per-op breakdown of the demo and the layer benchmark)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext


class OpTimer:
    """``with timer("op"): ...`` accumulates seconds and calls per name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.calls[name] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


class NullTimer:
    """Times nothing (the default of the layer)."""

    def __call__(self, name: str):
        return nullcontext()


NULL_TIMER = NullTimer()
