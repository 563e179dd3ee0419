"""dsv4::topk_transform (per-row top-k of indexer logits, optional slot ids) against its reference, compared as
exact sequences on every CPU tier."""

from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import INDEX_DTYPES, PAGE_SIZES, assert_rejects, replaced
from dsv4 import ops
from dsv4.reference import topk as ref

K_SIZES = ref.TOPK_SIZES
LONG = 65536  # the longest row the indexer scores (a 256K context at ratio 4)
NAN, NEG_INF, POS_INF = float("nan"), float("-inf"), float("inf")
POISON = -7  # written into outputs before a call, so an unwritten entry shows
RECIPROCAL_ROUNDS_DOWN = 49  # 49 * fl(1/49) < 1: a page size whose quotient by reciprocal needs the fix-up


def run_and_check(scores, lengths, k, row_starts=None, page_table=None, page_size=None):
    raw, slots = ops.topk_transform(scores, lengths, k, row_starts=row_starts, page_table=page_table,
                                    page_size=page_size)
    want_raw, want_slots = ref.topk_transform(scores, lengths, k, row_starts, page_table, page_size or 0)
    assert raw.dtype == torch.int32 and torch.equal(raw, want_raw)
    if page_table is None:
        assert slots is None
    else:
        assert slots.dtype == torch.int32 and torch.equal(slots, want_slots)
    return raw, slots


@contextlib.contextmanager
def intra_op_threads(threads: int):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def sample_trap(width: int, spacing: int) -> torch.Tensor:
    """A row whose evenly spaced sample sees only its large values, one every spacing columns: with fewer of them
    than k, a floor read off the sample admits too few candidates and the kernel must look again."""
    row = torch.randn(width)
    row[::spacing] = 100.0 + torch.rand(len(range(0, width, spacing)))
    return row


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("k", K_SIZES)
def test_row_lengths(isa, k, index_dtype):
    width = 4 * k + 16
    lengths = torch.tensor([0, 1, k - 1, k, k + 1, 3 * k + 7, width, -5, width + 100], dtype=index_dtype)
    raw, _ = run_and_check(torch.randn(len(lengths), width), lengths, k)
    assert torch.equal(raw[3], torch.arange(k, dtype=torch.int32)) and (raw[7] == -1).all()


@pytest.mark.parametrize("k,width", [(512, LONG), (1024, 20000), (2048, LONG)])
def test_long_rows(isa, k, width):
    scores = torch.randn(3, width)
    scores[1] = torch.linspace(-1, 1, width)  # ascending: every new entry beats the ones before
    run_and_check(scores, torch.tensor([width, width, width - 999]), k)


@pytest.mark.parametrize("k", K_SIZES)
def test_ties_go_to_the_lower_index(isa, k):
    width = 40000
    scores = torch.randint(0, 3, (4, width)).float()  # a third of each row ties with the k-th
    scores[1] = 0.5  # all equal: 0 .. k-1
    scores[2, ::2] = -0.0  # -0.0 ties with +0.0
    scores[2, 1::2] = 0.0
    scores[3, -k:] = 9.0  # the winners at the end of the row
    raw, _ = run_and_check(scores, torch.tensor([width, width, width, 3 * k + 5]), k)
    assert torch.equal(raw[1], torch.arange(k, dtype=torch.int32))


def test_entries_just_above_a_trimmed_boundary(isa):
    k, width = 512, 20000
    scores = torch.ones(1, width)  # candidates overflow and are trimmed to the first k ones, the k-th being 1.0
    scores[0, -100:] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))  # one step above it: they win
    raw, _ = run_and_check(scores, torch.tensor([width]), k)
    assert raw[0, 0] == width - 100 and raw[0, 100] == 0


@pytest.mark.parametrize("width", [512 + 40, 20000])
def test_neg_inf_and_nan_rank_after_numbers(isa, width):
    k = 512
    scores = torch.randn(6, width)
    scores[0] = NEG_INF
    scores[1] = NAN
    scores[2] = NAN  # fewer numbers than k: numbers, then -inf, then NaN
    scores[2, 10::50] = NEG_INF
    scores[2, 7::97] = torch.randn(len(range(7, width, 97)))
    scores[2, 3] = POS_INF
    scores[3, ::3] = NAN  # NaN among plenty of numbers
    scores[3, 1::7] = POS_INF
    scores[4, ::2] = NEG_INF  # -inf ties at the boundary
    scores[4, 1::2] = NAN
    scores[4, 5:500:9] = -1e30
    scores[5] = -torch.rand(width) * 1e-40  # negative denormals and zeros
    scores[5, ::5] = 0.0
    raw, _ = run_and_check(scores, torch.full((6,), width), k)
    assert torch.equal(raw[0], torch.arange(k, dtype=torch.int32)) and torch.equal(raw[1], raw[0])


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_ragged_row_starts(isa, index_dtype):
    k, width = 1024, 30000
    scores = torch.randn(7, width)
    row_starts = torch.tensor([0, 100, 2500, width - 10, width + 50, -20, 17], dtype=index_dtype)
    lengths = torch.tensor([width, 20000, 1100, 600, 600, 5000, k + 1], dtype=index_dtype)
    raw, _ = run_and_check(scores, lengths, k, row_starts=row_starts)
    assert (raw[3, 10:] == -1).all() and (raw[4] == -1).all()


@pytest.mark.parametrize("table_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("page_size", (*PAGE_SIZES, RECIPROCAL_ROUNDS_DOWN))
def test_page_translation(isa, page_size, table_dtype):
    k, width = 512, 3000
    lengths = torch.tensor([width, width, 40, 0, 2 * k])
    rows = len(lengths)
    pages = -(-width // page_size) - 1  # the row's last page is missing from the table: -1
    table = torch.randperm(3 * rows * pages)[: rows * pages].view(rows, pages).to(table_dtype)
    table[:, 1::5] = -1  # unallocated pages: -1
    if table_dtype == torch.int64:
        table = table.t().contiguous().t()  # column-major: the table's column stride is free
    scores = torch.randn(rows, width)
    scores[1, pages * page_size :] = 10.0  # winners on the missing page
    _, slots = run_and_check(scores, lengths, k, page_table=table, page_size=page_size)
    assert (slots >= 0).any() and (slots[1, : width - pages * page_size] == -1).all()


def test_empty_page_table_maps_nothing(isa):
    lengths = torch.tensor([700, 3])
    _, slots = run_and_check(torch.randn(2, 700), lengths, 512, page_table=torch.empty(2, 0, dtype=torch.int32),
                             page_size=16)
    assert (slots == -1).all()


def test_slots_up_to_int32_max(isa):
    k, page_size = 512, 600
    last_page = (2**31 - 1) // page_size - 1  # its last slot is the largest int32 a page of 600 can end on
    table = torch.tensor([[last_page]], dtype=torch.int64)
    scores = torch.randn(1, page_size)
    run_and_check(scores, torch.tensor([page_size]), k, page_table=table, page_size=page_size)


def test_strided_scores_and_outputs(isa):
    k, rows, width = 512, 3, 5000
    wide = torch.randn(rows, width + 300)
    scores = wide[:, 100 : 100 + width]  # row stride > width
    lengths = torch.tensor([width, 900, 4000], dtype=torch.int32)
    table = torch.randperm(4 * width)[: rows * width // 8].view(rows, -1)
    raw = torch.full((k + 8, rows), POISON, dtype=torch.int32).t()[:, 4 : 4 + k]  # column-major, a column slice
    slots = torch.full((rows, 2 * k), POISON, dtype=torch.int32)[:, ::2]  # column stride 2
    torch.ops.dsv4.topk_transform(scores, lengths, None, table, 8, raw, slots)
    want_raw, want_slots = ref.topk_transform(scores.contiguous(), lengths, k, None, table, 8)
    assert torch.equal(raw, want_raw) and torch.equal(slots, want_slots)


SPLIT_PIECE = 4096  # the kernel's shortest piece of a split row: lengths just above its multiples change the split
SPLIT_THREADS = (1, 2, 3, 4, 7, 8, 16, 32, 64)
SPLIT_LENGTHS = (2 * SPLIT_PIECE + 1, 3 * SPLIT_PIECE + 1, 5 * SPLIT_PIECE + 1, 7 * SPLIT_PIECE + 3, LONG)


def ordered_row(order: str, width: int) -> torch.Tensor:
    """A row whose winners sit where a split row's pieces see them unevenly."""
    if order == "descending":  # every winner in the first piece
        return torch.arange(width, 0, -1).float()
    if order == "ascending":  # every winner in the last piece
        return torch.arange(width).float()
    if order == "clustered":  # narrow bands of near-equal values, the best band in one stretch of the row
        row = torch.randint(0, 8, (width,)).float() + 1e-3 * torch.rand(width)
        start = int(torch.randint(0, width // 2, ()))
        row[start : start + width // 8] += 10.0
        return row
    if order == "constant":  # all tied: the answer is 0 .. k-1
        return torch.full((width,), 2.5)
    return torch.randn(width)


@pytest.mark.parametrize("order", ["descending", "ascending", "clustered", "constant", "random"])
@pytest.mark.parametrize("threads", SPLIT_THREADS)
def test_one_long_row_split_across_threads(isa, threads, order):
    with intra_op_threads(threads):
        for width in SPLIT_LENGTHS:
            row = ordered_row(order, width)[None]
            for k in K_SIZES:
                run_and_check(row, torch.tensor([width]), k)


def test_descending_row_keeps_its_head_at_two_threads(isa):
    k, width = 2048, 28664  # a split row whose first piece holds every winner
    with intra_op_threads(2):
        raw, _ = run_and_check(torch.arange(width, 0, -1).float()[None], torch.tensor([width]), k)
    assert torch.equal(raw[0], torch.arange(k, dtype=torch.int32))


@pytest.mark.parametrize("threads", [16, 64])
def test_random_long_rows_at_many_threads(isa, threads):
    with intra_op_threads(threads):
        scores = torch.randn(10, LONG)
        for k in K_SIZES:
            for row in range(len(scores)):
                run_and_check(scores[row : row + 1], torch.tensor([LONG]), k)
    scores = torch.stack([torch.randn(LONG), sample_trap(LONG, 64), torch.randint(0, 4, (LONG,)).float()])
    with intra_op_threads(threads):
        run_and_check(scores, torch.full((3,), LONG), 2048)


def test_sample_trap_in_a_batch(isa):
    k, width = 2048, LONG
    # k / 2 large values, then exactly k: the floor admits too few, then just enough
    scores = torch.stack([sample_trap(width, 64), sample_trap(width, 32), torch.randn(width)])
    run_and_check(scores, torch.tensor([width, width, width]), k)


def test_many_rows_of_mixed_lengths(isa):
    k, rows, width = 512, 64, 6000
    lengths = torch.randint(0, width + 1, (rows,))  # a prefill's causal rows: short and long mixed
    lengths[:4] = torch.tensor([0, k, k + 1, width])
    run_and_check(torch.randn(rows, width), lengths, k)


@pytest.mark.parametrize("rows,width", [(0, 100), (3, 0)])
def test_empty(isa, rows, width):
    run_and_check(torch.randn(rows, width), torch.full((rows,), 5), 512,
                  page_table=torch.zeros(rows, 2, dtype=torch.int32), page_size=4)


# ---- op contract ----


def op_args(paged=True, k=512) -> dict:
    rows, width = 3, 1200
    return dict(
        scores=torch.randn(rows, width),
        lengths=torch.tensor([1200, 300, 700]),
        row_starts=torch.tensor([0, 10, 500], dtype=torch.int32),
        page_table=torch.randint(-1, 50, (rows, 40), dtype=torch.int32) if paged else None,
        page_size=32,
        raw_indices=torch.full((rows, k), POISON, dtype=torch.int32),
        slot_indices=torch.full((rows, k), POISON, dtype=torch.int32) if paged else None,
    )


@pytest.mark.parametrize("paged,k", [(True, 512), (False, 2048)])
def test_opcheck(paged, k, opcheck):
    opcheck(torch.ops.dsv4.topk_transform.default, tuple(op_args(paged, k).values()))


def test_native_kernel_is_registered():
    assert "topk_transform" not in ops.REFERENCE_BACKED_CPU_OPS


BAD_INPUTS = {
    "scores dtype": (lambda a: a.update(scores=a["scores"].double()), "scores"),
    "scores rank": (lambda a: a.update(scores=a["scores"][0]), "scores"),
    "scores columns strided": (lambda a: a.update(scores=a["scores"][:, ::2]), "scores"),
    "lengths dtype": (lambda a: a.update(lengths=a["lengths"].float()), "lengths"),
    "lengths size": (lambda a: a.update(lengths=a["lengths"][1:]), "lengths"),
    "row_starts dtype": (lambda a: a.update(row_starts=a["row_starts"].to(torch.int16)), "row_starts"),
    "row_starts size": (lambda a: a.update(row_starts=a["row_starts"][None]), "row_starts"),
    "page_table rows": (lambda a: a.update(page_table=a["page_table"][1:]), "page_table"),
    "page_table dtype": (lambda a: a.update(page_table=a["page_table"].float()), "page_table"),
    "page_size zero": (replaced(page_size=0), "page_size"),
    "k unsupported": (lambda a: a.update(raw_indices=a["raw_indices"][:, :100]), "raw_indices"),
    "raw dtype": (lambda a: a.update(raw_indices=a["raw_indices"].long()), "raw_indices"),
    "raw rows": (lambda a: a.update(raw_indices=a["raw_indices"][1:]), "raw_indices"),
    "slots missing": (replaced(slot_indices=None), "slot_indices"),
    "slots width": (lambda a: a.update(slot_indices=a["slot_indices"][:, :256]), "slot_indices"),
    "slots dtype": (lambda a: a.update(slot_indices=a["slot_indices"].long()), "slot_indices"),
    "slots without table": (replaced(page_table=None), "slot_indices"),
    "slots past int32": (lambda a: a.update(page_table=torch.full((3, 40), 2**40), page_size=600),
                         "page_table"),
    "slots past int32 by the page size": (replaced(page_size=2**62), "page_table"),
    "slots are the raw buffer": (lambda a: a.update(slot_indices=a["raw_indices"]),
                                 "slot_indices' overlaps argument 'raw_indices"),
    "raw overlaps scores": (lambda a: a.update(raw_indices=a["scores"][:, :512].view(torch.int32)),
                            "raw_indices' overlaps argument 'scores"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_rejects_bad_input(case):
    corrupt, name = BAD_INPUTS[case]
    args = op_args()
    corrupt(args)
    written = tuple(n for n in ("raw_indices", "slot_indices") if args[n] is not None)
    assert_rejects(torch.ops.dsv4.topk_transform, args, f"dsv4::topk_transform: argument '{name}'", unchanged=written)
