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


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage behind a (possibly strided) view, padding included, sharing memory."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def clone_storage(t: torch.Tensor) -> torch.Tensor:
    """A copy of t over a copy of its whole storage: same strides, same bytes in the padding."""
    copy = storage_bytes(t).clone().view(t.dtype)
    return copy.as_strided(t.shape, t.stride(), t.storage_offset())


def column_slice(values: torch.Tensor, extra_columns: int = 64) -> torch.Tensor:
    """values [rows, cols] as a column slice of a wider random tensor (a fused projection's output)."""
    wide = torch.randint(-100, 100, (values.shape[0], values.shape[1] + extra_columns)).to(values.dtype)
    view = wide[:, extra_columns // 2 : extra_columns // 2 + values.shape[1]]
    view.copy_(values)
    return view


def distinct_slots(num_slots: int, capacity: int, skip_fraction: float) -> torch.Tensor:
    """int64 slot ids, no two alike (so no two tokens write one entry), about skip_fraction of them -1."""
    slots = torch.randperm(capacity)[:num_slots]
    slots[torch.rand(num_slots) < skip_fraction] = -1
    return slots


def rope_table(max_pos: int, rope_dim: int = 64, base: float = 10000.0) -> torch.Tensor:
    """fp32 [max_pos, rope_dim]: cos in the first half, sin in the second."""
    inv_freq = base ** (-torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=1).float()


def pages_with_padding(cache: torch.Tensor) -> torch.Tensor:
    """The whole [num_blocks, stride(0)] allocation behind a random_pages cache, padding bytes included."""
    return cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element distance, in representable steps, between two tensors of one float dtype (fp8 to fp32)."""
    int_dtype, magnitude = {1: (torch.int8, 0x7F), 2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF)}[
        a.element_size()
    ]

    def ordinal(t: torch.Tensor) -> torch.Tensor:  # sign-magnitude bits -> a monotonic integer line
        bits = t.contiguous().view(int_dtype).long()
        return torch.where(bits < 0, -(bits & magnitude), bits)

    return (ordinal(a) - ordinal(b)).abs()
