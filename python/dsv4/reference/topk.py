"""Reference top-k transform: per-row top-k of fp32 scores, optionally translated to slots through a page table.

Top-k order (fully defined, so results compare as exact sequences): scores descending, ties by
lower index; every number (+inf .. -inf) ranks above every NaN. A row of length L <= k gives
``0 .. L-1`` then -1 without looking at its scores. This is the specification of
``torch.ops.dsv4.topk_transform``; ``topk_transform_op`` (argument checks + schema order) stands in for a missing
native kernel (ROCm).
"""

from __future__ import annotations

import torch

from .checks import INDEX_DTYPES, check, check_last_dim_contiguous, check_optional, check_positive, check_tensor

TOPK_SIZES = (512, 1024, 2048)
_NEG_INF = float("-inf")


def _best_k(scores: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor, k: int) -> torch.Tensor:
    """Positions (relative to the start) of the k best entries of rows with lens > k, in the module's order."""
    offsets = torch.arange(int(lens.max()))
    inside = offsets < lens[:, None]
    window = scores.gather(1, (starts[:, None] + offsets).clamp(max=scores.shape[1] - 1))
    nan = window.isnan()
    # Stable sorts: by score (NaN and outside as -inf), then by class (number 0, NaN 1, outside 2); index breaks ties.
    by_score = torch.sort(torch.where(nan | ~inside, _NEG_INF, window), dim=1, descending=True, stable=True).indices
    rank_class = torch.where(inside, nan.to(torch.int8), 2)
    by_class = torch.sort(rank_class.gather(1, by_score), dim=1, stable=True).indices
    return by_score.gather(1, by_class)[:, :k]


def _slots_through_pages(raw: torch.Tensor, page_table: torch.Tensor, page_size: int) -> torch.Tensor:
    """``page_table[r, i // page_size] * page_size + i % page_size``.

    -1 for raw -1, for a page index past the table and for a negative table entry.
    """
    page_index = raw.div(page_size, rounding_mode="floor")
    mapped = (raw >= 0) & (page_index < page_table.shape[1])
    if page_table.shape[1] == 0:
        return torch.full_like(raw, -1)
    pages = page_table.long().gather(1, page_index.clamp(0, page_table.shape[1] - 1))
    mapped &= pages >= 0
    return torch.where(mapped, pages * page_size + raw % page_size, -1)


def check_topk(op: str, name: str, k: int) -> None:
    check(k in TOPK_SIZES, op, name, f"select k in {TOPK_SIZES}", k)


def topk_transform(
    scores: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    row_starts: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(raw int32 ``[rows, k]``, slots int32 ``[rows, k]`` or None) per row of fp32 scores ``[rows, S]``.

    Row r considers ``scores[r, start : start + L]`` with start = ``row_starts[r]`` (0 without, clamped to
    ``[0, S]``) and L = ``lengths[r]`` clamped to ``[0, S - start]``; raw indices are relative to start.
    """
    check_topk("topk_transform", "k", k)
    rows, width = scores.shape
    starts = torch.zeros(rows, dtype=torch.int64) if row_starts is None else row_starts.long().clamp(0, width)
    lens = torch.minimum(lengths.long().clamp_min(0), width - starts)
    prefix = torch.arange(k)
    raw = torch.where(prefix < lens[:, None], prefix, -1)
    long_rows = (lens > k).nonzero().flatten()
    if long_rows.numel():
        raw[long_rows] = _best_k(scores[long_rows].float(), starts[long_rows], lens[long_rows], k)
    slots = None if page_table is None else _slots_through_pages(raw, page_table, page_size).to(torch.int32)
    return raw.to(torch.int32), slots


def topk_transform_op(scores, lengths, row_starts, page_table, page_size, raw_indices, slot_indices):
    op = "topk_transform"
    check_tensor(op, "scores", scores, (torch.float32,), (None, None))
    check_last_dim_contiguous(op, "scores", scores)
    rows = scores.shape[0]
    check_tensor(op, "lengths", lengths, INDEX_DTYPES, (rows,))
    check_optional(op, "row_starts", row_starts, INDEX_DTYPES, (rows,))
    check_optional(op, "page_table", page_table, INDEX_DTYPES, (rows, None))
    check_tensor(op, "raw_indices", raw_indices, (torch.int32,), (rows, None))
    check_topk(op, "raw_indices", raw_indices.shape[1])
    if page_table is None:
        check(slot_indices is None, op, "slot_indices", "be None without a page_table", "a tensor")
    else:
        check_positive(op, "page_size", page_size)
        check(slot_indices is not None, op, "slot_indices", "be given with a page_table", None)
        check_tensor(op, "slot_indices", slot_indices, (torch.int32,), tuple(raw_indices.shape))
    raw, slots = topk_transform(scores, lengths, raw_indices.shape[1], row_starts, page_table, page_size)
    raw_indices.copy_(raw)
    if slots is not None:
        slot_indices.copy_(slots)
