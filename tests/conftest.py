"""Shared fixtures: every CPU kernel test runs once per ISA tier this machine supports."""

from __future__ import annotations

import pytest
import torch

import dsv4
from dsv4.rope import rope_cos_sin_cache

ALL_ISAS = dsv4.CPU_ISAS
SUPPORTED_ISAS = tuple(torch.ops.dsv4.supported_cpu_isas().split(","))
# With a GPU and dsv4._C_cuda, every tier-parametrized test also runs on CUDA: "cuda" (the best tier of the
# device) and "cuda-portable" (the portable tier forced), on the same inputs, references and tolerances.
CUDA_TIERS = ("cuda", "cuda-portable") if dsv4.cuda_available() and torch.cuda.is_available() else ()
PAGE_SIZES = (1, 2, 61, 64, 256)  # block sizes every paged-cache test covers
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_POSITION = 300  # rows of the RoPE table in the rope op tests
BOUNDARY_POSITIONS = (0, 127, 128, MAX_POSITION - 1)  # window / compression edges and the table's end


def pytest_report_header(config):
    return (f"dsv4 {dsv4.__version__}: CPU tiers tested here: {', '.join(SUPPORTED_ISAS)}; "
            f"CUDA tiers: {', '.join(CUDA_TIERS) or 'none'}")


@pytest.fixture(params=ALL_ISAS + CUDA_TIERS)
def isa(request, monkeypatch):
    """Forces one CPU tier for the test (skipped when this CPU lacks it), then restores auto. A CUDA tier runs
    every ``dsv4.ops`` call of the test on the GPU instead (cuda_shuttle.py)."""
    if request.param in CUDA_TIERS:
        from helpers.cuda_shuttle import run_ops_on_cuda

        if request.param == "cuda-portable":
            monkeypatch.setenv("DSV4_CUDA_TIER", "portable")
        run_ops_on_cuda(monkeypatch)
        yield request.param
        return
    if request.param not in SUPPORTED_ISAS:
        pytest.skip(f"CPU tier {request.param} is not supported on this machine")
    torch.ops.dsv4._set_cpu_isa(request.param)
    yield request.param
    torch.ops.dsv4._set_cpu_isa("auto")


@pytest.fixture(params=("cpu",) + (("cuda",) if CUDA_TIERS else ()))
def opcheck(request):
    """torch.library.opcheck on the given arguments, on the CPU and (when present) on CUDA copies of them with
    the same strides and storage layout."""

    def run(op, args, **kwargs):
        if request.param == "cuda":
            from helpers.cuda_shuttle import GpuTwins

            args = GpuTwins().to_gpu(tuple(args))
        torch.library.opcheck(op, args, **kwargs)

    return run


@pytest.fixture
def restore_threads():
    """Restores torch's intra-op thread count after a test that sets it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


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


def distinct_slots(num_slots: int, capacity: int, skip_fraction: float | None = None, *, skip_every: int | None = None,
                   index_dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Slot ids, no two alike (so no two tokens write one entry), some of them -1: about skip_fraction of them at
    random or, with skip_every, exactly every skip_every-th one from the second on."""
    slots = torch.randperm(capacity)[:num_slots]
    if skip_every is None:
        slots[torch.rand(num_slots) < skip_fraction] = -1
    else:
        slots[1::skip_every] = -1
    return slots.to(index_dtype)


def random_positions(tokens: int, index_dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Random positions below MAX_POSITION whose first ones are BOUNDARY_POSITIONS."""
    positions = torch.randint(0, MAX_POSITION, (tokens,))
    edges = torch.tensor(BOUNDARY_POSITIONS[:tokens])
    positions[: len(edges)] = edges
    return positions.to(index_dtype)


def with_last(t: torch.Tensor, value: int) -> torch.Tensor:
    """A copy of t with its last entry set to value (an out-of-range index for the bad-input tests)."""
    t = t.clone()
    t[-1] = value
    return t


def rope_table(max_pos: int, rope_dim: int = 64, base: float = 10000.0) -> torch.Tensor:
    """fp32 [max_pos, rope_dim]: cos in the first half, sin in the second."""
    return rope_cos_sin_cache(max_pos, rope_dim, base)


def entry_byte_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int, region_start: int,
                     entry_bytes: int) -> torch.Tensor:
    """Indices into storage_bytes(cache) [N, entry_bytes] of each slot's entry in one region of a paged byte cache
    (page stride cache.stride(0)): the region starts region_start bytes into the page, entries are entry_bytes."""
    page_start = cache.storage_offset() + (slots // block_size) * cache.stride(0) + region_start
    return page_start[:, None] + (slots % block_size)[:, None] * entry_bytes + torch.arange(entry_bytes)


def assert_equal_outside(actual: torch.Tensor, expected: torch.Tensor, written: list[torch.Tensor],
                         message: str = "bytes outside the written entries changed") -> None:
    """Every byte of the storage behind actual, padding included, equals expected's except at the storage byte
    indices in written."""
    got, want = storage_bytes(actual), storage_bytes(expected)
    keep = torch.ones_like(got, dtype=torch.bool)
    for index in written:
        keep[index] = False
    assert torch.equal(got[keep], want[keep]), message


def assert_rejects(op, args: dict, message: str, *, unchanged: tuple[str, ...] = ()) -> None:
    """op(**args) raises a RuntimeError matching the regex message, and writes no byte of the storage behind the
    arguments named in unchanged."""
    before = {name: storage_bytes(args[name]).clone() for name in unchanged}
    with pytest.raises(RuntimeError, match=message):
        op(**args)
    for name, saved in before.items():
        assert torch.equal(storage_bytes(args[name]), saved), f"a rejected call must not write {name!r}"


def replaced(**changes):
    """A bad-input corruption that sets the given arguments."""
    return lambda args: args.update(changes)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-element distance, in representable steps, between two tensors of one float dtype (fp8 to fp32)."""
    int_dtype, magnitude = {1: (torch.int8, 0x7F), 2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF)}[
        a.element_size()
    ]

    def ordinal(t: torch.Tensor) -> torch.Tensor:  # sign-magnitude bits -> a monotonic integer line
        bits = t.contiguous().view(int_dtype).long()
        return torch.where(bits < 0, -(bits & magnitude), bits)

    return (ordinal(a) - ordinal(b)).abs()


def pytest_terminal_summary(terminalreporter):
    """Skips counted per reason, one line each (a tier this CPU lacks is one line, not one per test)."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skipped, by reason")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:6d}  {reason}")
