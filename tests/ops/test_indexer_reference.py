"""Reference lightning indexer: hand-checked logits, an independent loop implementation, the exact top-k order,
and the op contract (opcheck, argument errors) of fp8_paged_mqa_logits, fp8_mqa_logits and topk_transform."""

import math

import pytest
import torch

from conftest import assert_rejects, random_pages, replaced
from dsv4.constants import INDEXER_HEAD_DIM, INDEXER_K_BYTES_PER_ENTRY
from dsv4.reference import indexer, quant, topk

NEG_INF = float("-inf")
NAN = float("nan")
# fp32 reference vs float64 loop: the fp8 products are exact, only fp32 summation order differs.
LOGIT_RTOL = 1e-5
LOGIT_ATOL = 1e-4
Q_SPREAD = 2.0  # q values ~ N(0, 2) before fp8 rounding: exercises several e4m3 exponents
TOPK_TIE_LEVELS = 8  # scores drawn from this many integers, so long rows are full of ties


def random_fp8(*shape: int) -> torch.Tensor:
    return (torch.randn(shape) * Q_SPREAD).to(torch.float8_e4m3fn)


def indexer_cache(num_blocks: int, block_size: int, pad_bytes: int = 0) -> torch.Tensor:
    """Random-byte pages (stride padded by pad_bytes) with every entry written from random keys."""
    cache = random_pages(num_blocks, block_size * INDEXER_K_BYTES_PER_ENTRY, pad_bytes)
    codes, scales = quant.indexer_k_pack(torch.randn(num_blocks * block_size, INDEXER_HEAD_DIM))
    quant.indexer_k_write(cache, torch.arange(num_blocks * block_size), block_size, codes, scales)
    return cache


def causal_lens(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """[B, next_n] lengths of 1-D context lens: MTP row j sees ctx - next_n + j + 1 entries."""
    return torch.stack([context_lens - next_n + j + 1 for j in range(next_n)], dim=1)


def loop_paged_logits(q, cache, weights, lens, block_table, block_size, width):
    """Independent float64 implementation: one key at a time through quant.indexer_k_read."""
    batch, next_n, _, _ = q.shape
    out = torch.full((batch * next_n, width), NEG_INF, dtype=torch.float64)
    for b in range(batch):
        for j in range(next_n):
            row = b * next_n + j
            for t in range(min(int(lens[b, j]), width)):
                if t // block_size >= block_table.shape[1]:
                    continue
                block = int(block_table[b, t // block_size])
                if not 0 <= block < cache.shape[0]:
                    continue
                codes, scale = quant.indexer_k_read(cache, torch.tensor([block * block_size + t % block_size]),
                                                    block_size)
                dots = q[b, j].double() @ quant.decode_e4m3(codes[0]).double()
                out[row, t] = float(scale[0]) * float((weights[row].double() * dots.clamp_min(0)).sum())
    return out


def loop_mqa_logits(q, k, k_scale, weights, ks, ke):
    out = torch.full((q.shape[0], k.shape[0]), NEG_INF, dtype=torch.float64)
    for i in range(q.shape[0]):
        for j in range(max(int(ks[i]), 0), min(int(ke[i]), k.shape[0])):
            dots = q[i].double() @ k[j].double()
            out[i, j] = float(k_scale[j]) * float((weights[i].double() * dots.clamp_min(0)).sum())
    return out


def assert_logits_close(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor | None = None):
    assert got.dtype == torch.float32
    if mask is not None:
        got, expected = got[mask], expected[mask]
    torch.testing.assert_close(got.double(), expected, rtol=LOGIT_RTOL, atol=LOGIT_ATOL)


# ---------------------------------------------------------------------------------------------
# fp8_paged_mqa_logits
# ---------------------------------------------------------------------------------------------


def write_constant_key(cache, slot: int, block_size: int, value: float):
    codes, scales = quant.indexer_k_pack(torch.full((1, INDEXER_HEAD_DIM), value))
    quant.indexer_k_write(cache, torch.tensor([slot]), block_size, codes, scales)


def test_paged_logits_hand_checked():
    block_size = 2
    cache = random_pages(2, block_size * INDEXER_K_BYTES_PER_ENTRY)
    # key +2: scale 2^-7, codes 256 -> dot with q = 1 is 128 * 256; key -1: negative dot, relu gives 0
    write_constant_key(cache, 2, block_size, 2.0)
    write_constant_key(cache, 3, block_size, -1.0)
    q = torch.ones(1, 2, 1, INDEXER_HEAD_DIM).to(torch.float8_e4m3fn)
    weights = torch.full((2, 1), 0.5)
    logits = indexer.fp8_paged_mqa_logits(q, cache, weights, torch.tensor([2]), torch.tensor([[1]]), block_size, 4)
    expected = torch.tensor([[128.0, NEG_INF, NEG_INF, NEG_INF], [128.0, 0.0, NEG_INF, NEG_INF]])
    assert torch.equal(logits, expected)


@pytest.mark.parametrize("block_size,pad_bytes", [(1, 0), (2, 5), (61, 0), (64, 100)])
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("lens_rank", [1, 2])
def test_paged_logits_match_loop(block_size, pad_bytes, next_n, lens_rank):
    batch, heads = 3, 4
    longest = 2 * block_size + 3
    pages_per_request = math.ceil(longest / block_size)
    num_blocks = batch * pages_per_request + 1
    cache = indexer_cache(num_blocks, block_size, pad_bytes)
    block_table = torch.randperm(num_blocks)[: batch * pages_per_request].view(batch, pages_per_request).int()
    if lens_rank == 1:
        context_lens = torch.tensor([1, block_size + 1, longest], dtype=torch.int32)
        lens = causal_lens(context_lens.long(), next_n)
    else:
        context_lens = torch.randint(0, longest + 1, (batch, next_n))
        lens = context_lens
    width = longest + 2  # columns past every row's length must come back -inf
    q = random_fp8(batch, next_n, heads, INDEXER_HEAD_DIM)
    weights = torch.randn(batch * next_n, heads)
    logits = indexer.fp8_paged_mqa_logits(q, cache, weights, context_lens, block_table, block_size, width)
    assert_logits_close(logits, loop_paged_logits(q, cache, weights, lens, block_table, block_size, width))


def test_paged_logits_clean_off_agrees_on_valid_range():
    block_size, batch, heads, width = 4, 2, 3, 11
    cache = indexer_cache(6, block_size, pad_bytes=8)
    block_table = torch.tensor([[5, 0, 2], [1, 3, 4]])
    context_lens = torch.tensor([9, 11])
    q = random_fp8(batch, 2, heads, INDEXER_HEAD_DIM)
    weights = torch.randn(batch * 2, heads)
    args = (q, cache, weights, context_lens, block_table, block_size, width)
    clean = indexer.fp8_paged_mqa_logits(*args, clean_logits=True)
    unclean = indexer.fp8_paged_mqa_logits(*args, clean_logits=False)
    valid = torch.arange(width) < causal_lens(context_lens, 2).reshape(-1, 1)
    assert torch.equal(unclean[valid], clean[valid])
    assert torch.isfinite(clean[valid]).all() and (clean[~valid] == NEG_INF).all()


def test_paged_logits_missing_pages_and_clamped_lengths():
    block_size, heads, width = 2, 3, 10
    cache = indexer_cache(4, block_size)
    # pages: ok, -1, past the cache, ok; positions 8.. are past the table; length 12 is clamped to width 10
    block_table = torch.tensor([[0, -1, 4, 1]])
    q = random_fp8(1, 1, heads, INDEXER_HEAD_DIM)
    weights = torch.randn(1, heads)
    logits = indexer.fp8_paged_mqa_logits(q, cache, weights, torch.tensor([12]), block_table, block_size, width)
    present = torch.tensor([[1, 1, 0, 0, 0, 0, 1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(torch.isfinite(logits), present)
    lens = torch.tensor([[12]])
    assert_logits_close(logits, loop_paged_logits(q, cache, weights, lens, block_table, block_size, width))


def test_paged_logits_empty_rows():
    block_size, heads = 4, 2
    cache = indexer_cache(2, block_size)
    q = random_fp8(2, 2, heads, INDEXER_HEAD_DIM)
    weights = torch.randn(4, heads)
    # ctx 0 -> lengths -1 and 0; ctx 1 -> lengths 0 and 1
    logits = indexer.fp8_paged_mqa_logits(q, cache, weights, torch.tensor([0, 1]), torch.tensor([[0], [1]]),
                                          block_size, 3)
    assert (logits[:3] == NEG_INF).all()
    assert torch.isfinite(logits[3, 0]) and (logits[3, 1:] == NEG_INF).all()


# ---------------------------------------------------------------------------------------------
# fp8_mqa_logits
# ---------------------------------------------------------------------------------------------


def test_mqa_logits_hand_checked():
    q = torch.ones(2, 1, INDEXER_HEAD_DIM).to(torch.float8_e4m3fn)
    k = torch.stack([torch.full((INDEXER_HEAD_DIM,), 2.0), torch.full((INDEXER_HEAD_DIM,), -1.0)])
    k_scale = torch.tensor([0.25, 3.0])
    weights = torch.tensor([[0.5], [2.0]])
    logits = indexer.fp8_mqa_logits(q, k.to(torch.float8_e4m3fn), k_scale, weights, torch.tensor([0, 1]),
                                    torch.tensor([2, 2]))
    # row 0: 0.25 * 0.5 * (128 * 2), then relu(-128) = 0; row 1 starts at key 1
    assert torch.equal(logits, torch.tensor([[32.0, 0.0], [NEG_INF, 0.0]]))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_mqa_logits_match_loop(head_dim):
    rows, heads, keys = 7, 3, 20
    q = random_fp8(rows, heads, head_dim)
    k = random_fp8(keys, head_dim)
    k_scale = torch.rand(keys) + 0.1
    weights = torch.randn(rows, heads)
    # in range, empty (ke <= ks), clamped below 0 and above N
    ks = torch.tensor([0, 3, 5, -4, 12, 19, 0], dtype=torch.int32)
    ke = torch.tensor([20, 9, 5, 6, 30, 20, 1], dtype=torch.int32)
    expected = loop_mqa_logits(q, k, k_scale, weights, ks, ke)
    assert_logits_close(indexer.fp8_mqa_logits(q, k, k_scale, weights, ks, ke), expected)
    unclean = indexer.fp8_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits=False)
    assert_logits_close(unclean, expected, mask=expected != NEG_INF)


# ---------------------------------------------------------------------------------------------
# topk_transform
# ---------------------------------------------------------------------------------------------


def sorted_topk(row: list[float], start: int, length: int, k: int) -> list[int]:
    """Independent top-k of one row with Python's sorted(): numbers by value desc, then NaN; ties by index."""
    start = min(max(start, 0), len(row))
    length = min(max(length, 0), len(row) - start)
    if length <= k:
        return list(range(length)) + [-1] * (k - length)
    window = row[start : start + length]
    return sorted(range(length), key=lambda i: (1, 0.0, i) if math.isnan(window[i]) else (0, -window[i], i))[:k]


def expected_topk(scores, lengths, k, row_starts=None):
    starts = [0] * scores.shape[0] if row_starts is None else row_starts.tolist()
    rows = zip(scores.tolist(), starts, lengths.tolist(), strict=True)
    return torch.tensor([sorted_topk(row, s, n, k) for row, s, n in rows], dtype=torch.int32)


def expected_slots(raw, page_table, page_size):
    out = []
    for raw_row, table_row in zip(raw.tolist(), page_table.tolist(), strict=True):
        row = []
        for i in raw_row:
            page = i // page_size if i >= 0 else len(table_row)
            entry = table_row[page] if page < len(table_row) else -1
            row.append(entry * page_size + i % page_size if entry >= 0 else -1)
        out.append(row)
    return torch.tensor(out, dtype=torch.int32)


def tied_scores(rows: int, width: int) -> torch.Tensor:
    return torch.randint(0, TOPK_TIE_LEVELS, (rows, width)).float() + torch.randn(rows, 1)


@pytest.mark.parametrize("k", topk.TOPK_SIZES)
def test_topk_short_rows_ignore_scores(k):
    scores = torch.randn(5, k + 3)
    scores[:, ::3] = NEG_INF
    scores[:, 1::3] = NAN
    lengths = torch.tensor([0, 1, k - 1, k, -2])
    raw, slots = topk.topk_transform(scores, lengths, k)
    assert slots is None and raw.dtype == torch.int32
    assert torch.equal(raw, expected_topk(scores, lengths, k))
    assert torch.equal(raw[3], torch.arange(k, dtype=torch.int32))


@pytest.mark.parametrize("k", topk.TOPK_SIZES)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_topk_long_rows_match_sorted(k, index_dtype):
    width = 3 * k + 5
    scores = tied_scores(4, width)
    scores[1, ::7] = NEG_INF
    scores[2, 5::11] = NAN
    scores[3, ::2] = -0.0  # -0.0 ties with +0.0
    scores[3, 1::2] = 0.0
    lengths = torch.tensor([k + 1, width, 2 * k, width], dtype=index_dtype)
    raw, _ = topk.topk_transform(scores, lengths, k)
    assert torch.equal(raw, expected_topk(scores, lengths, k))


def test_topk_ties_go_to_the_lower_index():
    k = 512
    scores = torch.zeros(1, 2 * k)
    scores[0, 700] = 1.0
    raw, _ = topk.topk_transform(scores, torch.tensor([2 * k]), k)
    assert raw[0, 0] == 700 and torch.equal(raw[0, 1:], torch.arange(k - 1, dtype=torch.int32))


def test_topk_neg_inf_and_nan_rank_after_numbers():
    k = 512
    width = k + 40
    scores = torch.full((3, width), NEG_INF)
    scores[1] = NAN
    mixed = scores[2]
    mixed[:] = NAN
    mixed[torch.arange(10, width, 50)] = NEG_INF
    finite_at = torch.tensor([30, 7, 48, 251])
    mixed[finite_at] = torch.tensor([1.0, 5.0, float("inf"), -3.0])
    raw, _ = topk.topk_transform(scores, torch.full((3,), width), k)
    assert torch.equal(raw[0], torch.arange(k, dtype=torch.int32))  # all -inf: index order
    assert torch.equal(raw[1], torch.arange(k, dtype=torch.int32))  # all NaN: index order
    numbers = [int(finite_at[2]), 7, 30, 251]  # +inf, 5, 1, -3
    neg_inf = list(range(10, width, 50))
    nans = [i for i in range(width) if i not in numbers and i not in neg_inf]
    assert raw[2].tolist() == (numbers + neg_inf + nans)[:k]


def test_topk_row_starts_are_ragged_and_clamped():
    k = 512
    width = 3000
    scores = tied_scores(5, width)
    row_starts = torch.tensor([0, 100, 2500, 2990, 4000])
    lengths = torch.tensor([600, 2000, 600, 600, 600])  # rows 2-4 are clamped to 500, 10 and 0 entries
    raw, _ = topk.topk_transform(scores, lengths, k, row_starts=row_starts)
    assert torch.equal(raw, expected_topk(scores, lengths, k, row_starts))
    assert raw[2, 499] == 499 and raw[2, 500] == -1


@pytest.mark.parametrize("page_size", [1, 3, 64])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_topk_page_translation(page_size, index_dtype):
    k = 512
    width = 1500
    scores = torch.randn(3, width)
    lengths = torch.tensor([width, 40, 0], dtype=index_dtype)
    table_width = math.ceil(width / page_size) - 1  # the last page is missing: its entries give -1
    page_table = torch.randperm(10 * table_width)[: 3 * table_width].view(3, table_width).to(index_dtype)
    page_table[:, ::4] = -1
    raw, slots = topk.topk_transform(scores, lengths, k, page_table=page_table, page_size=page_size)
    assert torch.equal(raw, expected_topk(scores, lengths, k))
    assert slots.dtype == torch.int32
    assert torch.equal(slots, expected_slots(raw, page_table, page_size))
    assert (slots[raw < 0] == -1).all() and (slots[0] == -1).any() and (slots[0] >= 0).any()


def test_topk_long_row_65536():
    k = 2048
    width = 65536
    scores = torch.randint(0, 5000, (1, width)).float()
    raw, _ = topk.topk_transform(scores, torch.tensor([width]), k)
    assert torch.equal(raw, expected_topk(scores, torch.tensor([width]), k))


# ---------------------------------------------------------------------------------------------
# Op contract: opcheck, in-place outputs, argument errors
# ---------------------------------------------------------------------------------------------


def paged_logits_args(next_n=2, lens_rank=1):
    batch, heads, block_size = 2, 3, 4
    lens = torch.tensor([5, 9], dtype=torch.int32)
    return dict(
        q=random_fp8(batch, next_n, heads, INDEXER_HEAD_DIM),
        kv_cache=indexer_cache(5, block_size, pad_bytes=12).view(5, block_size, 1, -1),  # DeepGEMM's 4-D view
        weights=torch.randn(batch * next_n, heads),
        context_lens=lens if lens_rank == 1 else torch.stack([lens] * next_n, dim=1),
        block_table=torch.tensor([[3, 0, 1], [2, 4, 1]], dtype=torch.int32),
        block_size=block_size,
        max_context_len=12,
        clean_logits=True,
        schedule_meta=None,
    )


def mqa_logits_args():
    rows, heads, keys = 4, 2, 9
    return dict(
        q=random_fp8(rows, heads, INDEXER_HEAD_DIM),
        k=random_fp8(keys, INDEXER_HEAD_DIM),
        k_scale=torch.rand(keys),
        weights=torch.randn(rows, heads),
        ks=torch.tensor([0, 2, 4, 0], dtype=torch.int32),
        ke=torch.tensor([3, 9, 4, 9], dtype=torch.int32),
        clean_logits=True,
    )


def topk_args(paged=True, k=512):
    rows, width = 3, 1200
    return dict(
        scores=torch.randn(rows, width),
        lengths=torch.tensor([1200, 300, 700]),
        row_starts=torch.tensor([0, 10, 500]),
        page_table=torch.randint(-1, 50, (rows, 40), dtype=torch.int32) if paged else None,
        page_size=32,
        raw_indices=torch.randint(-(2**31), 2**31 - 1, (rows, k), dtype=torch.int32),  # poison
        slot_indices=torch.randint(-(2**31), 2**31 - 1, (rows, k), dtype=torch.int32) if paged else None,
    )


OPCHECK_ALL = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
OPCHECK_WITHOUT_SCHEMA = OPCHECK_ALL[1:]
OPS = {"fp8_paged_mqa_logits": paged_logits_args, "fp8_mqa_logits": mqa_logits_args, "topk_transform": topk_args}


@pytest.mark.parametrize(
    "name,args",
    [
        ("fp8_paged_mqa_logits", lambda: paged_logits_args(next_n=1)),
        ("fp8_paged_mqa_logits", lambda: paged_logits_args(next_n=2, lens_rank=2)),
        ("fp8_mqa_logits", mqa_logits_args),
        ("topk_transform", lambda: topk_args(paged=True)),
        ("topk_transform", lambda: topk_args(paged=False, k=1024)),
    ],
)
def test_opcheck(name, args, opcheck):
    op = getattr(torch.ops.dsv4, name).default
    args = tuple(args().values())
    has_fp8 = any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args)
    # opcheck's schema test compares inputs with allclose, which fp8 lacks; test_logits_ops_leave_inputs_alone covers it
    checks = OPCHECK_WITHOUT_SCHEMA if has_fp8 else OPCHECK_ALL
    opcheck(op, args, test_utils=checks)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


@pytest.mark.parametrize("name", ["fp8_paged_mqa_logits", "fp8_mqa_logits"])
def test_logits_ops_leave_inputs_alone(name):
    args = OPS[name]()
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
    out = getattr(torch.ops.dsv4, name)(*args.values())
    plain = getattr(indexer, name)(*[v for k, v in args.items() if k != "schedule_meta"])
    # the native kernel sums in another order than the reference: fp32 rounding noise only
    torch.testing.assert_close(out, plain, rtol=1e-5, atol=1e-4)
    for key, value in before.items():
        assert torch.equal(as_bytes(args[key]), as_bytes(value)), key
        assert not torch._C._overlaps(out, args[key]), key


@pytest.mark.parametrize("paged", [True, False])
def test_topk_op_overwrites_poisoned_outputs(paged):
    args = topk_args(paged)
    torch.ops.dsv4.topk_transform(*args.values())
    raw, slots = topk.topk_transform(args["scores"], args["lengths"], 512, args["row_starts"], args["page_table"],
                                        args["page_size"])
    assert torch.equal(args["raw_indices"], raw)
    assert (args["slot_indices"] is None) if slots is None else torch.equal(args["slot_indices"], slots)


BAD_INPUTS = [
    ("fp8_paged_mqa_logits", "q", lambda a: a.update(q=a["q"].float())),
    ("fp8_paged_mqa_logits", "q", lambda a: a.update(q=a["q"][0])),
    ("fp8_paged_mqa_logits", "q", lambda a: a.update(q=a["q"][..., :64])),
    ("fp8_paged_mqa_logits", "kv_cache", lambda a: a.update(kv_cache=a["kv_cache"].float())),
    ("fp8_paged_mqa_logits", "kv_cache", replaced(block_size=8)),
    ("fp8_paged_mqa_logits", "block_size", replaced(block_size=0)),
    ("fp8_paged_mqa_logits", "weights", lambda a: a.update(weights=a["weights"][1:])),
    ("fp8_paged_mqa_logits", "weights", lambda a: a.update(weights=a["weights"].bfloat16())),
    ("fp8_paged_mqa_logits", "context_lens", lambda a: a.update(context_lens=a["context_lens"].float())),
    ("fp8_paged_mqa_logits", "context_lens", lambda a: a.update(context_lens=torch.tensor([5, 9, 2]))),
    ("fp8_paged_mqa_logits", "block_table", lambda a: a.update(block_table=a["block_table"][0])),
    ("fp8_paged_mqa_logits", "max_context_len", replaced(max_context_len=-1)),
    ("fp8_mqa_logits", "q", lambda a: a.update(q=a["q"].bfloat16())),
    ("fp8_mqa_logits", "k", lambda a: a.update(k=a["k"][:, :64])),
    ("fp8_mqa_logits", "k_scale", lambda a: a.update(k_scale=a["k_scale"][1:])),
    ("fp8_mqa_logits", "weights", lambda a: a.update(weights=a["weights"].t())),
    ("fp8_mqa_logits", "ks", lambda a: a.update(ks=a["ks"].float())),
    ("fp8_mqa_logits", "ke", lambda a: a.update(ke=a["ke"][None])),
    ("topk_transform", "scores", lambda a: a.update(scores=a["scores"].double())),
    ("topk_transform", "scores", lambda a: a.update(scores=a["scores"][0])),
    ("topk_transform", "scores", lambda a: a.update(scores=a["scores"][:, ::2])),
    ("topk_transform", "lengths", lambda a: a.update(lengths=a["lengths"][1:])),
    ("topk_transform", "row_starts", lambda a: a.update(row_starts=a["row_starts"].float())),
    ("topk_transform", "page_table", lambda a: a.update(page_table=a["page_table"][1:])),
    ("topk_transform", "page_size", replaced(page_size=0)),
    ("topk_transform", "raw_indices", lambda a: a.update(raw_indices=a["raw_indices"][:, :100])),
    ("topk_transform", "raw_indices", lambda a: a.update(raw_indices=a["raw_indices"].long())),
    ("topk_transform", "slot_indices", replaced(slot_indices=None)),
    ("topk_transform", "slot_indices", lambda a: a.update(slot_indices=a["slot_indices"][:, :256])),
    ("topk_transform", "slot_indices", lambda a: a.update(page_table=None)),
]


@pytest.mark.parametrize("name,arg,corrupt", BAD_INPUTS)
def test_bad_inputs_raise_naming_op_and_argument(name, arg, corrupt):
    args = OPS[name]()
    corrupt(args)
    assert_rejects(getattr(torch.ops.dsv4, name), args, f"dsv4::{name}: argument '{arg}'")


def test_plain_topk_rejects_unsupported_k():
    with pytest.raises(RuntimeError, match="dsv4::topk_transform: argument 'k'"):
        topk.topk_transform(torch.randn(1, 10), torch.tensor([10]), 100)


def test_logits_blocking_does_not_change_results(monkeypatch):
    args = paged_logits_args()
    del args["schedule_meta"]
    whole = indexer.fp8_paged_mqa_logits(**args)
    ragged = mqa_logits_args()
    whole_ragged = indexer.fp8_mqa_logits(**ragged)
    monkeypatch.setattr(indexer, "DOT_BLOCK_ELEMENTS", 1)  # one row per block
    torch.testing.assert_close(indexer.fp8_paged_mqa_logits(**args), whole, rtol=LOGIT_RTOL, atol=LOGIT_ATOL)
    torch.testing.assert_close(indexer.fp8_mqa_logits(**ragged), whole_ragged, rtol=LOGIT_RTOL, atol=LOGIT_ATOL)
