"""The vLLM peer for the parity tests (not a test file); CI requires it to be installed, and to load wherever the
CPU can run it."""

from __future__ import annotations

import functools
import os

from dsv4.compat.vllm_peer import CPU_CANNOT_RUN
from dsv4.compat.vllm_peer import load_peer_reason as _load_peer_reason

REQUIRE_PEER_ENV = "DSV4_REQUIRE_PEER"  # CI sets it: a missing peer fails instead of skipping


@functools.cache
def load_peer_reason() -> tuple[object | None, str]:
    """(``torch.ops._C`` with vLLM's ops, "") or (None, why not); raises when the peer is required and absent for
    any reason but a CPU that cannot run its kernels (there the tests skip)."""
    peer, reason = _load_peer_reason()
    cpu_cannot_run = reason.startswith(CPU_CANNOT_RUN)  # the probe's calls died of a signal (SIGILL)
    if peer is None and os.environ.get(REQUIRE_PEER_ENV) == "1" and not cpu_cannot_run:
        raise RuntimeError(f"${REQUIRE_PEER_ENV}=1 but the vLLM peer is unavailable: {reason}")
    return peer, reason
