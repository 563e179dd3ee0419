"""Reference sparse MLA attention: hand-checked decode and prefill cases, an independent float64 loop
implementation, and the op contract (opcheck, argument errors) of sparse_mla_decode and sparse_mla_prefill."""

import math

import pytest
import torch

from conftest import assert_rejects, random_pages, replaced
from dsv4.cache import kv_page_bytes
from dsv4.constants import MODEL1_BYTES_PER_TOKEN, MODEL1_HEAD_DIM, V32_HEAD_DIM
from dsv4.reference import quant, sparse_mla

D_V = sparse_mla.HEAD_DIM_V
LAYOUTS = {MODEL1_HEAD_DIM: "model1", V32_HEAD_DIM: "v32"}
WRITERS = {MODEL1_HEAD_DIM: quant.model1_write, V32_HEAD_DIM: quant.v32_write}
READERS = {MODEL1_HEAD_DIM: quant.model1_read, V32_HEAD_DIM: quant.v32_read}
NAN_BYTE = 0xFF  # e4m3 code and UE8M0 scale byte that both decode to NaN: an unwritten entry that is read shows
# bf16 output vs float64 loop: half a bf16 step plus fp32 noise; lse is fp32 vs float64.
OUT_RTOL = 2**-8
OUT_ATOL = 1e-5
LSE_RTOL = 1e-5
LSE_ATOL = 1e-5
OP_OUT_TOL, OP_LSE_TOL = 1e-2, 5e-3  # torch.ops.dsv4 (native kernels) vs the reference
KV_SPREAD = 0.3  # keeps scores O(1) so softmax weights are spread over several entries


def fp8_cache(d_qk: int, num_blocks: int, block_size: int, pad_bytes: int = 0, written=None, flashmla_view=False):
    """Cache pages with the listed slots (default all) written from random rows; other entries decode to NaN.

    Returns (cache, dequantized rows fp32 [num_blocks * block_size, d_qk]; NaN where not written).
    """
    cache = random_pages(num_blocks, kv_page_bytes(block_size, LAYOUTS[d_qk]), pad_bytes)
    slots = torch.arange(num_blocks * block_size) if written is None else torch.as_tensor(written)
    if written is not None:
        cache.fill_(NAN_BYTE)
    WRITERS[d_qk](cache, slots, block_size, torch.randn(len(slots), d_qk) * KV_SPREAD)
    rows = READERS[d_qk](cache, torch.arange(num_blocks * block_size), block_size)
    if flashmla_view:  # FlashMLA's [num_blocks, block_size, 1, 584] view of the same padded pages
        cache = cache[:, : block_size * MODEL1_BYTES_PER_TOKEN].view(num_blocks, block_size, 1, -1)
    return cache, rows


def random_q(*shape: int) -> torch.Tensor:
    return torch.randn(shape).bfloat16()


def score(q_row: torch.Tensor, k_row: torch.Tensor, d_qk: int) -> float:
    return d_qk**-0.5 * float(q_row.double() @ k_row.double())


def loop_attention(q_row, keys, sm_scale, sink):
    """Independent float64 attention of one query row [d] over a list of key rows: (out [d_v], max, lse)."""
    if not keys:
        return torch.zeros(D_V, dtype=torch.float64), -math.inf, math.inf
    k = torch.stack(keys).double()
    scores = sm_scale * (k @ q_row.double())
    top = float(scores.max())
    weights = torch.exp(scores - top)
    lse = top + math.log(float(weights.sum()))
    out = (weights[:, None] * k[:, :D_V]).sum(0) / weights.sum()
    if sink is not None:
        out = out / (1 + math.exp(sink - lse))
    return out, top, lse


def loop_decode(q, sets, sm_scale, attn_sink=None):
    """sets: list of (cache, indices, topk_length, block_size); every valid entry is read on its own."""
    batch, s_q, heads, d_qk = q.shape
    out = torch.zeros(batch, s_q, heads, D_V, dtype=torch.float64)
    lse = torch.zeros(batch, heads, s_q, dtype=torch.float64)
    for b in range(batch):
        for s in range(s_q):
            keys = []
            for cache, indices, lengths, block_size in sets:
                limit = indices.shape[-1] if lengths is None else int(lengths[b])
                for col in range(min(limit, indices.shape[-1])):
                    slot = int(indices[b, s, col])
                    if 0 <= slot < cache.shape[0] * block_size:
                        keys.append(READERS[d_qk](cache, torch.tensor([slot]), block_size)[0])
            for h in range(heads):
                sink = None if attn_sink is None else float(attn_sink[h])
                out[b, s, h], _, lse[b, h, s] = loop_attention(q[b, s, h], keys, sm_scale, sink)
    return out, lse


def loop_prefill(q, kv, indices, sm_scale, attn_sink=None, topk_length=None):
    s_q, heads, _ = q.shape
    out = torch.zeros(s_q, heads, D_V, dtype=torch.float64)
    max_logits = torch.zeros(s_q, heads, dtype=torch.float64)
    lse = torch.zeros(s_q, heads, dtype=torch.float64)
    for s in range(s_q):
        limit = indices.shape[-1] if topk_length is None else int(topk_length[s])
        cols = range(min(limit, indices.shape[-1]))
        keys = [kv[int(indices[s, 0, c]), 0].float() for c in cols if 0 <= int(indices[s, 0, c]) < kv.shape[0]]
        for h in range(heads):
            sink = None if attn_sink is None else float(attn_sink[h])
            out[s, h], max_logits[s, h], lse[s, h] = loop_attention(q[s, h], keys, sm_scale, sink)
    return out, max_logits, lse


def assert_out_close(got: torch.Tensor, expected: torch.Tensor):
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), expected.double(), rtol=OUT_RTOL, atol=OUT_ATOL)


def assert_lse_close(got: torch.Tensor, expected: torch.Tensor):
    assert got.dtype == torch.float32 and got.is_contiguous()
    torch.testing.assert_close(got.double(), expected.double(), rtol=LSE_RTOL, atol=LSE_ATOL)


def decode(q, cache, indices, block_size, **kwargs):
    return sparse_mla.sparse_mla_decode(q, cache, indices, block_size, **kwargs)


# ---------------------------------------------------------------------------------------------
# sparse_mla_decode: hand-checked cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_decode_single_entry_is_its_row(d_qk):
    block_size = 3
    cache, rows = fp8_cache(d_qk, 2, block_size)
    q = random_q(1, 1, 2, d_qk)
    out, lse = decode(q, cache, torch.tensor([[[-1, 4, -1]]]), block_size)
    assert out.shape == (1, 1, 2, D_V) and lse.shape == (1, 2, 1)
    assert torch.equal(out[0, 0], rows[4, :D_V].bfloat16().expand(2, D_V))
    for h in range(2):
        assert lse[0, h, 0].item() == pytest.approx(score(q[0, 0, h], rows[4], d_qk), rel=LSE_RTOL, abs=LSE_ATOL)


def explicit_softmax(q_row, weighted_rows, d_qk):
    """(out, lse) of q over [(multiplicity, row)] by hand: out = sum m_j e^{s_j} v_j / sum m_j e^{s_j}."""
    terms = [(m, math.exp(score(q_row, row, d_qk)), row[:D_V].double()) for m, row in weighted_rows]
    total = sum(m * e for m, e, _ in terms)
    return sum(m * e * v for m, e, v in terms) / total, math.log(total)


def test_decode_two_entries_explicit_softmax():
    block_size = 4
    cache, rows = fp8_cache(MODEL1_HEAD_DIM, 2, block_size)
    q = random_q(1, 1, 1, MODEL1_HEAD_DIM)
    out, lse = decode(q, cache, torch.tensor([[[6, 1]]], dtype=torch.int32), block_size)
    expected_out, expected_lse = explicit_softmax(q[0, 0, 0], [(1, rows[6]), (1, rows[1])], MODEL1_HEAD_DIM)
    assert_out_close(out[0, 0, 0], expected_out)
    assert lse.item() == pytest.approx(expected_lse, rel=LSE_RTOL)


def test_decode_duplicate_is_attended_twice():
    block_size = 4
    cache, rows = fp8_cache(MODEL1_HEAD_DIM, 2, block_size)
    q = random_q(1, 1, 1, MODEL1_HEAD_DIM)
    out, lse = decode(q, cache, torch.tensor([[[5, 2, 5]]]), block_size)
    expected_out, expected_lse = explicit_softmax(q[0, 0, 0], [(2, rows[5]), (1, rows[2])], MODEL1_HEAD_DIM)
    assert_out_close(out[0, 0, 0], expected_out)
    assert lse.item() == pytest.approx(expected_lse, rel=LSE_RTOL)


def test_decode_extra_set_joins_the_softmax():
    cache, rows = fp8_cache(MODEL1_HEAD_DIM, 2, 4)
    extra_cache, extra_rows = fp8_cache(MODEL1_HEAD_DIM, 3, 2, pad_bytes=64)
    q = random_q(1, 1, 1, MODEL1_HEAD_DIM)
    out, lse = decode(q, cache, torch.tensor([[[3, -1]]]), 4, extra_kv_cache=extra_cache,
                      extra_indices=torch.tensor([[[-1, 5]]]), extra_block_size=2)
    expected_out, expected_lse = explicit_softmax(q[0, 0, 0], [(1, rows[3]), (1, extra_rows[5])], MODEL1_HEAD_DIM)
    assert_out_close(out[0, 0, 0], expected_out)
    assert lse.item() == pytest.approx(expected_lse, rel=LSE_RTOL)


def test_decode_sink():
    block_size = 4
    cache, _ = fp8_cache(MODEL1_HEAD_DIM, 3, block_size)
    q = random_q(2, 1, 3, MODEL1_HEAD_DIM)
    indices = torch.tensor([[[0, 9, 3]], [[11, 2, -1]]])
    plain_out, plain_lse = decode(q, cache, indices, block_size)
    sink = torch.tensor([-math.inf, math.inf, 0.3])
    out, lse = decode(q, cache, indices, block_size, attn_sink=sink)
    assert torch.equal(lse, plain_lse)  # the returned lse never includes the sink
    assert torch.equal(out[:, :, 0], plain_out[:, :, 0])  # -inf: no effect
    assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1]))  # +inf: zero output
    expected_out, _ = loop_decode(q, [(cache, indices, None, block_size)], MODEL1_HEAD_DIM**-0.5, sink)
    assert_out_close(out[:, :, 2], expected_out[:, :, 2])
    assert not torch.equal(out[:, :, 2], plain_out[:, :, 2])


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_decode_no_valid_entry_gives_zero_and_inf(d_qk):
    block_size = 4
    cache, _ = fp8_cache(d_qk, 2, block_size)
    capacity = 2 * block_size
    q = random_q(3, 1, 2, d_qk)
    # all -1; outside the cache (negative or >= capacity); valid slots cut by topk_length 0
    indices = torch.tensor([[[-1, -1, -1]], [[-7, capacity, 2**31 - 1]], [[0, 1, 2]]])
    for sink in (None, torch.tensor([math.inf, -math.inf]), torch.tensor([0.5, -2.0])):
        out, lse = decode(q, cache, indices, block_size, topk_length=torch.tensor([3, 3, 0]), attn_sink=sink)
        assert torch.equal(out, torch.zeros_like(out))
        assert (lse == math.inf).all()


def test_decode_lengths_cut_and_past_cache_entries_are_never_read():
    block_size = 4
    written = [1, 2, 6]
    cache, rows = fp8_cache(MODEL1_HEAD_DIM, 2, block_size, written=written)
    extra_cache, extra_rows = fp8_cache(MODEL1_HEAD_DIM, 2, block_size, written=[5])
    q = random_q(2, 2, 2, MODEL1_HEAD_DIM)
    # unwritten (NaN) slots 0, 3, 7 sit past topk_length; slots 8 and 9 are past the cache
    indices = torch.tensor([[[1, 6, 0, 3], [2, 8, 7, 0]], [[6, 2, 1, 3], [1, -1, 9, 7]]])
    extra_indices = torch.tensor([[[5, 0]], [[5, 4]]]).expand(2, 2, 2)
    out, lse = decode(q, cache, indices, block_size, topk_length=torch.tensor([2, 3]), extra_kv_cache=extra_cache,
                      extra_indices=extra_indices, extra_topk_length=torch.tensor([1, 1]), extra_block_size=block_size)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    kept = [[[1, 6], [2]], [[6, 2, 1], [1]]]
    for b in range(2):
        for s in range(2):
            keys = [(1, rows[i]) for i in kept[b][s]] + [(1, extra_rows[5])]
            for h in range(2):
                expected_out, expected_lse = explicit_softmax(q[b, s, h], keys, MODEL1_HEAD_DIM)
                assert_out_close(out[b, s, h], expected_out)
                assert lse[b, h, s].item() == pytest.approx(expected_lse, rel=LSE_RTOL)


# ---------------------------------------------------------------------------------------------
# sparse_mla_decode: random cases against the loop implementation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_extra", [False, True])
def test_decode_matches_loop(d_qk, index_dtype, with_extra):
    batch, s_q, heads, topk, extra_topk = 2, 2, 3, 6, 5
    block_size, extra_block_size = 3, 2
    cache, _ = fp8_cache(d_qk, 4, block_size, pad_bytes=40, flashmla_view=d_qk == MODEL1_HEAD_DIM)
    capacity = 4 * block_size
    indices = torch.randint(-2, capacity + 3, (batch, s_q, topk), dtype=index_dtype)
    topk_length = torch.tensor([topk, 4], dtype=index_dtype)
    sets = [(cache, indices, topk_length, block_size)]
    kwargs = dict(topk_length=topk_length, attn_sink=torch.tensor([0.2, -math.inf, -1.0]))
    if with_extra:
        extra_cache, _ = fp8_cache(d_qk, 5, extra_block_size)
        extra_indices = torch.randint(-1, 5 * extra_block_size + 2, (batch, s_q, extra_topk), dtype=index_dtype)
        extra_topk_length = torch.tensor([2, extra_topk + 3], dtype=index_dtype)
        sets.append((extra_cache, extra_indices, extra_topk_length, extra_block_size))
        kwargs.update(extra_kv_cache=extra_cache, extra_indices=extra_indices, extra_topk_length=extra_topk_length,
                      extra_block_size=extra_block_size)
    q = random_q(batch, s_q, heads, d_qk)
    out, lse = decode(q, cache, indices, block_size, **kwargs)
    expected_out, expected_lse = loop_decode(q, sets, d_qk**-0.5, kwargs["attn_sink"])
    assert_out_close(out, expected_out)
    assert_lse_close(lse, expected_lse)


def test_decode_sm_scale():
    cache, _ = fp8_cache(MODEL1_HEAD_DIM, 2, 4)
    q = random_q(1, 1, 2, MODEL1_HEAD_DIM)
    indices = torch.tensor([[[0, 5, 7]]])
    out, lse = decode(q, cache, indices, 4, sm_scale=0.01)
    expected_out, expected_lse = loop_decode(q, [(cache, indices, None, 4)], 0.01)
    assert_out_close(out, expected_out)
    assert_lse_close(lse, expected_lse)


# ---------------------------------------------------------------------------------------------
# sparse_mla_prefill
# ---------------------------------------------------------------------------------------------


def random_kv(s_kv: int, d_qk: int) -> torch.Tensor:
    return (torch.randn(s_kv, 1, d_qk) * KV_SPREAD).bfloat16()


def test_prefill_single_entry_and_empty_rows():
    d_qk = V32_HEAD_DIM
    kv = random_kv(5, d_qk)
    q = random_q(3, 2, d_qk)
    indices = torch.tensor([[[-1, 3, 5]], [[-4, 5, 9]], [[2, 0, 1]]], dtype=torch.int32)
    out, max_logits, lse = sparse_mla.sparse_mla_prefill(q, kv, indices, d_qk**-0.5,
                                                        topk_length=torch.tensor([3, 3, 0]))
    assert torch.equal(out[0], kv[3, 0, :D_V].expand(2, D_V))
    for h in range(2):
        expected = score(q[0, h], kv[3, 0].float(), d_qk)
        assert max_logits[0, h].item() == pytest.approx(expected, rel=LSE_RTOL, abs=LSE_ATOL)
        assert lse[0, h].item() == pytest.approx(expected, rel=LSE_RTOL, abs=LSE_ATOL)
    assert torch.equal(out[1:], torch.zeros_like(out[1:]))
    assert (max_logits[1:] == -math.inf).all() and (lse[1:] == math.inf).all()


def test_prefill_two_entries_and_sink():
    d_qk = MODEL1_HEAD_DIM
    kv = random_kv(4, d_qk)
    q = random_q(1, 3, d_qk)
    indices = torch.tensor([[[2, 0]]])
    sink = torch.tensor([-math.inf, math.inf, 0.7])
    out, max_logits, lse = sparse_mla.sparse_mla_prefill(q, kv, indices, d_qk**-0.5, attn_sink=sink)
    for h in range(3):
        keys = [(1, kv[2, 0].float()), (1, kv[0, 0].float())]
        expected_out, expected_lse = explicit_softmax(q[0, h], keys, d_qk)
        expected_out = expected_out / (1 + math.exp(sink[h] - expected_lse))
        assert_out_close(out[0, h], expected_out)
        assert lse[0, h].item() == pytest.approx(expected_lse, rel=LSE_RTOL)
        expected_max = max(score(q[0, h], kv[i, 0].float(), d_qk) for i in (2, 0))
        assert max_logits[0, h].item() == pytest.approx(expected_max, rel=LSE_RTOL, abs=LSE_ATOL)
    assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))


@pytest.mark.parametrize("d_qk", [MODEL1_HEAD_DIM, V32_HEAD_DIM])
def test_prefill_matches_loop(d_qk):
    s_q, heads, s_kv, topk = 5, 4, 9, 7
    kv = random_kv(s_kv, d_qk)
    q = random_q(s_q, heads, d_qk)
    indices = torch.randint(-2, s_kv + 2, (s_q, 1, topk))
    indices[0, 0, :3] = 4  # duplicates count twice
    topk_length = torch.tensor([7, 3, 0, 9, 5])
    sink = torch.randn(heads)
    out, max_logits, lse = sparse_mla.sparse_mla_prefill(q, kv, indices, 0.05, attn_sink=sink, topk_length=topk_length)
    expected_out, expected_max, expected_lse = loop_prefill(q, kv, indices, 0.05, sink, topk_length)
    assert_out_close(out, expected_out)
    assert_lse_close(max_logits, expected_max)
    assert_lse_close(lse, expected_lse)


# ---------------------------------------------------------------------------------------------
# Op contract: opcheck, fresh outputs, argument errors
# ---------------------------------------------------------------------------------------------


def decode_args(d_qk=MODEL1_HEAD_DIM, with_extra=True):
    batch, s_q, heads, block_size = 2, 2, 3, 4
    cache, _ = fp8_cache(d_qk, 3, block_size, pad_bytes=16)
    extra_cache, _ = fp8_cache(d_qk, 2, 2)
    return dict(
        q=random_q(batch, s_q, heads, d_qk),
        kv_cache=cache,
        indices=torch.randint(-1, 12, (batch, s_q, 5), dtype=torch.int32),
        topk_length=torch.tensor([5, 3], dtype=torch.int32),
        attn_sink=torch.randn(heads),
        extra_kv_cache=extra_cache if with_extra else None,
        extra_indices=torch.randint(-1, 4, (batch, s_q, 3)) if with_extra else None,
        extra_topk_length=torch.tensor([1, 3]) if with_extra else None,
        block_size=block_size,
        extra_block_size=2 if with_extra else 0,
        head_dim_v=D_V,
        sm_scale=d_qk**-0.5,
    )


def prefill_args(d_qk=MODEL1_HEAD_DIM):
    s_q, heads, s_kv = 3, 2, 6
    return dict(
        q=random_q(s_q, heads, d_qk),
        kv=random_kv(s_kv, d_qk),
        indices=torch.randint(-1, s_kv + 1, (s_q, 1, 4), dtype=torch.int32),
        sm_scale=d_qk**-0.5,
        head_dim_v=D_V,
        attn_sink=torch.randn(heads),
        topk_length=torch.tensor([4, 2, 3], dtype=torch.int32),
    )


OPS = {"sparse_mla_decode": decode_args, "sparse_mla_prefill": prefill_args}


@pytest.mark.parametrize(
    "name,args",
    [
        ("sparse_mla_decode", decode_args),
        ("sparse_mla_decode", lambda: decode_args(V32_HEAD_DIM, with_extra=False)),
        ("sparse_mla_prefill", prefill_args),
        ("sparse_mla_prefill", lambda: prefill_args(V32_HEAD_DIM)),
    ],
)
def test_opcheck(name, args, opcheck):
    opcheck(getattr(torch.ops.dsv4, name).default, tuple(args().values()))


def assert_op_close(got, expected):
    """The native CPU kernels round P to bf16 for P.V: FlashMLA's tolerances (out 1e-2, lse 5e-3)."""
    torch.testing.assert_close(got[0].float(), expected[0].float(), atol=OP_OUT_TOL, rtol=OP_OUT_TOL)
    for g, e in zip(got[1:], expected[1:], strict=True):
        torch.testing.assert_close(g, e, atol=OP_LSE_TOL, rtol=OP_LSE_TOL)


def test_ops_match_reference():
    args = decode_args()
    got = torch.ops.dsv4.sparse_mla_decode(*args.values())
    expected = sparse_mla.sparse_mla_decode(*[args[k] for k in ("q", "kv_cache", "indices", "block_size")],
                                           **{k: args[k] for k in ("topk_length", "attn_sink", "extra_kv_cache",
                                                                   "extra_indices", "extra_topk_length",
                                                                   "extra_block_size", "head_dim_v", "sm_scale")})
    assert_op_close(got, expected)
    args = prefill_args()
    assert_op_close(torch.ops.dsv4.sparse_mla_prefill(*args.values()), sparse_mla.sparse_mla_prefill(*args.values()))


BAD_INPUTS = [
    ("sparse_mla_decode", "q", lambda a: a.update(q=a["q"].float())),
    ("sparse_mla_decode", "q", lambda a: a.update(q=a["q"][0])),
    ("sparse_mla_decode", "q", lambda a: a.update(q=a["q"][..., :128])),
    ("sparse_mla_decode", "q", replaced(q=random_q(2, 2, 129, MODEL1_HEAD_DIM))),
    ("sparse_mla_decode", "head_dim_v", replaced(head_dim_v=256)),
    ("sparse_mla_decode", "kv_cache", lambda a: a.update(kv_cache=a["kv_cache"].bfloat16())),
    ("sparse_mla_decode", "kv_cache", replaced(block_size=8)),
    ("sparse_mla_decode", "block_size", replaced(block_size=0)),
    ("sparse_mla_decode", "indices", lambda a: a.update(indices=a["indices"][:1])),
    ("sparse_mla_decode", "indices", lambda a: a.update(indices=a["indices"].float())),
    ("sparse_mla_decode", "indices", lambda a: a.update(indices=a["indices"][..., :0])),
    ("sparse_mla_decode", "topk_length", lambda a: a.update(topk_length=a["topk_length"][None])),
    ("sparse_mla_decode", "attn_sink", lambda a: a.update(attn_sink=a["attn_sink"][1:])),
    ("sparse_mla_decode", "attn_sink", lambda a: a.update(attn_sink=a["attn_sink"].bfloat16())),
    ("sparse_mla_decode", "extra_indices", replaced(extra_indices=None, extra_topk_length=None)),
    ("sparse_mla_decode", "extra_indices", replaced(extra_kv_cache=None)),
    ("sparse_mla_decode", "extra_indices", lambda a: a.update(extra_indices=a["extra_indices"][:, :1])),
    ("sparse_mla_decode", "extra_block_size", replaced(extra_block_size=0)),
    ("sparse_mla_decode", "extra_kv_cache", replaced(extra_block_size=3)),
    ("sparse_mla_decode", "extra_topk_length", lambda a: a.update(extra_topk_length=a["extra_topk_length"][:1])),
    ("sparse_mla_prefill", "q", lambda a: a.update(q=a["q"].half())),
    ("sparse_mla_prefill", "q", lambda a: a.update(q=a["q"][None])),
    ("sparse_mla_prefill", "q", lambda a: a.update(q=a["q"][..., :500])),
    ("sparse_mla_prefill", "head_dim_v", replaced(head_dim_v=V32_HEAD_DIM)),
    ("sparse_mla_prefill", "kv", lambda a: a.update(kv=a["kv"].float())),
    ("sparse_mla_prefill", "kv", lambda a: a.update(kv=random_kv(6, V32_HEAD_DIM))),
    ("sparse_mla_prefill", "indices", lambda a: a.update(indices=a["indices"].expand(3, 2, 4))),
    ("sparse_mla_prefill", "indices", lambda a: a.update(indices=a["indices"][:2])),
    ("sparse_mla_prefill", "attn_sink", lambda a: a.update(attn_sink=a["attn_sink"].double())),
    ("sparse_mla_prefill", "topk_length", lambda a: a.update(topk_length=a["topk_length"][1:])),
]


@pytest.mark.parametrize("name,arg,corrupt", BAD_INPUTS)
def test_bad_inputs_raise_naming_op_and_argument(name, arg, corrupt):
    args = OPS[name]()
    corrupt(args)
    assert_rejects(getattr(torch.ops.dsv4, name), args, f"dsv4::{name}: argument '{arg}'")


def test_token_blocking_does_not_change_results(monkeypatch):
    args = prefill_args()
    whole = sparse_mla.sparse_mla_prefill(*args.values())
    monkeypatch.setattr(sparse_mla, "GATHER_BLOCK_ELEMENTS", 1)  # one token per block
    for got, expected in zip(sparse_mla.sparse_mla_prefill(*args.values()), whole, strict=True):
        torch.testing.assert_close(got, expected, rtol=LSE_RTOL, atol=LSE_ATOL)
