"""Byte parity with vLLM's DSv4 CPU kernels on identical random inputs.

The peer runs through ``torch.ops._C`` (see peer_vllm.py) and dsv4 through dsv4.compat.vllm_cpu, so
these tests also prove the compat argument orders. The native dsv4 writers run on every CPU tier.
Run with ``-s`` to print, per op, the fraction of output bytes that are exactly equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from conftest import (
    assert_equal_outside,
    clone_storage,
    distinct_slots,
    entry_byte_index,
    random_pages,
    rope_table,
    storage_bytes,
    ulp_distance,
)
from dsv4 import ops
from dsv4.cache import indexer_k_page_bytes, kv_page_bytes
from dsv4.compat import vllm_cpu as compat
from dsv4.constants import (
    INDEXER_HEAD_DIM,
    MODEL1_DATA_BYTES,
    MODEL1_HEAD_DIM,
    MODEL1_NOPE_DIM,
    MODEL1_SCALE_BYTES,
    MODEL1_TILE,
    ROPE_DIM,
)
from dsv4.reference.quant import decode_e4m3
from helpers.peer_vllm import load_peer_reason

PEER, PEER_UNAVAILABLE = load_peer_reason()
if PEER is None:
    pytest.skip(f"vLLM peer unavailable: {PEER_UNAVAILABLE}", allow_module_level=True)

pytestmark = pytest.mark.peer

FP8_CODE_TOL = 1  # e4m3 codes may differ by one step on the ordered code line
BF16_ULP_TOL = 1
SCALE_BYTE_TOL = 1  # UE8M0 exponent bytes
WEIGHTS_RTOL = 1e-5  # indexer weights_out (fp32 products of the same factors)
INVERSE_ROPE_RTOL, INVERSE_ROPE_ATOL = 1e-5, 1e-6  # fp32 output of one rotation
LOGITS_RTOL = LOGITS_ATOL = 1e-2  # vLLM's own test tolerance (fp32 sums in a different order)
ATTENTION_RTOL = ATTENTION_ATOL = 2e-2  # vLLM's own test tolerance (bf16 P, fast exp)
# vLLM's SWA insert flushes scaled |x| < 2^-6 to zero; exact rounding gives a subnormal code or, just
# below 2^-6, the smallest normal code 0x08 (= 2^-6).
FP8_SMALLEST_NORMAL_CODE = 0x08
FP8_RELATIVE_STEP = 2**-3  # e4m3 has 3 mantissa bits: neighbouring normal values differ by <= 1/8
FP8_SUBNORMAL_STEP = 2**-9  # spacing of e4m3 subnormals (times the tile scale)
FP8_SIGN = 0x80
TOPK = compat.VLLM_TOPK
EPS = 1e-6
ROPE_ROWS = 4096
INVALID_SLOT_FRACTION = 0.2  # slots set to -1


@dataclass
class Parity:
    """Byte counts over every compared output of one op (summed over parameter cases)."""

    exact: int = 0
    total: int = 0
    tolerated: int = 0  # elements that differ within the op's tolerance
    flushed: int = 0  # SWA fp8 values vLLM flushed to 0 where dsv4 kept the exact small value


PARITY: dict[str, Parity] = {}


def record(op: str, ours: torch.Tensor, theirs: torch.Tensor, *, tolerated: int = 0, flushed: int = 0) -> None:
    stats = PARITY.setdefault(op, Parity())
    a, b = as_bytes(ours), as_bytes(theirs)
    stats.exact += int((a == b).sum())
    stats.total += a.numel()
    stats.tolerated += tolerated
    stats.flushed += flushed


@pytest.fixture(scope="module", autouse=True)
def _print_parity_summary():
    yield
    print("\nvLLM peer parity (bytes exactly equal / compared; tolerated and flushed are element counts):")
    for op, s in PARITY.items():
        print(f"  {op:40s} {s.exact:>9d} / {s.total:<9d} = {s.exact / max(s.total, 1):.6f}"
              f"  tolerated {s.tolerated}  flushed {s.flushed}")


# ---- byte helpers ------------------------------------------------------------------------------


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)


def largest(t: torch.Tensor) -> int:
    return int(t.max()) if t.numel() else 0


def flushed_by_peer(ours: torch.Tensor, theirs: torch.Tensor) -> torch.Tensor:
    """vLLM wrote a zero of ours' sign where ours is a nonzero value no larger than 2^-6."""
    ours_i, theirs_i = ours.to(torch.int32), theirs.to(torch.int32)
    magnitude = ours_i & 0x7F
    return ((theirs_i & 0x7F) == 0) & ((theirs_i & FP8_SIGN) == (ours_i & FP8_SIGN)) & (magnitude > 0) & (
        magnitude <= FP8_SMALLEST_NORMAL_CODE)


def assert_fp8_close(what: str, ours: torch.Tensor, theirs: torch.Tensor, allow_flush: bool = False) -> tuple[int, int]:
    """Returns (tolerated, flushed) counts of differing codes; fails on any other difference."""
    differ = ours != theirs
    flushed = differ & flushed_by_peer(ours, theirs) if allow_flush else torch.zeros_like(differ)
    near = differ & ~flushed & (ulp_distance(ours, theirs) <= FP8_CODE_TOL)
    bad = differ & ~(near | flushed)
    assert not bad.any(), (f"{what}: {int(bad.sum())} fp8 codes differ by more than {FP8_CODE_TOL}, e.g. ours "
                           f"{ours[bad][:8].tolist()} vLLM {theirs[bad][:8].tolist()}")
    return int(near.sum()), int(flushed.sum())


def assert_requantized_close(what: str, ours: torch.Tensor, theirs: torch.Tensor) -> int:
    """Tiles whose scale bytes differ by one: (codes [N, 64], scale byte [N]) pairs must dequantize to
    values one e4m3 step apart at most, measured at the coarser scale. Returns the differing values."""
    (codes_o, scale_o), (codes_t, scale_t) = ours, theirs
    value_o, value_t = (decode_e4m3(c) * torch.ldexp(torch.ones(()), s.float()[:, None] - 127)
                        for c, s in ((codes_o, scale_o), (codes_t, scale_t)))
    coarse = torch.ldexp(torch.ones(()), torch.maximum(scale_o, scale_t).float()[:, None] - 127)
    step = FP8_RELATIVE_STEP * torch.maximum(value_o.abs(), value_t.abs()) + FP8_SUBNORMAL_STEP * coarse
    bad = (value_o - value_t).abs() > step
    assert not bad.any(), f"{what}: {int(bad.sum())} values of re-scaled tiles differ by more than one e4m3 step"
    return int((value_o != value_t).sum())


def assert_bf16_close(what: str, ours: torch.Tensor, theirs: torch.Tensor) -> int:
    dist = ulp_distance(ours, theirs)
    assert largest(dist) <= BF16_ULP_TOL, f"{what}: bf16 differs by {largest(dist)} ULP"
    return int((dist != 0).sum())


def entry_bytes_of(cache: torch.Tensor, slots: torch.Tensor, block_size: int, region_start: int, entry_bytes: int):
    return storage_bytes(cache)[entry_byte_index(cache, slots, block_size, region_start, entry_bytes)]


def assert_unwritten_equal(what: str, ours: torch.Tensor, theirs: torch.Tensor, written: list) -> None:
    """Bytes outside the written entries, page padding included, are untouched by both (they started equal)."""
    assert_equal_outside(ours, theirs, [entry_byte_index(ours, *region) for region in written],
                         f"{what}: bytes outside the written entries differ")


def model1_regions(slots: torch.Tensor, block_size: int) -> list:
    return [(slots, block_size, 0, MODEL1_DATA_BYTES),
            (slots, block_size, block_size * MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES)]


def compare_model1_entries(op: str, ours, theirs, slots, block_size, allow_flush: bool) -> None:
    """MODEL1 entries at valid slots: NoPE fp8, RoPE bf16, 7 scale bytes, zero pad byte."""
    slots = slots[slots >= 0]
    data_o, data_t = (entry_bytes_of(c, slots, block_size, 0, MODEL1_DATA_BYTES) for c in (ours, theirs))
    scale_start = block_size * MODEL1_DATA_BYTES
    scale_o, scale_t = (entry_bytes_of(c, slots, block_size, scale_start, MODEL1_SCALE_BYTES) for c in (ours, theirs))
    tiles = MODEL1_NOPE_DIM // MODEL1_TILE
    scale_diff = (scale_o[:, :tiles].int() - scale_t[:, :tiles].int()).abs()
    assert largest(scale_diff) <= SCALE_BYTE_TOL, f"{op}: scale bytes differ by {largest(scale_diff)}"
    assert (scale_o[:, tiles:] == 0).all() and (scale_t[:, tiles:] == 0).all(), f"{op}: pad byte not 0"
    rescaled = scale_diff != 0
    tiles_o, tiles_t = (d[:, :MODEL1_NOPE_DIM].reshape(-1, tiles, MODEL1_TILE) for d in (data_o, data_t))
    tolerated, flushed = assert_fp8_close(f"{op} NoPE", tiles_o[~rescaled], tiles_t[~rescaled], allow_flush)
    tolerated += assert_requantized_close(f"{op} NoPE", (tiles_o[rescaled], scale_o[:, :tiles][rescaled]),
                                          (tiles_t[rescaled], scale_t[:, :tiles][rescaled]))
    rope_o, rope_t = (d[:, MODEL1_NOPE_DIM:].contiguous().view(torch.bfloat16) for d in (data_o, data_t))
    tolerated += assert_bf16_close(f"{op} RoPE", rope_o, rope_t) + int(rescaled.sum())
    assert_unwritten_equal(op, ours, theirs, model1_regions(slots, block_size))
    record(op, torch.cat([data_o, scale_o], 1), torch.cat([data_t, scale_t], 1), tolerated=tolerated, flushed=flushed)


def test_parity_checks_reject_real_differences():
    """The tolerance checks above accept exactly what they document and nothing more."""
    codes = torch.tensor([0x38, 0x01, 0x81, 0x08, 0x40], dtype=torch.uint8)
    assert assert_fp8_close("equal", codes, codes) == (0, 0)
    assert assert_fp8_close("one step", codes + 1, codes) == (5, 0)
    with pytest.raises(AssertionError):
        assert_fp8_close("two steps", codes + 2, codes)
    small = torch.tensor([0x01, 0x87, 0x08], dtype=torch.uint8)
    signed_zeros = torch.tensor([0x00, 0x80, 0x00], dtype=torch.uint8)
    assert assert_fp8_close("flushed", small, signed_zeros, allow_flush=True) == (0, 3)
    with pytest.raises(AssertionError):  # outside the SWA insert a flush is a real difference
        assert_fp8_close("flush not allowed", small, signed_zeros)
    with pytest.raises(AssertionError):  # a flush keeps the sign
        assert_fp8_close("wrong sign", small, signed_zeros ^ FP8_SIGN, allow_flush=True)
    with pytest.raises(AssertionError):  # only magnitudes up to 2^-6 flush
        assert_fp8_close("too large", small + 1, signed_zeros, allow_flush=True)
    values = torch.tensor([[1.0, -0.375, 300.0, 0.0]])
    at_one = (values.to(torch.float8_e4m3fn).view(torch.uint8), torch.tensor([127], dtype=torch.uint8))
    at_two = ((values / 2).to(torch.float8_e4m3fn).view(torch.uint8), torch.tensor([128], dtype=torch.uint8))
    assert assert_requantized_close("same values, next scale", at_one, at_two) == 0
    moved = (at_two[0] + torch.tensor([[0, 0, 2, 0]], dtype=torch.uint8), at_two[1])
    with pytest.raises(AssertionError):
        assert_requantized_close("two steps at the coarser scale", at_one, moved)
    bf16 = torch.tensor([1.0, -2.5]).bfloat16()
    assert assert_bf16_close("one ULP", bf16, (bf16.view(torch.int16) + 1).view(torch.bfloat16)) == 2
    with pytest.raises(AssertionError):
        assert_bf16_close("two ULP", bf16, (bf16.view(torch.int16) + 2).view(torch.bfloat16))


# ---- KV-cache writers --------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [64, 256])
@pytest.mark.parametrize("heads,padded_heads", [(8, 16), (64, 64)])
def test_fused_qnorm_rope_kv_insert(isa, block_size, heads, padded_heads):
    tokens, inserted, num_blocks = 37, 33, 3
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    kv = torch.randn(tokens, MODEL1_HEAD_DIM) * torch.rand(tokens, 1) * 4
    kv[::3, :MODEL1_NOPE_DIM:5] *= 2**-16  # values vLLM's SWA encoder flushes to zero
    kv = kv.bfloat16()
    positions = torch.randint(0, ROPE_ROWS, (tokens,))
    slots = distinct_slots(inserted, num_blocks * block_size, INVALID_SLOT_FRACTION)
    cos_sin = rope_table(ROPE_ROWS)
    cache_theirs = random_pages(num_blocks, kv_page_bytes(block_size), pad_bytes=96)
    cache_ours = clone_storage(cache_theirs)

    q_theirs = PEER.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, cache_theirs, slots, cos_sin, padded_heads, EPS,
                                                   block_size)
    q_ours = compat.fused_qnorm_rope_kv_insert_cpu(q, kv, positions, cache_ours, slots, cos_sin, padded_heads, EPS,
                                                   block_size)

    assert q_ours.shape == q_theirs.shape == (tokens, padded_heads, MODEL1_HEAD_DIM)
    assert (q_ours[:, heads:] == 0).all() and (q_theirs[:, heads:] == 0).all()
    record("fused_qnorm_rope_kv_insert_cpu (q)", q_ours, q_theirs,
           tolerated=assert_bf16_close("q_out", q_ours, q_theirs))
    compare_model1_entries("fused_qnorm_rope_kv_insert_cpu (cache)", cache_ours, cache_theirs, slots, block_size,
                           allow_flush=True)


@pytest.mark.parametrize("tokens", [1, 57])
def test_fused_indexer_q_rope_quant(isa, tokens):
    heads = 64
    positions = torch.randint(0, ROPE_ROWS, (tokens,))
    index_q = torch.randn(tokens, heads, INDEXER_HEAD_DIM) * torch.rand(tokens, heads, 1) * 8
    weights = torch.randn(tokens, heads)
    cos_sin = rope_table(ROPE_ROWS)
    softmax_scale, head_scale = INDEXER_HEAD_DIM**-0.5, heads**-0.5
    outputs = {}
    implementations = {"theirs": PEER.fused_indexer_q_rope_quant_cpu, "ours": compat.fused_indexer_q_rope_quant_cpu}
    for name, impl in implementations.items():
        q_fp8 = torch.empty(tokens, heads, INDEXER_HEAD_DIM, dtype=torch.float8_e4m3fn)
        weights_out = torch.empty(tokens, heads)
        impl(positions, index_q, cos_sin, q_fp8, weights, softmax_scale, head_scale, weights_out)
        outputs[name] = (q_fp8.view(torch.uint8), weights_out)
    (q_ours, w_ours), (q_theirs, w_theirs) = outputs["ours"], outputs["theirs"]
    tolerated, _ = assert_fp8_close("indexer q", q_ours, q_theirs)
    record("fused_indexer_q_rope_quant_cpu (q fp8)", q_ours, q_theirs, tolerated=tolerated)
    torch.testing.assert_close(w_ours, w_theirs, rtol=WEIGHTS_RTOL, atol=0)
    record("fused_indexer_q_rope_quant_cpu (weights)", w_ours, w_theirs, tolerated=int((w_ours != w_theirs).sum()))


def padded_state_cache(num_blocks: int, block_size: int, row_width: int) -> torch.Tensor:
    """Random fp32 state rows with a block stride larger than the block (pooled allocation)."""
    return torch.randn(num_blocks, block_size + 3, row_width)[:, :block_size]


@pytest.mark.parametrize("ratio,width", [(4, 2 * 512), (128, 512), (4, 2 * 128)])
def test_save_partial_states(isa, ratio, width):
    tokens, num_blocks, block_size = 41, 4, 16
    kv = torch.randn(tokens, 2 * width)[:, :width]  # a column slice of a fused GEMM output
    score = torch.randn(tokens, 2 * width)[:, width:]
    ape = torch.randn(ratio, width)
    positions = torch.randint(0, 10_000, (tokens,))
    slots = distinct_slots(tokens, num_blocks * block_size, INVALID_SLOT_FRACTION)
    state_theirs = padded_state_cache(num_blocks, block_size, 2 * width)
    state_ours = clone_storage(state_theirs)
    PEER.save_partial_states_cpu(kv, score, ape, positions, state_theirs, slots)
    compat.save_partial_states_cpu(kv, score, ape, positions, state_ours, slots)
    assert torch.equal(storage_bytes(state_ours), storage_bytes(state_theirs))
    record("save_partial_states_cpu", state_ours, state_theirs)


def compressor_inputs(ratio: int, head_dim: int, block_size: int, tokens: int = 29):
    """State cache, gather windows (10% invalid rows) and positions where most tokens close a group."""
    coff = 2 if ratio == 4 else 1
    state_blocks, state_block_size = 6, 64
    state = padded_state_cache(state_blocks, state_block_size, 2 * coff * head_dim)
    window = coff * ratio
    gather = torch.randint(0, state_blocks * state_block_size, (tokens, window))
    gather = torch.where(torch.rand(tokens, window) < 0.1, -1, gather)
    gather[:, -1] = torch.randint(0, state_blocks * state_block_size, (tokens,))  # never an empty window
    groups = torch.randint(1, ROPE_ROWS // ratio, (tokens,))
    positions = groups * ratio - 1 - torch.where(torch.rand(tokens) < 0.25, 1, 0)  # a quarter close no group
    num_blocks = 3
    kv_slots = distinct_slots(tokens, num_blocks * block_size, INVALID_SLOT_FRACTION)
    norm_weight = 1 + 0.1 * torch.randn(head_dim)
    return state, gather, positions, kv_slots, norm_weight, rope_table(ROPE_ROWS, base=160000.0), num_blocks


@pytest.mark.parametrize("block_size", [64, 256])
@pytest.mark.parametrize("ratio", [4, 128])
def test_compress_norm_rope_store(isa, ratio, block_size):
    state, gather, positions, kv_slots, norm_weight, cos_sin, num_blocks = compressor_inputs(ratio, 512, block_size)
    cache_theirs = random_pages(num_blocks, kv_page_bytes(block_size), pad_bytes=64)
    cache_ours = clone_storage(cache_theirs)
    args = (state, gather, positions, kv_slots, norm_weight, EPS, cos_sin)
    PEER.compress_norm_rope_store_cpu(*args, cache_theirs, block_size, ratio)
    compat.compress_norm_rope_store_cpu(*args, cache_ours, block_size, ratio)
    written = torch.where((positions + 1) % ratio == 0, kv_slots, -1)
    assert (written >= 0).sum() > 0
    compare_model1_entries("compress_norm_rope_store_cpu", cache_ours, cache_theirs, written, block_size,
                           allow_flush=False)


@pytest.mark.parametrize("block_size", [64, 256])
def test_compress_norm_rope_store_indexer(isa, block_size):
    ratio = 4
    state, gather, positions, kv_slots, norm_weight, cos_sin, num_blocks = compressor_inputs(
        ratio, INDEXER_HEAD_DIM, block_size)
    cache_theirs = random_pages(num_blocks, indexer_k_page_bytes(block_size), pad_bytes=32)
    cache_ours = clone_storage(cache_theirs)
    args = (state, gather, positions, kv_slots, norm_weight, EPS, cos_sin)
    PEER.compress_norm_rope_store_indexer_cpu(*args, cache_theirs, block_size, ratio)
    compat.compress_norm_rope_store_indexer_cpu(*args, cache_ours, block_size, ratio)
    written = torch.where((positions + 1) % ratio == 0, kv_slots, -1)
    written = written[written >= 0]
    assert written.numel() > 0
    scale_start = block_size * INDEXER_HEAD_DIM
    codes_o, codes_t = (entry_bytes_of(c, written, block_size, 0, INDEXER_HEAD_DIM) for c in (cache_ours, cache_theirs))
    scale_o, scale_t = (entry_bytes_of(c, written, block_size, scale_start, 4) for c in (cache_ours, cache_theirs))
    assert torch.equal(scale_o, scale_t), "indexer K fp32 scales differ"
    tolerated, _ = assert_fp8_close("indexer K", codes_o, codes_t)
    assert_unwritten_equal("indexer K cache", cache_ours, cache_theirs,
                           [(written, block_size, 0, INDEXER_HEAD_DIM), (written, block_size, scale_start, 4)])
    record("compress_norm_rope_store_indexer_cpu", torch.cat([codes_o, scale_o], 1), torch.cat([codes_t, scale_t], 1),
           tolerated=tolerated)


@pytest.mark.parametrize("head_dim", [512, 64])
def test_inverse_gptj_rope_o_proj(isa, head_dim):
    tokens, heads = 23, 16
    o = torch.randn(tokens, heads, head_dim).bfloat16()
    positions = torch.randint(0, ROPE_ROWS, (tokens,))
    cos_sin = rope_table(ROPE_ROWS)
    theirs = PEER.inverse_gptj_rope_o_proj_cpu(o, positions, cos_sin, ROPE_DIM)
    ours = compat.inverse_gptj_rope_o_proj_cpu(o, positions, cos_sin, ROPE_DIM)
    assert ours.dtype == theirs.dtype == torch.float32 and ours.shape == theirs.shape == o.shape
    torch.testing.assert_close(ours, theirs, rtol=INVERSE_ROPE_RTOL, atol=INVERSE_ROPE_ATOL)
    record("inverse_gptj_rope_o_proj_cpu", ours, theirs, tolerated=int((ours != theirs).sum()))


# ---- indexer logits and top-k (dsv4 side currently the reference) -----------------------------


def shuffled_page_table(rows: int, pages_per_row: int, num_blocks: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([torch.randperm(num_blocks)[:pages_per_row] for _ in range(rows)]).to(dtype)


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("block_size", [64, 256])
def test_fp8_paged_mqa_logits(block_size, index_dtype):
    heads, num_blocks = 64, 8
    seq_lens = torch.tensor([1, block_size + 7, 3 * block_size], dtype=index_dtype)
    rows = seq_lens.numel()
    cache = random_pages(num_blocks, indexer_k_page_bytes(block_size), pad_bytes=128)
    ops.indexer_k_quant_insert(torch.randn(num_blocks * block_size, INDEXER_HEAD_DIM),
                               torch.arange(num_blocks * block_size), cache, block_size)
    q_fp8 = (torch.randn(rows, heads, INDEXER_HEAD_DIM) * 16).to(torch.float8_e4m3fn)
    weights = torch.randn(rows, heads) * 0.05
    page_table = shuffled_page_table(rows, 4, num_blocks, index_dtype)
    max_seq_len = 4 * block_size
    args = (q_fp8, cache, weights, seq_lens, page_table, block_size, max_seq_len)
    theirs, ours = PEER.fp8_paged_mqa_logits_cpu(*args), compat.fp8_paged_mqa_logits_cpu(*args)
    assert ours.shape == theirs.shape == (rows, max_seq_len)
    for row, length in enumerate(seq_lens.tolist()):
        torch.testing.assert_close(ours[row, :length], theirs[row, :length], rtol=LOGITS_RTOL, atol=LOGITS_ATOL)
        record("fp8_paged_mqa_logits_cpu", ours[row, :length], theirs[row, :length],
               tolerated=int((ours[row, :length] != theirs[row, :length]).sum()))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("page_size", [64, 256])
def test_topk_transform_512(page_size, index_dtype):
    width, out_width = 3000, TOPK + 8
    seq_lens = torch.tensor([0, 1, 300, TOPK, TOPK + 1, 2049, width, width + 50], dtype=index_dtype)
    rows = seq_lens.numel()
    scores = torch.randperm(rows * width).float().reshape(rows, width)  # distinct: no ties at the boundary
    pages = -(-width // page_size)
    page_tables = shuffled_page_table(rows, pages, 4 * pages, index_dtype)
    results = {}
    for name, impl in (("theirs", PEER.topk_transform_512_cpu), ("ours", compat.topk_transform_512_cpu)):
        out_page = torch.full((rows, out_width), -7, dtype=torch.int32)
        out_raw = torch.full((rows, out_width), -7, dtype=torch.int32)
        impl(scores, seq_lens, page_tables, out_page, page_size, out_raw)
        results[name] = (out_page, out_raw)
    (page_o, raw_o), (page_t, raw_t) = results["ours"], results["theirs"]
    for out in (page_o, raw_o, page_t, raw_t):
        assert (out[:, TOPK:] == -7).all(), "columns past 512 must be untouched"
    for row, length in enumerate(seq_lens.clamp(max=width).tolist()):
        if length <= TOPK:
            assert torch.equal(raw_o[row], raw_t[row]) and torch.equal(page_o[row], page_t[row])
        else:
            assert torch.equal(raw_o[row, :TOPK].sort().values, raw_t[row, :TOPK].sort().values)
            assert torch.equal(page_o[row, :TOPK].sort().values, page_t[row, :TOPK].sort().values)


# ---- sparse MLA attention (dsv4 side currently the reference) ---------------------------------


def filled_model1_cache(num_blocks: int, block_size: int) -> torch.Tensor:
    cache = random_pages(num_blocks, kv_page_bytes(block_size), pad_bytes=576)
    kv = torch.randn(num_blocks * block_size, MODEL1_HEAD_DIM)
    ops.quantize_kv_insert(kv, torch.arange(num_blocks * block_size), cache, block_size)
    return cache


@pytest.mark.parametrize("compressed_count", [0, 40])
def test_flash_mla_with_kvcache(compressed_count):
    tokens, heads, window = 5, 16, 128
    window_block_size, compressed_block_size = 64, 16
    window_cache = filled_model1_cache(4, window_block_size)
    compressed_cache = filled_model1_cache(4, compressed_block_size)
    q = torch.randn(tokens, heads, MODEL1_HEAD_DIM).bfloat16()
    window_slots = torch.randint(0, 4 * window_block_size, (tokens, window))
    window_slots[:, ::5] = -1
    window_slots[:, 1::7] = 4 * window_block_size  # past the cache: invalid too
    compressed_slots = torch.randint(0, 4 * compressed_block_size, (tokens, compressed_count))
    compressed_slots[:, ::3] = -1
    window_slots[-1] = -1  # a query with nothing to attend: exactly zero
    if compressed_count:
        compressed_slots[-1] = -1
    attn_sink = torch.randn(heads)
    scale = MODEL1_HEAD_DIM**-0.5
    args = (q, window_cache, window_slots, window_block_size, compressed_cache, compressed_slots,
            compressed_block_size, attn_sink, scale)
    theirs, ours = torch.full_like(q, 7.0), torch.full_like(q, 7.0)
    PEER.flash_mla_with_kvcache_cpu(theirs, *args)
    compat.flash_mla_with_kvcache_cpu(ours, *args)
    assert (ours[-1] == 0).all() and (theirs[-1] == 0).all()
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=ATTENTION_RTOL, atol=ATTENTION_ATOL)
    record("flash_mla_with_kvcache_cpu", ours, theirs, tolerated=int((ours != theirs).sum()))
