"""The cases of fuzz.py: one generator and one checker per ``torch.ops.dsv4`` op, against ``dsv4.reference``.

A generator draws one case from a seed (shapes, dtypes, strides, values, -1 entries, empty and boundary sizes) and
returns the op's arguments by name; its checker runs the op and the reference on copies of them and raises Mismatch
on any difference beyond the op's tolerance. Outputs are poisoned before the op (NaN or 0xFF bytes, -7 indices) so an
unwritten element shows, and caches hold NaN bytes wherever no valid index points, so a read of a skipped entry shows.
Writers, slot maps and top-k are compared exactly (whole storages, padding included); the rest with the tolerances of
the unit tests.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

import dsv4  # noqa: F401  (loads the kernels)
from dsv4.cache import indexer_k_page_bytes, kv_page_bytes
from dsv4.constants import (
    INDEXER_HEAD_DIM,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
    ROPE_DIM,
    V32_HEAD_DIM,
)
from dsv4.reference import compressor, indexer, kv_cache, quant, rope_slots, sparse_mla, topk
from dsv4.rope import rope_cos_sin_cache

KERNELS = torch.ops.dsv4  # looked up at call time, so a wrapped op is the one under test
MAX_THREADS = 8
PAGE_SIZES = (1, 2, 3, 7, 16, 61, 64, 128, 256)
CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)  # paged caches are bytes, viewed as any of these
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TOPK_SIZES = topk.TOPK_SIZES
POISON_INDEX = -7  # written into index outputs before a call
ROPE_CANCEL_NOISE = 1e-6  # of a row's largest value: what a rotation to about 0 may differ by
SLACK = 2  # inexact elements allowed beyond a "nearly all exact" fraction, so tiny cases are not flaky


class Mismatch(AssertionError):
    """A difference from the reference: the first line says what, the following lines where."""


def fail(summary: str, *details: str) -> None:
    raise Mismatch("\n".join((summary, *details)))


# ---------------------------------------------------------------------------------------------
# Random draws
# ---------------------------------------------------------------------------------------------


class Draw:
    """Every random choice of one case, from its seed: Python's RNG for sizes and flags, a torch Generator for
    tensor values (so a seed gives the same case in any process)."""

    def __init__(self, seed: int):
        self.py = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)

    def int(self, lo: int, hi: int) -> int:
        """Uniform in [lo, hi], both included."""
        return self.py.randint(lo, hi)

    def pick(self, options):
        return self.py.choice(list(options))

    def chance(self, p: float) -> bool:
        return self.py.random() < p

    def count(self, hi: int, empty: float = 0.08) -> int:
        """A size: 0 with probability ``empty``, else uniform in [1, hi]."""
        return 0 if self.chance(empty) else self.int(1, hi)

    def index_dtype(self) -> torch.dtype:
        return self.pick((torch.int32, torch.int64))

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen)

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen)

    def randint(self, lo: int, hi: int, shape) -> torch.Tensor:
        """int64 uniform in [lo, hi)."""
        return torch.randint(lo, max(hi, lo + 1), tuple(shape), generator=self.gen)

    def randperm(self, n: int) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen)

    def bytes(self, *shape: int) -> torch.Tensor:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=self.gen)


def case_threads(seed: int) -> int:
    """Intra-op threads of a case: the seed's first draw, before anything the op's generator draws."""
    return Draw(seed).int(1, MAX_THREADS)


# ---------------------------------------------------------------------------------------------
# Tensor layouts, poison and caches
# ---------------------------------------------------------------------------------------------


def poison(shape, dtype: torch.dtype) -> torch.Tensor:
    """A tensor whose bytes are 0xFF (NaN for every float type) or, for integers, 0x7F (a huge index)."""
    numel = math.prod(shape)
    byte = 0xFF if dtype.is_floating_point or dtype == torch.uint8 else 0x7F
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return torch.full((numel * itemsize,), byte, dtype=torch.uint8).view(dtype).reshape(shape)


def relayout(d: Draw, t: torch.Tensor, keep_last_contiguous: bool = True) -> torch.Tensor:
    """The values of t in a random non-contiguous layout half the time (t itself otherwise): dims stored in another
    order, or a view into a bigger poisoned buffer (padded rows, an offset start, every other element)."""
    if t.dim() == 0 or t.numel() == 0 or not d.chance(0.5):
        return t
    dims = list(range(t.dim()))
    movable = dims[:-1] if keep_last_contiguous else dims
    if len(movable) >= 2 and d.chance(0.4):  # the same values, stored in another dimension order
        order = movable[:]
        d.py.shuffle(order)
        order += dims[len(movable):]
        inverse = [order.index(i) for i in dims]
        return t.permute(order).contiguous().permute(inverse)
    last = dims[-1]
    step = 1 if keep_last_contiguous or d.chance(0.5) else 2  # 2: every other element of the last dim
    spans = [(d.int(0, 2), size * (step if i == last else 1)) for i, size in enumerate(t.shape)]  # (start, extent)
    wide = poison([start + extent + d.int(0, 40 if i == last else 2) for i, (start, extent) in enumerate(spans)],
                  t.dtype)
    view = wide[tuple(slice(start, start + extent, step if i == last else 1)
                      for i, (start, extent) in enumerate(spans))]
    view.copy_(t)
    return view


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """Every byte of the storage behind a view, padding included, sharing memory."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def clone_storage(t: torch.Tensor) -> torch.Tensor:
    """A copy of t over a copy of its whole storage: same strides, same bytes in the padding."""
    copy = storage_bytes(t).clone().view(t.dtype)
    return copy.as_strided(t.shape, t.stride(), t.storage_offset())


def paged_cache(d: Draw, num_blocks: int, page_bytes: int, fill: int | None = None) -> torch.Tensor:
    """A [num_blocks, page_bytes] byte cache (random bytes, or all ``fill``), its page stride padded half the time,
    viewed as uint8, int8 or e4m3."""
    stride = page_bytes + d.pick((0, 0, 16, 40, 576))
    full = d.bytes(num_blocks, stride) if fill is None else torch.full((num_blocks, stride), fill, dtype=torch.uint8)
    return full[:, :page_bytes].view(d.pick(CACHE_DTYPES))


def entry_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int, region: int, size: int) -> torch.Tensor:
    """Storage byte indices [N, size] of each slot's record in one region of a paged byte cache, region bytes into
    the page."""
    slots = slots.long()
    start = cache.storage_offset() + (slots // block_size) * cache.stride(0) + region
    return start[:, None] + (slots % block_size)[:, None] * size + torch.arange(size)


def distinct_slots(d: Draw, n: int, capacity: int, skip: float, dtype: torch.dtype) -> torch.Tensor:
    """n distinct slots in [0, capacity), about ``skip`` of them -1 (writers reject repeats and ids outside)."""
    slots = d.randperm(capacity)[:n]
    slots[d.rand(len(slots)) < skip] = -1
    return slots.to(dtype)


def positions_below(d: Draw, n: int, limit: int, dtype: torch.dtype) -> torch.Tensor:
    """n positions in [0, limit), the first ones the table's and a window's edges."""
    pos = d.randint(0, limit, (n,))
    edges = torch.tensor([p for p in (0, limit - 1, 127, 128) if p < limit][:n], dtype=torch.int64)
    pos[: len(edges)] = edges
    return pos.to(dtype)


def rope_table(d: Draw, rows: int, rope_dim: int = ROPE_DIM) -> torch.Tensor:
    """fp32 [rows, rope_dim] cos | sin table, its rows padded half the time."""
    table = rope_cos_sin_cache(rows, rope_dim, d.pick((10000.0, 160000.0, 1e6)))
    return relayout(d, table)


def random_fp8(d: Draw, *shape: int) -> torch.Tensor:
    """e4m3 values of mixed magnitudes (normal and subnormal codes, both signs, no NaN)."""
    values = d.randn(*shape) * torch.exp2(d.randint(-8, 5, shape).float())
    return values.clamp(-448, 448).to(torch.float8_e4m3fn)


def wide_range_rows(d: Draw, rows: int, dim: int, group: int) -> torch.Tensor:
    """fp32 rows whose groups span many magnitudes, so floored scales and fp8 subnormals occur."""
    group_scale = torch.exp2(d.randint(-16, 10, (rows, dim // group)).float()).repeat_interleave(group, dim=1)
    return d.randn(rows, dim) * group_scale * torch.exp2(d.randint(-10, 1, (rows, dim)).float())


def heads_up_to(d: Draw, limit: int = 128) -> int:
    return min(limit, d.pick((1, 2, 3, 8, 16, 20, 64, 70, 128, d.int(1, 128))))


def capped(value: int, cost_per_unit: int, budget: int) -> int:
    """value reduced so that value * cost_per_unit stays within budget (down to 1): keeps the references quick."""
    return min(value, max(1, budget // max(cost_per_unit, 1)))


# ---------------------------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------------------------


def _where(got: torch.Tensor, want: torch.Tensor, bad: torch.Tensor, limit: int = 4) -> list[str]:
    at = bad.nonzero()[:limit].tolist()
    return [f"  at {tuple(i)}: got {got[tuple(i)].item()!r}, want {want[tuple(i)].item()!r}" for i in at]


def expect_meta(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    if got.shape != want.shape or got.dtype != want.dtype:
        fail(f"{name}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")


def expect_equal(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal values (NaN equals NaN, -0.0 equals 0.0)."""
    expect_meta(name, got, want)
    if got.is_floating_point():
        g, w = got.float(), want.float()
        bad = ~((g == w) | (g.isnan() & w.isnan()))
    else:
        bad = got != want
    if bad.any():
        fail(f"{name}: {int(bad.sum())} of {bad.numel()} elements differ", *_where(got, want, bad))


def expect_same_bytes(name: str, got: torch.Tensor, want: torch.Tensor, skip: list[torch.Tensor] = ()) -> None:
    """The storages behind got and want are byte-for-byte equal, except at the storage byte indices in skip."""
    g, w = storage_bytes(got), storage_bytes(want)
    keep = torch.ones_like(g, dtype=torch.bool)
    for index in skip:
        keep[index.reshape(-1)] = False
    bad = keep & (g != w)
    if bad.any():
        fail(f"{name}: {int(bad.sum())} bytes of the storage differ (of {int(keep.sum())} that must not)",
             *_where(g, w, bad))


def expect_close(name: str, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> None:
    """|got - want| <= atol + rtol * |want|; NaN and infinities where the reference has them."""
    expect_meta(name, got, want)
    g, w = got.float(), want.float()
    ok = ((g - w).abs() <= atol + rtol * w.abs()) | (g == w) | (g.isnan() & w.isnan())
    if not ok.all():
        worst = (g - w).abs().nan_to_num(math.inf).max().item()
        fail(f"{name}: {int((~ok).sum())} of {ok.numel()} elements beyond atol {atol}, rtol {rtol} (worst {worst:.3g})",
             *_where(got, want, ~ok))


def ulp_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Representable steps between two tensors of one float dtype (fp8 to fp32); 0 where both are NaN."""
    int_dtype, magnitude = {1: (torch.int8, 0x7F), 2: (torch.int16, 0x7FFF), 4: (torch.int32, 0x7FFFFFFF)}[
        a.element_size()]

    def ordinal(t: torch.Tensor) -> torch.Tensor:  # sign-magnitude bits -> a monotonic integer line
        bits = t.contiguous().view(int_dtype).long()
        return torch.where(bits < 0, -(bits & magnitude), bits)

    steps = (ordinal(a) - ordinal(b)).abs()
    return torch.where(a.float().isnan() & b.float().isnan(), 0, steps)


def e4m3_steps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Steps between e4m3 codes given as bytes."""
    return ulp_steps(got.view(torch.float8_e4m3fn), want.view(torch.float8_e4m3fn))


def expect_mostly_exact(name: str, exact: torch.Tensor, min_fraction: float) -> None:
    inexact, n = int((~exact).sum()), exact.numel()
    allowed = int((1 - min_fraction) * n) + SLACK
    if inexact > allowed:
        fail(f"{name}: {inexact} of {n} elements are not bit-exact (at most {allowed} may be)")


def expect_ulp(name: str, got: torch.Tensor, want: torch.Tensor, max_steps: int = 1,
               min_exact: float = 0.99) -> None:
    """Within max_steps representable values of the reference everywhere, and nearly all of it bit-exact."""
    expect_meta(name, got, want)
    steps = ulp_steps(got, want)
    bad = steps > max_steps
    if bad.any():
        fail(f"{name}: {int(bad.sum())} of {bad.numel()} elements more than {max_steps} step(s) from the reference",
             *_where(got, want, bad))
    expect_mostly_exact(name, steps == 0, min_exact)


def expect_logits_close(got: torch.Tensor, want: torch.Tensor, compared: torch.Tensor) -> None:
    """Indexer logits: the -inf pattern of the reference and values within fp32 summation noise of the largest."""
    expect_meta("logits", got, want)
    g, w = got[compared], want[compared]
    wrong_inf = torch.isneginf(g) != torch.isneginf(w)
    if wrong_inf.any():
        fail(f"logits: {int(wrong_inf.sum())} entries are -inf in one and not the other",
             *_where(got, want, compared & (torch.isneginf(got) != torch.isneginf(want))))
    finite = ~torch.isneginf(w)
    if finite.any():
        scale = w[finite].abs().max().item()
        tol = 1e-5 * scale + 1e-6
        bad = compared & ~torch.isneginf(want) & ~((got - want).abs() <= tol)
        if bad.any():
            fail(f"logits: {int(bad.sum())} values beyond {tol:.3g} (1e-5 of the largest, {scale:.3g})",
                 *_where(got, want, bad))


def expect_attention_close(out, lse, ref_out, ref_lse, max_logits=None, ref_max_logits=None) -> None:
    """Sparse MLA outputs: out within 1e-2, lse / max_logits within 5e-3 where finite, exact zeros and infinities
    where the reference has them, no NaN (nothing NaN may be read)."""
    expect_meta("out", out, ref_out)
    expect_meta("lse", lse, ref_lse)
    for name, t in (("out", out), ("lse", lse), ("max_logits", max_logits)):
        if t is not None and t.isnan().any():
            fail(f"{name}: {int(t.isnan().sum())} NaN (read an entry that must be skipped, or an unwritten output)")
    expect_close("out", out, ref_out, atol=1e-2, rtol=1e-2)
    zero_rows = (ref_out == 0).all(-1)
    if not (out[zero_rows] == 0).all():
        fail("out: rows with no valid entry (or a +inf sink) must be exactly 0")
    pairs = [("lse", lse, ref_lse)] + ([("max_logits", max_logits, ref_max_logits)] if max_logits is not None else [])
    for name, got, want in pairs:
        expect_meta(name, got, want)
        finite = torch.isfinite(want)
        expect_equal(f"{name} (infinite entries)", torch.where(finite, 0.0, got), torch.where(finite, 0.0, want))
        expect_close(name, got[finite], want[finite], atol=5e-3, rtol=5e-3)


def expect_model1_entries(got: torch.Tensor, want: torch.Tensor, min_exact_bytes: float) -> None:
    """MODEL1 records got/want uint8 [N, 584] (448 e4m3, 64 bf16, 7 scale bytes, a zero pad byte): scale bytes within
    1 (nearly all equal), codes within 1 step where the scale is equal, bf16 RoPE values within 1 ULP."""
    got_scale, want_scale = got[:, MODEL1_DATA_BYTES:-1].int(), want[:, MODEL1_DATA_BYTES:-1].int()
    if (got_scale - want_scale).abs().max() > 1:
        fail("kv_cache: a scale byte differs by more than 1", *_where(got_scale, want_scale,
                                                                        (got_scale - want_scale).abs() > 1))
    if not got[:, -1].eq(0).all():
        fail("kv_cache: a scale pad byte is not 0")
    same_scale = got_scale == want_scale
    expect_mostly_exact("kv_cache scale bytes", same_scale, 0.99)
    codes = e4m3_steps(got[:, :MODEL1_NOPE_DIM], want[:, :MODEL1_NOPE_DIM])
    tile_steps = codes.view(-1, MODEL1_NOPE_DIM // MODEL1_TILE, MODEL1_TILE).amax(-1)
    bad_tiles = (tile_steps > 1) & same_scale
    if bad_tiles.any():
        fail(f"kv_cache: {int(bad_tiles.sum())} tiles with the reference's scale hold a code more than 1 step off",
             *_where(tile_steps, torch.zeros_like(tile_steps), bad_tiles))
    got_rope = got[:, MODEL1_NOPE_DIM:MODEL1_DATA_BYTES].contiguous().view(torch.bfloat16)
    want_rope = want[:, MODEL1_NOPE_DIM:MODEL1_DATA_BYTES].contiguous().view(torch.bfloat16)
    # a rotation that cancels to about 0 keeps only the fp32 noise of its inputs: absolute, relative to the row
    noise = ROPE_CANCEL_NOISE * want_rope.float().abs().amax(-1, keepdim=True)
    bad = (ulp_steps(got_rope, want_rope) > 1) & ((got_rope.float() - want_rope.float()).abs() > noise)
    if bad.any():
        fail(f"kv_cache: {int(bad.sum())} bf16 RoPE values differ by more than 1 ULP (and {ROPE_CANCEL_NOISE:g} of "
             "their row's largest)", *_where(got_rope, want_rope, bad))
    expect_mostly_exact("kv_cache record bytes", got == want, min_exact_bytes)


def expect_indexer_entries(got: torch.Tensor, want: torch.Tensor) -> None:
    """Indexer K records got/want uint8 [N, 132]: the same fp32 scale, codes within 1 step."""
    got_scale = got[:, INDEXER_HEAD_DIM:].contiguous().view(torch.float32)
    want_scale = want[:, INDEXER_HEAD_DIM:].contiguous().view(torch.float32)
    expect_close("kv_cache scales", got_scale, want_scale, atol=1e-5 * want_scale.abs().max().item(), rtol=1.3e-6)
    codes = e4m3_steps(got[:, :INDEXER_HEAD_DIM], want[:, :INDEXER_HEAD_DIM])
    if (codes > 1).any():
        fail(f"kv_cache: {int((codes > 1).sum())} e4m3 codes differ by more than 1 step")


def model1_record_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Storage byte indices [N, 584] of each slot's MODEL1 record: its 576 data bytes, then its 8 scale bytes."""
    return torch.cat([entry_index(cache, slots, block_size, 0, MODEL1_DATA_BYTES),
                      entry_index(cache, slots, block_size, block_size * MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES)], dim=1)


def record_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int, layout: str, placement: str
                 ) -> torch.Tensor:
    """Storage byte indices [N, record bytes] of each slot's record of ``layout`` in ``placement``."""
    if layout == "model1":
        return model1_record_index(cache, slots, block_size)
    _, data, scales, *_ = quant.RECORDS[layout]
    if quant.record_placement(layout, placement) == "per_token":
        return entry_index(cache, slots, block_size, 0, data + scales)
    return torch.cat([entry_index(cache, slots, block_size, 0, data),
                      entry_index(cache, slots, block_size, block_size * data, scales)], dim=1)


def expect_v41_entries(cache: torch.Tensor, expected: torch.Tensor, slots: torch.Tensor, block_size: int, layout: str,
                       placement: str, min_exact_bytes: float) -> None:
    """V4.1 records written by a fused writer (fp32 sums in another order than the reference): each value decodes
    within one code step of the reference's (fp8: one e4m3 step at its tile's scale; fp4: the widest e2m1 gap at
    its block's scale, 2), and most record bytes are equal."""
    got = quant.read_records(cache, slots, block_size, layout, placement)
    want = quant.read_records(expected, slots, block_size, layout, placement)
    if layout == "v41_fp8":
        scale = torch.exp2(quant.v41_fp8_pack(want)[1].float() - 127).repeat_interleave(32, 1)
        step = scale * 2.0**-3 * quant.FP8_MAX  # e4m3 neighbours 1/8 apart at the top of the range
    else:
        step = quant.decode_e4m3(quant.v41_fp4_pack(want)[1]).repeat_interleave(16, 1) * 2.0
    bad = ~((got - want).abs() <= step + 1e-30) & ~(got.isnan() & want.isnan())
    if bad.any():
        fail(f"kv_cache: {int(bad.sum())} {layout} values decode more than one code step apart",
             *_where(got, want, bad))
    index = record_index(cache, slots, block_size, layout, placement)
    expect_mostly_exact("kv_cache record bytes", storage_bytes(cache)[index] == storage_bytes(expected)[index],
                        min_exact_bytes)


def indexer_record_index(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Storage byte indices [N, 132] of each slot's indexer K record: 128 code bytes, then its fp32 scale."""
    return torch.cat([entry_index(cache, slots, block_size, 0, INDEXER_HEAD_DIM),
                      entry_index(cache, slots, block_size, block_size * INDEXER_HEAD_DIM, 4)], dim=1)


def expect_written(name: str, out: torch.Tensor, before: torch.Tensor, want: torch.Tensor) -> None:
    """An output view equals want, and no byte of its storage outside the view changed."""
    expect_equal(name, out, want)
    expected = clone_storage(before)
    expected.copy_(want)
    expect_same_bytes(f"{name} (outside the view)", out, expected)


# ---------------------------------------------------------------------------------------------
# topk_transform
# ---------------------------------------------------------------------------------------------


TOPK_SPLIT_PIECE = 4096  # about the shortest piece of a row split across threads: lengths near its multiples


def topk_row_length(d: Draw, k: int, width: int) -> int:
    """Lengths at the edges: empty, negative, around k, around the thread-split sizes, the row, past the row."""
    split = d.int(2, 16) * TOPK_SPLIT_PIECE + d.int(-1, 3)
    return d.pick((0, 1, k - 1, k, k + 1, width, width, width + 100, -5, d.int(0, width), split, split,
                   width - d.int(0, 999)))


def topk_score_row(d: Draw, width: int, k: int) -> torch.Tensor:
    """One row of scores: plain, ties, constant, rising or falling (every winner in the last or the first piece of a
    split row), clustered bands, specials (NaN, +-inf, -0.0), a sampling trap, denormals."""
    kind = d.pick(("randn", "randn", "ties", "constant", "rising", "falling", "clustered", "specials", "trap",
                   "denormal", "winners_last"))
    if kind == "ties":
        return d.randint(0, 3, (width,)).float()
    if kind == "constant":
        return torch.full((width,), 0.5)
    if kind == "rising":
        return torch.arange(width).float() if d.chance(0.5) else torch.linspace(-1, 1, width)
    if kind == "falling":
        return torch.arange(width, 0, -1).float()
    if kind == "clustered":  # narrow bands of near-equal values, the best band in one stretch of the row
        row = d.randint(0, 8, (width,)).float() + 1e-3 * d.rand(width)
        start = d.int(0, width // 2)
        row[start : start + max(1, width // 8)] += 10.0
        return row
    row = d.randn(width)
    if kind == "specials":
        for value, share in ((math.nan, 0.3), (-math.inf, 0.2), (math.inf, 0.01), (-0.0, 0.1), (0.0, 0.1)):
            row[d.rand(width) < share * d.rand(1).item()] = value
    elif kind == "trap":  # an evenly spaced sample sees only the large values: fewer of them than k
        spacing = d.pick((16, 32, 64))
        row[::spacing] = 100.0 + d.rand(len(range(0, width, spacing)))
    elif kind == "denormal":
        row = -d.rand(width) * 1e-40
        row[:: 5] = 0.0
    elif kind == "winners_last":
        row[-k:] = 9.0
    return row


def make_topk_transform(d: Draw) -> dict:
    k = d.pick(TOPK_SIZES)
    long_rows = d.chance(0.5)  # long rows are split across threads, one row most of all
    rows = d.pick((1, 1, d.count(6))) if long_rows else d.count(6)
    width = d.int(2 * TOPK_SPLIT_PIECE, 65536) if long_rows else d.int(1, 4 * k + 64)
    rows = capped(rows, width, 300_000)
    scores = torch.stack([topk_score_row(d, width, k) for _ in range(rows)]) if rows else torch.empty(0, width)
    lengths = torch.tensor([topk_row_length(d, k, width) for _ in range(rows)], dtype=torch.int64)
    row_starts = None
    if d.chance(0.3):
        row_starts = torch.tensor([d.pick((0, d.int(0, width), d.int(-20, width + 50))) for _ in range(rows)])
        row_starts = relayout(d, row_starts.to(d.index_dtype()), False)
    page_table, page_size, slots = None, 0, None
    if d.chance(0.4):
        page_size = d.pick(PAGE_SIZES + (49,))  # 49: 49 * fl(1/49) < 1, a quotient by reciprocal needs a fix-up
        pages = max(0, -(-width // page_size) + d.int(-2, 1))
        page_table = d.randint(0, max(2, 2**24 // page_size), (rows, pages))
        page_table[d.rand(rows, pages) < 0.1] = -1
        page_table = relayout(d, page_table.to(d.index_dtype()), False)
        slots = relayout(d, torch.full((rows, k), POISON_INDEX, dtype=torch.int32), False)
    raw = relayout(d, torch.full((rows, k), POISON_INDEX, dtype=torch.int32), False)
    return dict(scores=relayout(d, scores), lengths=relayout(d, lengths.to(d.index_dtype()), False),
                row_starts=row_starts, page_table=page_table, page_size=page_size, raw_indices=raw, slot_indices=slots)


def check_topk_transform(a: dict) -> None:
    raw, slots = a["raw_indices"], a["slot_indices"]
    raw_before = clone_storage(raw)
    slots_before = None if slots is None else clone_storage(slots)
    KERNELS.topk_transform(a["scores"], a["lengths"], a["row_starts"], a["page_table"], a["page_size"], raw, slots)
    want_raw, want_slots = topk.topk_transform(a["scores"], a["lengths"], raw.shape[1], a["row_starts"],
                                                  a["page_table"], a["page_size"])
    expect_written("raw_indices", raw, raw_before, want_raw)
    if slots is not None:
        expect_written("slot_indices", slots, slots_before, want_slots)


# ---------------------------------------------------------------------------------------------
# map_local_to_global_slots
# ---------------------------------------------------------------------------------------------


def make_map_local_to_global_slots(d: Draw) -> dict:
    num_reqs, max_blocks, block_size = d.count(5, 0.05), d.count(8, 0.05), d.pick(PAGE_SIZES)
    used = num_reqs * max_blocks
    table = d.randperm(used + d.int(1, 40))[:used].view(num_reqs, max_blocks)
    table[d.rand(num_reqs, max_blocks) < 0.15] = -1  # unallocated blocks
    rows, cols = d.count(10), d.count(140)
    # local positions from just below 0 to past the table's reach: every unmapped case occurs
    local = d.randint(-3, (max_blocks + 1) * block_size + 1, (rows, cols)).to(d.index_dtype())
    req_ids = d.randint(0, num_reqs, (rows,)) if num_reqs else torch.zeros(rows, dtype=torch.int64)
    req_ids[d.rand(rows) < 0.1] = d.pick((-1, num_reqs))  # requests out of range map to -1
    return dict(local_indices=relayout(d, local, False), req_ids=relayout(d, req_ids.to(d.index_dtype()), False),
                block_table=relayout(d, table.to(d.index_dtype()), False), block_size=block_size)


def check_map_local_to_global_slots(a: dict) -> None:
    out = KERNELS.map_local_to_global_slots(a["local_indices"], a["req_ids"], a["block_table"], a["block_size"])
    want = rope_slots.map_local_to_global_slots(a["local_indices"], a["req_ids"], a["block_table"], a["block_size"])
    if not out.is_contiguous():
        fail(f"out: not contiguous (strides {out.stride()})")
    expect_equal("out", out, want)


# ---------------------------------------------------------------------------------------------
# inverse_rope
# ---------------------------------------------------------------------------------------------


def make_inverse_rope(d: Draw) -> dict:
    rope_dim = d.pick((64, 64, 32, 8, 128))
    widest = V32_HEAD_DIM  # the widest head the op takes
    head_dim = d.pick((MODEL1_HEAD_DIM, V32_HEAD_DIM, rope_dim, 128, rope_dim + d.int(1, widest - rope_dim)))
    head_dim = max(rope_dim, min(widest, head_dim))
    tokens, heads = d.count(10), heads_up_to(d)
    heads = capped(heads, max(tokens, 1) * head_dim, 600_000)
    o = (d.randn(tokens, heads, head_dim) * d.pick((1e-3, 1.0, 30.0))).to(d.pick(FLOAT_DTYPES))
    max_pos = d.int(1, 600)
    return dict(o=relayout(d, o), positions=relayout(d, positions_below(d, tokens, max_pos, d.index_dtype()), False),
                cos_sin_cache=rope_table(d, max_pos, rope_dim),
                out=torch.full(o.shape, math.nan, dtype=d.pick(FLOAT_DTYPES)))


def check_inverse_rope(a: dict) -> None:
    out = a["out"]
    KERNELS.inverse_rope(a["o"], a["positions"], a["cos_sin_cache"], out)
    expect_ulp("out", out, rope_slots.inverse_rope(a["o"], a["positions"], a["cos_sin_cache"], out.dtype))


# ---------------------------------------------------------------------------------------------
# Indexer caches and logits
# ---------------------------------------------------------------------------------------------


def indexer_keys_cache(d: Draw, num_blocks: int, block_size: int, read: torch.Tensor,
                       key_format: str = "fp8") -> torch.Tensor:
    """An indexer K cache of NaN bytes with valid keys (e4m3 codes, power-of-two scales; or e2m1 codes and UE8M0
    bytes, whose 0xFF is NaN too) at the ``read`` slots."""
    cache = paged_cache(d, num_blocks, indexer_k_page_bytes(block_size, key_format), fill=0xFF)
    slots = torch.unique(read.long())
    keys = d.randn(len(slots), INDEXER_HEAD_DIM) * d.rand(len(slots), 1) * 4
    if key_format == "fp8":
        codes, scales = quant.indexer_k_pack(keys)
        quant.indexer_k_write(cache, slots, block_size, codes, scales)
        return cache
    keys = keys * mxfp4_block_magnitudes(d, len(slots), INDEXER_HEAD_DIM)
    quant.indexer_key_write(cache, slots, block_size, *quant.indexer_key_pack(keys, key_format), key_format)
    return cache


def mxfp4_block_magnitudes(d: Draw, rows: int, dim: int) -> torch.Tensor:
    """[rows, dim] powers of two, one per 32-dim block: blocks of one row at different scales."""
    return torch.exp2(d.randint(-8, 5, (rows, dim // 32)).float()).repeat_interleave(32, dim=1)


def random_query(d: Draw, query_format: str, *shape: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(e4m3 q, None) or (mxfp4 codes uint8 [..., D/2], UE8M0 bytes [..., D/32]) of mixed magnitudes."""
    if query_format == "fp8":
        return random_fp8(d, *shape), None
    rows = math.prod(shape[:-1])
    values = d.randn(rows, shape[-1]) * mxfp4_block_magnitudes(d, rows, shape[-1])
    codes, scales = quant.mxfp4_pack(values)
    return codes.view(*shape[:-1], shape[-1] // 2), scales.view(*shape[:-1], shape[-1] // 32)


def slots_read(table: torch.Tensor, lengths: list[int], block_size: int, num_blocks: int) -> torch.Tensor:
    """Slots of positions [0, lengths[r]) of each table row r whose page is in the cache."""
    found = []
    for r, n in enumerate(lengths):
        pos = torch.arange(max(0, min(n, table.shape[1] * block_size)))
        pages = table[r].long()[pos // block_size]
        ok = (pages >= 0) & (pages < num_blocks)
        found.append(pages[ok] * block_size + pos[ok] % block_size)
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.int64)


def block_table_of(d: Draw, rows: int, pages: int, num_blocks: int, shared: bool) -> torch.Tensor:
    """int64 [rows, pages] of distinct blocks (or blocks drawn from a shared pool), some missing: -1 or past the
    cache."""
    if shared:
        table = d.randint(0, num_blocks, (rows, pages))
    else:
        table = d.randperm(num_blocks)[: rows * pages].view(rows, pages)
    holes = d.rand(rows, pages) < d.pick((0.0, 0.0, 0.05))
    table[holes] = d.pick((-1, num_blocks, num_blocks + 5))
    return table


def make_fp8_paged_mqa_logits(d: Draw, key_format: str = "fp8", query_format: str = "fp8") -> dict:
    batch, next_n, block_size = d.count(4, 0.05), d.pick((1, 1, 2, 3)), d.pick(PAGE_SIZES)
    ctx = [d.pick((0, 1, 511, 512, 513, d.int(1, 600), d.int(1, 3000), d.int(1, 9000))) for _ in range(batch)]
    longest = max(ctx, default=0)
    heads = capped(heads_up_to(d), max(1, batch * next_n * longest), 40_000_000)
    pages = -(-(longest + 3) // block_size) + d.int(0, 2)
    shared = d.chance(0.3)
    num_blocks = max(1, batch * pages + d.int(1, 3)) if not shared else d.int(1, max(2, pages))
    table = block_table_of(d, batch, pages, num_blocks, shared)
    if d.chance(0.4):  # per-row lengths [B, next_n]
        lens = (torch.tensor(ctx, dtype=torch.int64)[:, None] - d.randint(0, 4, (batch, next_n))).clamp(min=0)
    else:  # row j of a request sees ctx - next_n + j + 1 entries
        lens = torch.tensor(ctx, dtype=torch.int64)
    max_context_len = longest + d.int(0, 5) if d.chance(0.9) else d.int(0, longest + 1)  # shorter: rows clamp
    seen = lens.max(dim=-1).values if lens.dim() == 2 else lens
    read = slots_read(table, [min(int(n), max_context_len) for n in seen.reshape(-1).tolist()], block_size,
                      num_blocks)
    q, q_scale = random_query(d, query_format, batch, next_n, heads, INDEXER_HEAD_DIM)
    case = dict(q=relayout(d, q), kv_cache=indexer_keys_cache(d, num_blocks, block_size, read, key_format),
                weights=relayout(d, d.randn(batch * next_n, heads)),
                context_lens=relayout(d, lens.to(d.index_dtype()), False),
                block_table=relayout(d, table.to(d.index_dtype()), False), block_size=block_size,
                max_context_len=max_context_len, clean_logits=d.chance(0.5))
    return case if key_format == query_format == "fp8" else dict(case, q_scale=q_scale, key_format=key_format)


def paged_valid_mask(lens: torch.Tensor, next_n: int, max_len: int) -> torch.Tensor:
    """[B*next_n, max_len]: positions inside each row's (clamped) length."""
    rows = lens.long() if lens.dim() == 2 else lens.long()[:, None] - next_n + 1 + torch.arange(next_n)
    return torch.arange(max_len)[None, :] < rows.reshape(-1, 1).clamp(0, max_len)


def check_fp8_paged_mqa_logits(a: dict) -> None:
    args = (a["q"], a["kv_cache"], a["weights"], a["context_lens"], a["block_table"], a["block_size"],
            a["max_context_len"])
    got = KERNELS.fp8_paged_mqa_logits(*args, a["clean_logits"], None)
    want = indexer.fp8_paged_mqa_logits(*args)
    compared = torch.ones_like(want, dtype=torch.bool)
    if not a["clean_logits"]:  # the contract leaves the rest unspecified
        compared = paged_valid_mask(a["context_lens"], a["q"].shape[1], a["max_context_len"])
    expect_logits_close(got, want, compared)


def make_fp8_mqa_logits(d: Draw, key_format: str = "fp8", query_format: str = "fp8") -> dict:
    rows, keys = d.count(12), d.pick((0, 1, 5, d.int(1, 300), d.int(1, 1200), d.int(1, 1200)))
    dim = d.pick((32, 64, 96, 128, 128, 256))
    heads = capped(heads_up_to(d), max(1, rows * keys * dim), 60_000_000)
    ks = d.randint(-3, keys + 1, (rows,))
    ke = ks + d.randint(-2, keys + 6, (rows,))
    if rows:
        ks[0], ke[0] = 0, keys  # one full row
    k = random_fp8(d, keys, dim)
    k_scale = torch.exp2(d.randint(-10, 3, (keys,)).float())
    columns = torch.arange(keys)
    read = ((columns >= ks[:, None].clamp(min=0)) & (columns < ke[:, None])).any(0)
    if key_format == "mxfp4":  # e2m1 codes with a UE8M0 byte per 32 dims
        k, k_scale = quant.mxfp4_pack(d.randn(keys, dim) * mxfp4_block_magnitudes(d, keys, dim))
        k_scale[~read] = 0xFF
    k.view(torch.uint8)[~read] = 0xFF  # keys outside every row's range are NaN: never needed
    if key_format == "fp8":
        k_scale[~read] = math.nan
    index_dtype = d.index_dtype()
    q, q_scale = random_query(d, query_format, rows, heads, dim)
    case = dict(q=relayout(d, q), k=relayout(d, k), k_scale=relayout(d, k_scale) if k_scale.dim() == 2 else k_scale,
                weights=relayout(d, d.randn(rows, heads)), ks=relayout(d, ks.to(index_dtype), False),
                ke=relayout(d, ke.to(index_dtype), False), clean_logits=d.chance(0.5))
    if key_format == query_format == "fp8":
        return case
    return dict(case, q_scale=None if q_scale is None else relayout(d, q_scale), key_format=key_format)


def check_fp8_mqa_logits(a: dict) -> None:
    args = (a["q"], a["k"], a["k_scale"], a["weights"], a["ks"], a["ke"])
    got = KERNELS.fp8_mqa_logits(*args, a["clean_logits"])
    want = indexer.fp8_mqa_logits(*args)
    cols = torch.arange(a["k"].shape[0])
    inside = (cols >= a["ks"].long()[:, None]) & (cols < a["ke"].long()[:, None])
    expect_logits_close(got, want, torch.ones_like(inside) if a["clean_logits"] else inside)


def make_fp8_paged_mqa_topk(d: Draw, key_format: str = "fp8", query_format: str = "fp8") -> dict:
    k, block_size = d.pick(TOPK_SIZES), d.pick(PAGE_SIZES)
    requests = [(d.pick((0, d.int(0, 700), d.int(k - 20, k + 20), d.int(0, 3000), d.int(0, 3000),
                         d.int(8000, 12000))), d.int(1, 12)) for _ in range(d.int(1, 4))]
    pages = [-(-(prefix + q_len) // block_size) for prefix, q_len in requests]
    width = max(pages) + d.int(0, 2)
    num_blocks = sum(pages) + d.int(1, 3)
    free = d.randperm(num_blocks).tolist()
    table = torch.full((len(requests), width), -1, dtype=torch.int64)
    for i, n in enumerate(pages):
        table[i, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int64)
    if d.chance(0.3):  # a missing page inside a row: its entries score -inf
        table[0, d.int(0, width - 1)] = -1
    # causal prefill rows: request i contributes q_len rows whose lengths grow from prefix + 1
    lengths = torch.cat([prefix + 1 + torch.arange(q_len) for prefix, q_len in requests])
    rows = torch.cat([torch.full((q_len,), i) for i, (_, q_len) in enumerate(requests)])
    for r in range(len(lengths)):  # short rows are not scored: any length below k is fine
        if d.chance(0.1):
            lengths[r] = d.pick((0, -3, 1, k, k + 1 if k + 1 <= width * block_size else k))
    if d.chance(0.5):
        order = d.randperm(len(rows))
        lengths, rows = lengths[order], rows[order]
    heads = capped(heads_up_to(d, 64), int(lengths.clamp(min=0).sum()) + 1, 12_000_000)
    read = slots_read(table, [int(lengths[rows == i].max()) for i in range(len(requests))], block_size, num_blocks)
    index_dtype = d.index_dtype()
    out = torch.full((len(rows), k), POISON_INDEX, dtype=torch.int32)
    q, q_scale = random_query(d, query_format, len(rows), heads, INDEXER_HEAD_DIM)
    case = dict(q=relayout(d, q), kv_cache=indexer_keys_cache(d, num_blocks, block_size, read, key_format),
                weights=relayout(d, d.randn(len(rows), heads)), lengths=relayout(d, lengths.to(index_dtype), False),
                block_table=relayout(d, table.to(index_dtype), False),
                row_requests=relayout(d, rows.to(d.index_dtype()), False), block_size=block_size,
                topk_indices=relayout(d, out))
    return case if key_format == query_format == "fp8" else dict(case, q_scale=q_scale, key_format=key_format)


def check_fp8_paged_mqa_topk(a: dict) -> None:
    out = a["topk_indices"]
    before = clone_storage(out)
    q, cache, weights, lengths, table = a["q"], a["kv_cache"], a["weights"], a["lengths"], a["block_table"]
    KERNELS.fp8_paged_mqa_topk(q, cache, weights, lengths, table, a["row_requests"], a["block_size"], out)
    # The contract: exactly the top-k of the unfused logits (the logits fuzzer checks those against the reference).
    width = max(0, int(lengths.max())) if lengths.numel() else 0
    logits = KERNELS.fp8_paged_mqa_logits(q.unsqueeze(1), cache, weights, lengths, table[a["row_requests"].long()],
                                          a["block_size"], width, True, None)
    want = topk.topk_transform(logits, lengths, out.shape[1])[0]
    expect_written("topk_indices", out, before, want)


# ---- MXFP4 keys and queries (DeepSeek-V4.1): the .format overloads, every (key, query) format pair ----

INDEXER_FORMATS = ("fp8", "mxfp4")


def draw_formats(d: Draw) -> tuple[str, str]:
    """(key format, query format), never both fp8 (the plain ops' fuzzers cover that pair)."""
    return d.pick([(k, q) for k in INDEXER_FORMATS for q in INDEXER_FORMATS if (k, q) != ("fp8", "fp8")])


def check_fp8_paged_mqa_logits_format(a: dict) -> None:
    args = (a["q"], a["kv_cache"], a["weights"], a["context_lens"], a["block_table"], a["block_size"],
            a["max_context_len"])
    got = KERNELS.fp8_paged_mqa_logits.format(*args, a["clean_logits"], None, a["q_scale"], a["key_format"])
    want = indexer.fp8_paged_mqa_logits(*args, q_scale=a["q_scale"], key_format=a["key_format"])
    compared = torch.ones_like(want, dtype=torch.bool)
    if not a["clean_logits"]:
        compared = paged_valid_mask(a["context_lens"], a["q"].shape[1], a["max_context_len"])
    expect_logits_close(got, want, compared)


def check_fp8_mqa_logits_format(a: dict) -> None:
    args = (a["q"], a["k"], a["k_scale"], a["weights"], a["ks"], a["ke"])
    got = KERNELS.fp8_mqa_logits.format(*args, a["clean_logits"], a["q_scale"], a["key_format"])
    want = indexer.fp8_mqa_logits(*args, q_scale=a["q_scale"], key_format=a["key_format"])
    cols = torch.arange(a["k"].shape[0])
    inside = (cols >= a["ks"].long()[:, None]) & (cols < a["ke"].long()[:, None])
    expect_logits_close(got, want, torch.ones_like(inside) if a["clean_logits"] else inside)


def check_fp8_paged_mqa_topk_format(a: dict) -> None:
    out = a["topk_indices"]
    before = clone_storage(out)
    q, cache, weights, lengths, table = a["q"], a["kv_cache"], a["weights"], a["lengths"], a["block_table"]
    KERNELS.fp8_paged_mqa_topk.format(q, cache, weights, lengths, table, a["row_requests"], a["block_size"], out,
                                      a["q_scale"], a["key_format"])
    width = max(0, int(lengths.max())) if lengths.numel() else 0
    q_scale = None if a["q_scale"] is None else a["q_scale"].unsqueeze(1)
    logits = KERNELS.fp8_paged_mqa_logits.format(q.unsqueeze(1), cache, weights, lengths,
                                                 table[a["row_requests"].long()], a["block_size"], width, True, None,
                                                 q_scale, a["key_format"])
    expect_written("topk_indices", out, before, topk.topk_transform(logits, lengths, out.shape[1])[0])


# ---------------------------------------------------------------------------------------------
# KV cache writers and reader
# ---------------------------------------------------------------------------------------------

KV_LAYOUTS = {"model1": MODEL1_HEAD_DIM, "v32": V32_HEAD_DIM, "v41_fp8": MODEL1_HEAD_DIM, "v41_fp4": MODEL1_HEAD_DIM}
RECORDS_512 = ("model1", "v41_fp8", "v41_fp4")  # the records the fused 512-dim writers store
PLACEMENTS = ("page_split", "per_token")


def make_quantize_kv_insert(d: Draw) -> dict:
    layout, block_size, tokens = d.pick(KV_LAYOUTS), d.pick(PAGE_SIZES), d.pick((0, 1, d.int(1, 40)))
    head_dim, placement = KV_LAYOUTS[layout], d.pick(PLACEMENTS)
    num_blocks = -(-2 * tokens // block_size) + d.int(1, 2)  # about half the slots stay unwritten
    kv = wide_range_rows(d, tokens, head_dim, MODEL1_TILE).to(d.pick(FLOAT_DTYPES))
    return dict(kv=relayout(d, kv),
                slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.2, d.index_dtype()),
                                      False),
                kv_cache=paged_cache(d, num_blocks, kv_page_bytes(block_size, layout, placement)),
                block_size=block_size, layout=layout, placement=placement)


def check_quantize_kv_insert(a: dict) -> None:
    cache, expected = a["kv_cache"], clone_storage(a["kv_cache"])
    KERNELS.quantize_kv_insert.layout(a["kv"], a["slot_mapping"], cache, a["block_size"], a["layout"],
                                      a["placement"])
    quant.write_records(expected, a["slot_mapping"].long(), a["block_size"], a["kv"].float(), a["layout"],
                        a["placement"])
    expect_same_bytes("kv_cache", cache, expected)


def make_dequantize_kv_gather(d: Draw) -> dict:
    layout, block_size, num_blocks = d.pick(KV_LAYOUTS), d.pick(PAGE_SIZES), d.int(1, 6)
    capacity = num_blocks * block_size
    shape = d.pick(((d.int(0, 40),), (d.int(0, 6), d.int(0, 8)), (d.int(1, 3), d.int(1, 3), d.int(0, 7)), ()))
    index_dtype = d.index_dtype()
    far = 2**40 if index_dtype == torch.int64 else 2**31 - 1
    slots = d.randint(0, capacity, shape)
    invalid = d.rand(*shape) < 0.2
    candidates = torch.tensor([-1, -7, capacity, capacity + 1000, far])
    slots[invalid] = candidates[d.randint(0, len(candidates), (int(invalid.sum()),))]
    placement = d.pick(PLACEMENTS)
    return dict(kv_cache=paged_cache(d, num_blocks, kv_page_bytes(block_size, layout, placement)),  # NaN too
                slots=relayout(d, slots.to(index_dtype), False), block_size=block_size, layout=layout,
                placement=placement)


def check_dequantize_kv_gather(a: dict) -> None:
    cache, slots, block_size, layout = a["kv_cache"], a["slots"], a["block_size"], a["layout"]
    got = KERNELS.dequantize_kv_gather.layout(cache, slots, block_size, layout, a["placement"])
    want = quant.read_records(cache, slots.long(), block_size, layout, a["placement"])
    expect_equal("out", got, want.to(torch.bfloat16))
    capacity = cache.shape[0] * block_size
    invalid = (slots < 0) | (slots >= capacity)
    if not got[invalid].view(torch.int16).eq(0).all():
        fail("out: rows of invalid slots must be +0.0 exactly")


def make_indexer_k_quant_insert(d: Draw) -> dict:
    block_size, tokens = d.pick(PAGE_SIZES), d.pick((0, 1, d.int(1, 40)))
    num_blocks = -(-2 * tokens // block_size) + d.int(1, 2)
    k = wide_range_rows(d, tokens, INDEXER_HEAD_DIM, INDEXER_HEAD_DIM).to(d.pick(FLOAT_DTYPES))
    return dict(k=relayout(d, k),
                slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.2, d.index_dtype()),
                                      False),
                kv_cache=paged_cache(d, num_blocks, indexer_k_page_bytes(block_size)), block_size=block_size)


def check_indexer_k_quant_insert(a: dict) -> None:
    cache, expected = a["kv_cache"], clone_storage(a["kv_cache"])
    KERNELS.indexer_k_quant_insert(a["k"], a["slot_mapping"], cache, a["block_size"])
    codes, scales = quant.indexer_k_pack(a["k"].float())
    quant.indexer_k_write(expected, a["slot_mapping"].long(), a["block_size"], codes, scales)
    expect_same_bytes("kv_cache", cache, expected)


def make_indexer_k_quant_insert_format(d: Draw) -> dict:
    key_format = d.pick(INDEXER_FORMATS)
    block_size, tokens = d.pick(PAGE_SIZES), d.pick((0, 1, d.int(1, 40)))
    num_blocks = -(-2 * tokens // block_size) + d.int(1, 2)
    k = wide_range_rows(d, tokens, INDEXER_HEAD_DIM, 32).to(d.pick(FLOAT_DTYPES))
    return dict(k=relayout(d, k),
                slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.2, d.index_dtype()),
                                      False),
                kv_cache=paged_cache(d, num_blocks, indexer_k_page_bytes(block_size, key_format)),
                block_size=block_size, key_format=key_format)


def check_indexer_k_quant_insert_format(a: dict) -> None:
    cache, expected = a["kv_cache"], clone_storage(a["kv_cache"])
    KERNELS.indexer_k_quant_insert.format(a["k"], a["slot_mapping"], cache, a["block_size"], a["key_format"])
    quant.indexer_k_insert(expected, a["slot_mapping"].long(), a["block_size"], a["k"].float(), a["key_format"])
    expect_same_bytes("kv_cache", cache, expected)


def make_indexer_k_norm_rope_store(d: Draw) -> dict:
    key_format, ratio = d.pick(INDEXER_FORMATS), d.pick((1, 2, 4, 4, 8, 128))
    tokens, block_size = d.pick((0, 1, d.int(1, 40))), d.pick(PAGE_SIZES)
    num_blocks = -(-2 * tokens // block_size) + 1
    k_pre = (wide_range_rows(d, tokens, INDEXER_HEAD_DIM, INDEXER_HEAD_DIM) * 3).to(torch.bfloat16)
    return dict(k_pre=relayout(d, k_pre),
                positions=relayout(d, closing_and_other_positions(d, tokens, ratio).to(d.index_dtype()), False),
                cos_sin_cache=rope_table(d, COMPRESS_MAX_POSITION), norm_weight=d.rand(INDEXER_HEAD_DIM) + 0.5,
                eps=d.pick((1e-6, 1e-5)),
                kv_cache=paged_cache(d, num_blocks, indexer_k_page_bytes(block_size, key_format)),
                slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.15, d.index_dtype()),
                                      False),
                block_size=block_size, compress_ratio=ratio, key_format=key_format)


def check_indexer_k_norm_rope_store(a: dict) -> None:
    cache, expected = a["kv_cache"], clone_storage(a["kv_cache"])
    KERNELS.indexer_k_norm_rope_store(*a.values())
    indexer.indexer_k_norm_rope_store(**{**a, "kv_cache": expected})
    expect_same_bytes("kv_cache", cache, expected)


# ---------------------------------------------------------------------------------------------
# q / kv preparation
# ---------------------------------------------------------------------------------------------


def make_qnorm_rope_kv_insert(d: Draw) -> dict:
    tokens, heads, block_size = d.pick((0, 1, d.int(1, 20))), heads_up_to(d), d.pick(PAGE_SIZES)
    heads = capped(heads, max(tokens, 1) * MODEL1_HEAD_DIM, 1_000_000)
    padded_heads = min(128, heads + d.pick((0, 0, 1, 7, d.int(0, 128))))
    inserted = d.int(0, tokens)  # fewer slots than tokens, as with DP padding
    dtype = d.pick(FLOAT_DTYPES)
    # q heads and kv tiles of mixed magnitudes: eps-dominated RMS, all-subnormal fp8 tiles, scales > 1
    q_scale = torch.tensor([1e-4, 4.0, 100.0])[d.randint(0, 3, (tokens, heads, 1))]
    q = (d.randn(tokens, heads, MODEL1_HEAD_DIM) * q_scale).to(dtype)
    kv_rows = inserted + d.int(0, 2)
    tiles = MODEL1_HEAD_DIM // MODEL1_TILE
    kv_scale = torch.tensor([1e-7, 1e-5, 3.0, 100.0])[d.randint(0, 4, (kv_rows, tiles, 1))]
    kv = (d.randn(kv_rows, tiles, MODEL1_TILE) * kv_scale).reshape(kv_rows, MODEL1_HEAD_DIM).to(dtype)
    num_blocks = max(1, -(-2 * inserted // block_size))
    max_pos = d.int(129, 600)
    layout, placement = d.pick(RECORDS_512), d.pick(PLACEMENTS)
    return dict(q=relayout(d, q), kv=relayout(d, kv),
                positions=relayout(d, positions_below(d, tokens, max_pos, d.index_dtype()), False),
                cos_sin_cache=rope_table(d, max_pos),
                slot_mapping=relayout(d, distinct_slots(d, inserted, num_blocks * block_size, 0.3, d.index_dtype()),
                                      False),
                kv_cache=paged_cache(d, num_blocks, kv_page_bytes(block_size, layout, placement)),
                block_size=block_size, eps=d.pick((1e-6, 1e-5)), layout=layout, placement=placement,
                q_norm=layout == "model1" or d.chance(0.5),  # V4.1 has no q-norm; the op takes it either way
                q_out=torch.full((tokens, padded_heads, MODEL1_HEAD_DIM), math.nan, dtype=dtype))


def check_qnorm_rope_kv_insert(a: dict) -> None:
    cache, expected_cache, q_out = a["kv_cache"], clone_storage(a["kv_cache"]), a["q_out"]
    args = (a["q"], a["kv"], a["positions"], a["cos_sin_cache"], a["slot_mapping"])
    records = (a["q_norm"], a["layout"], a["placement"])
    KERNELS.qnorm_rope_kv_insert.layout(*args, cache, a["block_size"], a["eps"], q_out, *records)
    want = kv_cache.qnorm_rope_kv_insert(*args, expected_cache, a["block_size"], a["eps"], q_out.shape[1],
                                         q_norm=a["q_norm"], layout=a["layout"], placement=a["placement"])
    heads = a["q"].shape[1]
    if not (q_out[:, heads:] == 0).all():
        fail("q_out: padded heads must be exactly 0")
    if q_out.dtype == torch.float32:
        expect_close("q_out", q_out, want, atol=1e-5, rtol=1e-5)
    else:  # one step, or an absolute 1e-5 where an fp32 rounding of the RMS survives a RoPE cancellation
        expect_meta("q_out", q_out, want)
        steps = ulp_steps(q_out, want)
        bad = (steps > 1) & ((q_out.float() - want.float()).abs() > 1e-5)
        if bad.any():
            fail(f"q_out: {int(bad.sum())} of {bad.numel()} elements beyond 1 step and 1e-5",
                 *_where(q_out, want, bad))
        expect_mostly_exact("q_out", steps == 0, 0.99)
    slots = a["slot_mapping"].long()
    slots = slots[slots >= 0]
    index = record_index(cache, slots, a["block_size"], a["layout"], a["placement"])
    if index.numel() and a["layout"] == "model1":
        expect_model1_entries(storage_bytes(cache)[index], storage_bytes(expected_cache)[index], 0.99)
    elif index.numel():
        expect_v41_entries(cache, expected_cache, slots, a["block_size"], a["layout"], a["placement"], 0.98)
    expect_same_bytes("kv_cache (outside the written records)", cache, expected_cache, [index])


def make_indexer_q_rope_quant(d: Draw) -> dict:
    tokens, heads = d.pick((0, 1, d.int(1, 12))), heads_up_to(d)
    # per-head magnitudes: below the 1e-4 amax floor, ordinary, and large enough to need scales > 1
    magnitude = torch.tensor([1e-6, 1.0, 30.0, 1e3])[d.randint(0, 4, (tokens, heads, 1))]
    q = (d.randn(tokens, heads, INDEXER_HEAD_DIM) * magnitude).to(d.pick(FLOAT_DTYPES))
    max_pos = d.int(1, 600)
    return dict(q=relayout(d, q), positions=relayout(d, positions_below(d, tokens, max_pos, d.index_dtype()), False),
                cos_sin_cache=rope_table(d, max_pos), weights=relayout(d, d.randn(tokens, heads)),
                softmax_scale=d.pick((INDEXER_HEAD_DIM**-0.5, 1.0, 0.37)), head_scale=d.pick((heads**-0.5, 1.0, 2.5)),
                q_fp8=d.bytes(tokens, heads, INDEXER_HEAD_DIM).view(torch.float8_e4m3fn),
                weights_out=torch.full((tokens, heads), math.nan))


def check_indexer_q_rope_quant(a: dict) -> None:
    args = (a["q"], a["positions"], a["cos_sin_cache"], a["weights"], a["softmax_scale"], a["head_scale"])
    KERNELS.indexer_q_rope_quant(*args, a["q_fp8"], a["weights_out"])
    want_fp8, want_weights = indexer.indexer_q_rope_quant(*args)
    expect_ulp("q_fp8", a["q_fp8"], want_fp8)
    expect_close("weights_out", a["weights_out"], want_weights, atol=1e-6, rtol=1e-5)


def make_indexer_q_rope_quant_format(d: Draw) -> dict:
    query_format = d.pick(INDEXER_FORMATS)
    a = make_indexer_q_rope_quant(d)
    if query_format == "mxfp4":
        tokens, heads = a["q"].shape[:2]
        a["q_fp8"] = d.bytes(tokens, heads, INDEXER_HEAD_DIM // 2)
        return dict(a, query_format=query_format, q_scale_out=d.bytes(tokens, heads, INDEXER_HEAD_DIM // 32))
    return dict(a, query_format=query_format, q_scale_out=None)


def check_indexer_q_rope_quant_format(a: dict) -> None:
    args = (a["q"], a["positions"], a["cos_sin_cache"], a["weights"], a["softmax_scale"], a["head_scale"])
    KERNELS.indexer_q_rope_quant.format(*args, a["q_fp8"], a["weights_out"], a["query_format"], a["q_scale_out"])
    if a["query_format"] == "fp8":
        want_fp8, want_weights = indexer.indexer_q_rope_quant(*args)
        expect_ulp("q_fp8", a["q_fp8"], want_fp8)
        expect_close("weights_out", a["weights_out"], want_weights, atol=1e-6, rtol=1e-5)
        return
    codes, scales, weights = indexer.indexer_q_rope_quant_mxfp4(*args)
    expect_equal("q codes", a["q_fp8"], codes)
    expect_equal("q scales", a["q_scale_out"], scales)
    expect_equal("weights_out", a["weights_out"], weights)


# ---------------------------------------------------------------------------------------------
# Sparse MLA
# ---------------------------------------------------------------------------------------------

MLA_LAYOUTS = {MODEL1_HEAD_DIM: "model1", V32_HEAD_DIM: "v32"}  # d_qk -> the record it names
MLA_RECORD_PAIRS = sparse_mla.RECORD_PAIRS  # (main, extra) records of a decode


def mla_indices(d: Draw, shape, capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """Slot ids in [0, capacity) (duplicates included), about 20% invalid: -1, negative, past the cache, far past."""
    idx = d.randint(0, capacity, shape)
    kind = d.rand(*shape)
    idx[kind < 0.1] = -1
    idx[(kind >= 0.1) & (kind < 0.15)] = capacity + 3
    idx[(kind >= 0.15) & (kind < 0.18)] = -5
    idx[(kind >= 0.18) & (kind < 0.2)] = 2**40 if dtype == torch.int64 else 2**31 - 1
    return idx.to(dtype)


def mla_lengths(d: Draw, n: int, topk: int, dtype: torch.dtype) -> torch.Tensor | None:
    """None half the time; else lengths from 0 to past topk (0 and topk + 5 always present when n allows)."""
    if d.chance(0.5):
        return None
    lengths = d.randint(0, topk + 1, (n,))
    lengths[0] = topk + 5
    if n > 1:
        lengths[1] = 0
    return lengths.to(dtype)


def valid_entries(indices: torch.Tensor, capacity: int, lengths: torch.Tensor | None) -> torch.Tensor:
    valid = (indices >= 0) & (indices < capacity)
    if lengths is not None:
        valid &= torch.arange(indices.shape[-1]) < lengths.long().reshape(-1, *[1] * (indices.dim() - 1))
    return valid


def attention_sink(d: Draw, heads: int) -> torch.Tensor | None:
    """None 40% of the time; else finite sinks of both signs and the two infinities."""
    if d.chance(0.4):
        return None
    sink = d.randn(heads) * 2
    sink[1::5] = math.inf
    sink[3::5] = -math.inf
    return sink


def mla_index_set(d: Draw, d_qk: int, b: int, s_q: int, topk: int, dtype: torch.dtype, layout: str | None = None,
                  placement: str = "page_split"):
    """(cache, indices, lengths, block_size) with about 2 * topk slots of capacity; NaN where nothing attends."""
    block_size = d.pick(PAGE_SIZES + (69, 576))
    num_blocks = max(2, -(-2 * topk // block_size))
    capacity = num_blocks * block_size
    indices = mla_indices(d, (b, s_q, topk), capacity, dtype)
    lengths = mla_lengths(d, b, topk, dtype)
    layout = layout or MLA_LAYOUTS[d_qk]
    cache = paged_cache(d, num_blocks, kv_page_bytes(block_size, layout, placement), fill=0xFF)  # NaN code, scale
    slots = torch.unique(indices[valid_entries(indices, capacity, lengths)].long())
    quant.write_records(cache, slots, block_size, d.randn(len(slots), d_qk) * 0.3, layout, placement)  # O(1) scores
    return cache, relayout(d, indices, False), lengths, block_size


def softmax_scale(d: Draw, d_qk: int) -> float:
    return d_qk**-0.5 if d.chance(0.8) else d.pick((-0.05, 0.0, 0.3))


def make_sparse_mla_decode(d: Draw) -> dict:
    records, placement = d.pick(MLA_RECORD_PAIRS), d.pick(PLACEMENTS)
    d_qk, b, s_q, index_dtype = quant.RECORDS[records[0]][0], d.int(1, 4), d.int(1, 4), d.index_dtype()
    topk = d.pick((1, 37, 64, 128, 300, 512, 576, d.int(1, 1100)))
    extra_topk = d.pick((None, None, 0, 32, 64, 128, d.int(1, 600)))
    heads = capped(heads_up_to(d), b * s_q * (topk + (extra_topk or 0)), 1_500_000)
    cache, indices, lengths, block_size = mla_index_set(d, d_qk, b, s_q, topk, index_dtype, records[0], placement)
    args = dict(q=relayout(d, d.randn(b, s_q, heads, d_qk).bfloat16()), kv_cache=cache, indices=indices,
                topk_length=lengths, attn_sink=attention_sink(d, heads), extra_kv_cache=None, extra_indices=None,
                extra_topk_length=None, block_size=block_size, extra_block_size=0, sm_scale=softmax_scale(d, d_qk),
                with_plan=d.chance(0.3), layout=records[0], extra_layout=records[1], placement=placement)
    if extra_topk is not None:
        cache, indices, lengths, block_size = mla_index_set(d, d_qk, b, s_q, extra_topk, index_dtype, records[1],
                                                            placement)
        args.update(extra_kv_cache=cache, extra_indices=indices, extra_topk_length=lengths,
                    extra_block_size=block_size)
    return args


def check_sparse_mla_decode(a: dict) -> None:
    sets = (a["q"], a["kv_cache"], a["indices"], a["topk_length"], a["attn_sink"], a["extra_kv_cache"],
            a["extra_indices"], a["extra_topk_length"])
    plan = (None, None)
    if a["with_plan"]:  # a plan for these lengths; the CPU may ignore it, the result must not change
        plan = KERNELS.sparse_mla_decode_schedule(a["q"], a["indices"], a["topk_length"], a["extra_indices"],
                                                  a["extra_topk_length"])
    records = a["layout"], a["extra_layout"], a["placement"]
    out, lse = KERNELS.sparse_mla_decode.layout(*sets, a["block_size"], a["extra_block_size"],
                                                sparse_mla.HEAD_DIM_V, a["sm_scale"], *plan, *records)
    ref_out, ref_lse = sparse_mla.sparse_mla_decode(
        a["q"], a["kv_cache"], a["indices"], a["block_size"], a["topk_length"], a["attn_sink"], a["extra_kv_cache"],
        a["extra_indices"], a["extra_topk_length"], a["extra_block_size"], sparse_mla.HEAD_DIM_V, a["sm_scale"],
        *records)
    expect_attention_close(out, lse, ref_out, ref_lse)


def make_sparse_mla_prefill(d: Draw) -> dict:
    d_qk, s_q, index_dtype = d.pick(MLA_LAYOUTS), d.pick((1, 3, d.int(1, 64))), d.index_dtype()
    s_kv = d.pick((1, 50, d.int(1, 600), d.int(1, 4096)))
    topk = d.pick((1, 37, 64, 192, 640, d.int(1, 2048)))
    heads = capped(heads_up_to(d), s_q * topk, 1_500_000)
    indices = mla_indices(d, (s_q, 1, topk), s_kv, index_dtype)
    lengths = mla_lengths(d, s_q, topk, index_dtype)
    read = torch.unique(indices[:, 0][valid_entries(indices[:, 0], s_kv, lengths)].long())
    kv = torch.full((s_kv, 1, d_qk), math.nan).bfloat16()  # rows no valid index reads stay NaN
    kv[read] = (d.randn(len(read), 1, d_qk) * 0.3).bfloat16()
    return dict(q=relayout(d, d.randn(s_q, heads, d_qk).bfloat16()), kv=relayout(d, kv),
                indices=relayout(d, indices, False), sm_scale=softmax_scale(d, d_qk),
                attn_sink=attention_sink(d, heads), topk_length=lengths)


def check_sparse_mla_prefill(a: dict) -> None:
    args = (a["q"], a["kv"], a["indices"], a["sm_scale"], sparse_mla.HEAD_DIM_V, a["attn_sink"], a["topk_length"])
    out, max_logits, lse = KERNELS.sparse_mla_prefill(*args)
    ref_out, ref_max, ref_lse = sparse_mla.sparse_mla_prefill(*args)
    expect_attention_close(out, lse, ref_out, ref_lse, max_logits, ref_max)


# ---------------------------------------------------------------------------------------------
# Compressor
# ---------------------------------------------------------------------------------------------

# (compress ratio, coff): the model's C4 (overlapping windows) and C128, and other geometries the ops accept
COMPRESS_GEOMETRIES = ((4, 2), (4, 2), (4, 2), (128, 1), (128, 1), (2, 1), (2, 1), (1, 1), (8, 2), (16, 1), (64, 2))
COMPRESS_MAX_POSITION = 1024


def random_floats(d: Draw, *shape: int) -> torch.Tensor:
    """Random bytes viewed as fp32 (NaN and inf included): storage that must not change."""
    return d.bytes(*shape, 4).view(torch.float32).squeeze(-1)


def state_cache(d: Draw, width: int, block_size: int, num_blocks: int) -> torch.Tensor:
    """fp32 [blocks, block_size, 2 * width] over random bytes, its block and row strides larger than the data half
    the time."""
    backing = random_floats(d, num_blocks, block_size + d.pick((0, 1)), 2 * width + d.pick((0, 0, 24)))
    return backing[:, :block_size, : 2 * width]


def make_save_partial_states(d: Draw) -> dict:
    ratio, coff = d.pick(COMPRESS_GEOMETRIES)
    width = coff * d.pick((MODEL1_HEAD_DIM, INDEXER_HEAD_DIM)) if d.chance(0.8) else d.int(1, 300)
    tokens, block_size, num_blocks = d.pick((0, 1, d.int(1, 24))), d.pick((1, 2, 4, 8, 16, 64)), d.int(1, 40)
    tokens = min(tokens, num_blocks * block_size)
    state = state_cache(d, width, block_size, num_blocks)
    index_dtype = d.index_dtype()
    return dict(kv=relayout(d, d.randn(tokens, width)), score=relayout(d, d.randn(tokens, width)),
                ape=d.randn(ratio, width), positions=relayout(d, d.randint(0, 5000, (tokens,)).to(index_dtype), False),
                state_cache=state,
                slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.1, index_dtype), False))


def check_save_partial_states(a: dict) -> None:
    state, expected = a["state_cache"], clone_storage(a["state_cache"])
    args = (a["kv"], a["score"], a["ape"], a["positions"])
    KERNELS.save_partial_states(*args, state, a["slot_mapping"])
    compressor.save_partial_states(*args, expected, a["slot_mapping"])
    expect_same_bytes("state_cache", state, expected)


def closing_and_other_positions(d: Draw, tokens: int, ratio: int) -> torch.Tensor:
    """Group-closing positions ((p+1) % R == 0, the first groups included) mixed with others."""
    first = [ratio - 1, ratio, 2 * ratio - 1]  # the first group (C4: half its window precedes 0), off-boundary, second
    closing = (d.randint(1, COMPRESS_MAX_POSITION // ratio, (tokens,)) * ratio - 1).tolist()
    other = d.randint(0, COMPRESS_MAX_POSITION, (tokens,)).tolist()
    mixed = [c if d.chance(0.7) else o for c, o in zip(closing, other, strict=True)]
    start = d.int(0, len(first))
    return torch.tensor((first[start:] + mixed)[:tokens], dtype=torch.int64)


def make_compress(d: Draw, head_dim: int) -> dict:
    ratio, coff = d.pick(COMPRESS_GEOMETRIES)
    state_block, state_blocks = d.pick((1, 2, 4, 8, 16, 64)), d.int(2, 40)
    state = state_cache(d, coff * head_dim, state_block, state_blocks)
    state_rows = state_blocks * state_block
    tokens, block_size = d.pick((0, 1, d.int(1, 16))), d.pick(PAGE_SIZES)
    positions = closing_and_other_positions(d, tokens, ratio)
    # window slots of positions p - coff*R + 1 .. p: -1 before position 0, some -1, a few past the state cache
    window_pos = positions[:, None] - coff * ratio + 1 + torch.arange(coff * ratio)
    gather = d.randint(0, state_rows, window_pos.shape)
    gather[d.rand(*gather.shape) < 0.03] += state_rows
    gather[(window_pos < 0) | (d.rand(*gather.shape) < 0.1)] = -1
    if tokens > 1 and d.chance(0.5):  # a closing token whose window addresses no state row writes nothing
        t = d.int(0, tokens - 1)
        gather[t] = torch.where(torch.arange(coff * ratio) % 2 == 0, -1, state_rows)
        positions[t] = 2 * ratio - 1
    referenced = torch.isin(torch.arange(state_rows), gather[(gather >= 0) & (gather < state_rows)])
    rows = torch.full((state_rows, 2 * coff * head_dim), math.nan)  # rows no window pools stay NaN
    rows[referenced, : coff * head_dim] = d.randn(int(referenced.sum()), coff * head_dim)
    rows[referenced, coff * head_dim :] = d.randn(int(referenced.sum()), coff * head_dim) * 3  # a peaked softmax
    state.copy_(rows.view(state.shape))
    num_blocks = -(-2 * tokens // block_size) + 1
    layout, placement = (d.pick(RECORDS_512), d.pick(PLACEMENTS)) if head_dim == MODEL1_HEAD_DIM else ("", "")
    page_bytes = (kv_page_bytes(block_size, layout, placement) if head_dim == MODEL1_HEAD_DIM
                  else indexer_k_page_bytes(block_size))
    latent = (torch.full((tokens, head_dim), math.nan, dtype=torch.bfloat16)  # rows of no written entry stay NaN
              if head_dim == MODEL1_HEAD_DIM and d.chance(0.5) else None)
    index_dtype = d.index_dtype()
    return dict(state_cache=state, gather_slots=relayout(d, gather.to(index_dtype), False),
                positions=relayout(d, positions.to(index_dtype), False),
                kv_slot_mapping=relayout(d, distinct_slots(d, tokens, num_blocks * block_size, 0.1, index_dtype),
                                         False),
                rms_norm_weight=d.rand(head_dim) + 0.5, rms_norm_eps=1e-6,
                cos_sin_cache=rope_table(d, COMPRESS_MAX_POSITION), kv_cache=paged_cache(d, num_blocks, page_bytes),
                block_size=block_size, compress_ratio=ratio, layout=layout, placement=placement, latent_out=latent)


def expect_latent(got: torch.Tensor, want: torch.Tensor) -> None:
    """The normed entries before their RoPE: the same rows written (the others NaN), within one bf16 step or, where
    a pooled channel cancels to near zero, within ROPE_CANCEL_NOISE of the row's largest value."""
    rows = ~want[:, 0].isnan() if want.numel() else torch.zeros(0, dtype=torch.bool)
    if not torch.equal(got[:, 0].isnan(), ~rows):
        fail("latent_out: the written rows differ from the reference's")
    g, w = got[rows], want[rows]
    noise = ROPE_CANCEL_NOISE * w.float().abs().amax(dim=-1, keepdim=True)
    bad = (ulp_steps(g, w) > 1) & ((g.float() - w.float()).abs() > noise)
    if bad.any():
        fail(f"latent_out: {int(bad.sum())} values differ by more than 1 bf16 step", *_where(g, w, bad))


def written_slots(a: dict) -> torch.Tensor:
    """kv slots the compressor writes: closing tokens with a valid slot and at least one valid window row."""
    state_rows = a["state_cache"].shape[0] * a["state_cache"].shape[1]
    gather = a["gather_slots"].long()
    has_row = ((gather >= 0) & (gather < state_rows)).any(dim=1)
    closes = (a["positions"].long() + 1) % a["compress_ratio"] == 0
    slots = a["kv_slot_mapping"].long()
    return slots[closes & has_row & (slots >= 0)]


def check_compress(a: dict, head_dim: int) -> None:
    names = ("state_cache", "gather_slots", "positions", "kv_slot_mapping", "rms_norm_weight", "rms_norm_eps",
             "cos_sin_cache", "kv_cache", "block_size", "compress_ratio")
    args = [a[n] for n in names]
    cache = a["kv_cache"]
    expected = clone_storage(cache)
    latent = a["latent_out"]
    want_latent = None if latent is None else latent.clone()
    if head_dim == MODEL1_HEAD_DIM:
        KERNELS.compress_norm_rope_store.layout(*args, a["layout"], a["placement"], latent)
        compressor.compress_norm_rope_store(*args[:7], expected, *args[8:], a["layout"], a["placement"], want_latent)
        index = record_index(cache, written_slots(a), a["block_size"], a["layout"], a["placement"])
        if latent is not None:
            expect_latent(latent, want_latent)
    else:
        KERNELS.compress_norm_rope_store_indexer(*args)
        compressor.compress_norm_rope_store_indexer(*args[:7], expected, *args[8:])
        index = indexer_record_index(cache, written_slots(a), a["block_size"])
    if index.numel():
        got, want = storage_bytes(cache)[index], storage_bytes(expected)[index]
        if head_dim != MODEL1_HEAD_DIM:
            expect_indexer_entries(got, want)
        elif a["layout"] == "model1":
            expect_model1_entries(got, want, 0.995)
        else:
            expect_v41_entries(cache, expected, written_slots(a), a["block_size"], a["layout"], a["placement"], 0.98)
    expect_same_bytes("kv_cache (outside the written records)", cache, expected, [index])


# ---------------------------------------------------------------------------------------------
# Registry and case runner
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpFuzzer:
    make: Callable[[Draw], dict]  # the op's arguments (and what the check needs) for one case
    check: Callable[[dict], None]  # runs the op and its reference; raises Mismatch


FUZZERS = {
    "topk_transform": OpFuzzer(make_topk_transform, check_topk_transform),
    "map_local_to_global_slots": OpFuzzer(make_map_local_to_global_slots, check_map_local_to_global_slots),
    "inverse_rope": OpFuzzer(make_inverse_rope, check_inverse_rope),
    "fp8_paged_mqa_logits": OpFuzzer(make_fp8_paged_mqa_logits, check_fp8_paged_mqa_logits),
    "fp8_mqa_logits": OpFuzzer(make_fp8_mqa_logits, check_fp8_mqa_logits),
    "fp8_paged_mqa_topk": OpFuzzer(make_fp8_paged_mqa_topk, check_fp8_paged_mqa_topk),
    "quantize_kv_insert": OpFuzzer(make_quantize_kv_insert, check_quantize_kv_insert),
    "dequantize_kv_gather": OpFuzzer(make_dequantize_kv_gather, check_dequantize_kv_gather),
    "indexer_k_quant_insert": OpFuzzer(make_indexer_k_quant_insert, check_indexer_k_quant_insert),
    "qnorm_rope_kv_insert": OpFuzzer(make_qnorm_rope_kv_insert, check_qnorm_rope_kv_insert),
    "indexer_q_rope_quant": OpFuzzer(make_indexer_q_rope_quant, check_indexer_q_rope_quant),
    "sparse_mla_decode": OpFuzzer(make_sparse_mla_decode, check_sparse_mla_decode),
    "sparse_mla_prefill": OpFuzzer(make_sparse_mla_prefill, check_sparse_mla_prefill),
    "save_partial_states": OpFuzzer(make_save_partial_states, check_save_partial_states),
    "compress_norm_rope_store": OpFuzzer(lambda d: make_compress(d, MODEL1_HEAD_DIM),
                                         lambda a: check_compress(a, MODEL1_HEAD_DIM)),
    "compress_norm_rope_store_indexer": OpFuzzer(lambda d: make_compress(d, INDEXER_HEAD_DIM),
                                                 lambda a: check_compress(a, INDEXER_HEAD_DIM)),
    "indexer_k_norm_rope_store": OpFuzzer(make_indexer_k_norm_rope_store, check_indexer_k_norm_rope_store),
    "indexer_k_quant_insert.format": OpFuzzer(make_indexer_k_quant_insert_format,
                                              check_indexer_k_quant_insert_format),
    "indexer_q_rope_quant.format": OpFuzzer(make_indexer_q_rope_quant_format, check_indexer_q_rope_quant_format),
    "fp8_paged_mqa_logits.format": OpFuzzer(lambda d: make_fp8_paged_mqa_logits(d, *draw_formats(d)),
                                            check_fp8_paged_mqa_logits_format),
    "fp8_mqa_logits.format": OpFuzzer(lambda d: make_fp8_mqa_logits(d, *draw_formats(d)),
                                      check_fp8_mqa_logits_format),
    "fp8_paged_mqa_topk.format": OpFuzzer(lambda d: make_fp8_paged_mqa_topk(d, *draw_formats(d)),
                                          check_fp8_paged_mqa_topk_format),
}

# Overloads each fuzzer calls (its cases draw their records, placements and options).
FUZZED_OVERLOADS = {
    "quantize_kv_insert.layout": "quantize_kv_insert",
    "dequantize_kv_gather.layout": "dequantize_kv_gather",
    "qnorm_rope_kv_insert.layout": "qnorm_rope_kv_insert",
    "compress_norm_rope_store.layout": "compress_norm_rope_store",
    "sparse_mla_decode.layout": "sparse_mla_decode",
}

# dsv4 ops that are not fuzzed on their own, and why
NOT_FUZZED = {
    "cpu_isa": "tier query",
    "supported_cpu_isas": "tier query",
    "cpu_isa_order": "tier query",
    "_sparse_mla_decode_partitions": "planner constant (tests/ops/test_cuda.py checks plans against it)",
    "_sparse_mla_decode_plan_costs": "planner constant (tests/ops/test_cuda.py checks plans against it)",
    "_set_cpu_isa": "tier switch (the fuzzer's own)",
    "sparse_mla_decode_schedule": "no reference: its plans go into sparse_mla_decode cases, which must not change",
}


def dsv4_op_names() -> list[str]:
    return sorted(n.removeprefix("dsv4::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("dsv4::"))


def supported_tiers() -> list[str]:
    return torch.ops.dsv4.supported_cpu_isas().split(",")


def describe(name: str, value) -> str:
    if isinstance(value, torch.Tensor):
        text = (f"{name}: {str(value.dtype).removeprefix('torch.')} {list(value.shape)} strides {list(value.stride())}"
                f" offset {value.storage_offset()}")
        if 0 < value.numel() <= 12 and value.dtype != torch.float8_e4m3fn:
            text += f" = {value.tolist()}"
        return text
    return f"{name}: {value!r}"


def run_case(op: str, tier: str, seed: int, log: Callable[[str], None] | None = None) -> None:
    """Draws case ``seed`` of op, then checks it on CPU tier ``tier`` at the case's thread count."""
    d = Draw(seed)
    threads = d.int(1, MAX_THREADS)  # the first draw: case_threads(seed)
    args = FUZZERS[op].make(d)
    if log:
        log(f"threads: {threads}")
        for name, value in args.items():
            log(describe(name, value))
    torch.ops.dsv4._set_cpu_isa(tier)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        FUZZERS[op].check(args)
    finally:
        torch.set_num_threads(saved)
