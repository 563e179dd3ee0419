"""Argument checks of the reference-backed ops: every failure is a RuntimeError naming the op and the argument.

Messages follow the C++ checks (csrc/api/checks.h): "dsv4::<op>: argument '<name>' must ..., got ...".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..constants import PAGE_ALIGNMENTS

INDEX_DTYPES = (torch.int32, torch.int64)
CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


def fail(op: str, name: str, expectation: str, got) -> None:
    raise RuntimeError(f"dsv4::{op}: argument '{name}' must {expectation}, got {got}")


def check(cond: bool, op: str, name: str, expectation: str, got) -> None:
    if not cond:
        fail(op, name, expectation, got)


def check_dtype(op: str, name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype]) -> None:
    allowed = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
    check(t.dtype in dtypes, op, name, f"have dtype {allowed}", str(t.dtype).removeprefix("torch."))


def check_dim(op: str, name: str, t: torch.Tensor, dim: int) -> None:
    check(t.dim() == dim, op, name, f"have {dim} dimensions", f"shape {list(t.shape)}")


def check_shape(op: str, name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """Rank and sizes; None in ``shape`` accepts any size in that dimension."""
    check_dim(op, name, t, len(shape))
    wanted = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    ok = all(s is None or s == n for s, n in zip(shape, t.shape, strict=True))
    check(ok, op, name, f"have shape {wanted}", f"shape {list(t.shape)}")


def check_tensor(op: str, name: str, t: torch.Tensor, dtypes: Sequence[torch.dtype], shape: Sequence[int | None]):
    check_dtype(op, name, t, dtypes)
    check_shape(op, name, t, shape)


def check_optional(op: str, name: str, t: torch.Tensor | None, dtypes, shape) -> None:
    if t is not None:
        check_tensor(op, name, t, dtypes, shape)


def check_last_dim_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    ok = t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1
    check(ok, op, name, "be contiguous in its last dimension", f"strides {list(t.stride())}")


def check_positive(op: str, name: str, value: int) -> None:
    check(value > 0, op, name, "be positive", value)


def check_paged_cache(op: str, name: str, cache: torch.Tensor, block_size: int, bytes_per_entry: int,
                      block_size_name: str = "block_size") -> None:
    """A byte cache [num_blocks, ...]: trailing dims contiguous, pages large enough; stride(0) is free."""
    check_dtype(op, name, cache, CACHE_DTYPES)
    check(cache.dim() >= 2, op, name, "be a paged cache [num_blocks, ...] with at least 2 dimensions",
          f"shape {list(cache.shape)}")
    check_positive(op, block_size_name, block_size)
    expected_stride = 1
    for d in range(cache.dim() - 1, 0, -1):
        check(cache.shape[d] == 1 or cache.stride(d) == expected_stride, op, name,
              "be contiguous after its first dimension (only the page stride is free)",
              f"strides {list(cache.stride())}")
        expected_stride *= cache.shape[d]
    check(expected_stride >= block_size * bytes_per_entry, op, name,
          f"have pages of at least {block_size * bytes_per_entry} bytes (block_size {block_size} x {bytes_per_entry})",
          f"{expected_stride} bytes per page")
    # The cache carries its geometry, as the kernels' bindings require: an entry axis names block_size, and a page is
    # exactly block_size entries, unpadded or padded to one of the engines' alignments.
    check(cache.dim() < 3 or cache.shape[1] == block_size, op, name,
          f"have {block_size} entries per page in dimension 1 ({block_size_name})", f"shape {list(cache.shape)}")
    raw = block_size * bytes_per_entry
    pages = sorted({raw, *(math.ceil(raw / a) * a for a in PAGE_ALIGNMENTS)})
    check(expected_stride in pages, op, name,
          f"have pages of {' or '.join(map(str, pages))} bytes ({block_size_name} {block_size} x {bytes_per_entry}, "
          f"unpadded or padded to a multiple of {' or '.join(map(str, PAGE_ALIGNMENTS))})",
          f"{expected_stride} bytes per page")
    check(cache.shape[0] <= 1 or cache.stride(0) >= expected_stride, op, name,
          "have a page stride no smaller than the page", f"stride {cache.stride(0)} for {expected_stride}-byte pages")
