"""Shared fixtures: every CPU kernel test runs once per ISA tier this machine supports."""

from __future__ import annotations

import pytest
import torch

import dsv4

ALL_ISAS = ("amx", "avx512", "avx2", "generic")
SUPPORTED_ISAS = tuple(torch.ops.dsv4.supported_cpu_isas().split(","))


def pytest_report_header(config):
    return f"dsv4 {dsv4.__version__}: CPU tiers tested here: {', '.join(SUPPORTED_ISAS)}"


@pytest.fixture(params=ALL_ISAS)
def isa(request):
    """Forces one CPU tier for the test (skipped when this CPU lacks it), then restores auto."""
    if request.param not in SUPPORTED_ISAS:
        pytest.skip(f"CPU tier {request.param} is not supported on this machine")
    torch.ops.dsv4._set_cpu_isa(request.param)
    yield request.param
    torch.ops.dsv4._set_cpu_isa("auto")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def random_pages(num_blocks: int, page_bytes: int, pad_bytes: int = 0) -> torch.Tensor:
    """A paged byte cache filled with random bytes; with pad_bytes > 0 the page stride exceeds the page."""
    full = torch.randint(0, 256, (num_blocks, page_bytes + pad_bytes), dtype=torch.uint8)
    return full[:, :page_bytes]


def rope_table(max_pos: int, rope_dim: int = 64, base: float = 10000.0) -> torch.Tensor:
    """fp32 [max_pos, rope_dim]: cos in the first half, sin in the second."""
    inv_freq = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()
