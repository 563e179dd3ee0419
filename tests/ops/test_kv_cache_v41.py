"""The DeepSeek-V4.1 records (528-byte fp8, 288-byte fp4) in both placements: the reference quantizer's rules, the
writers on every tier against it (byte-exact for the generic insert, within a quantization step for the fused
RoPE and compressor stores), the gather, placement and record conversions."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import (
    clone_storage,
    distinct_slots,
    random_pages,
    rope_table,
    storage_bytes,
)
from dsv4 import cache, ops
from dsv4.reference import compressor as ref_compressor
from dsv4.reference import kv_cache as ref_kv_cache
from dsv4.reference import quant

V41 = ("v41_fp8", "v41_fp4")
PLACEMENTS = ("page_split", "per_token")
PAGES = (1, 5, 61, 64)
PAD_BYTES = 48  # page stride beyond the page: the writers must honour stride(0)
MAX_POSITION = 1024
MIN_EXACT_BYTES = 0.98  # fused stores: fp32 sums in another order move a few codes by one step


def v41_pages(num_blocks: int, block_size: int, layout: str, placement: str) -> torch.Tensor:
    return random_pages(num_blocks, cache.kv_page_bytes(block_size, layout, placement), PAD_BYTES)


def mixed_rows(n: int, dim: int = 512) -> torch.Tensor:
    """Rows whose 16-dim tiles span tiny (floored scales, subnormal codes), ordinary and large magnitudes."""
    magnitudes = torch.tensor([1e-6, 3e-3, 0.05, 1.0, 40.0, 3000.0])
    tiles = magnitudes[torch.randint(0, len(magnitudes), (n, dim // 16, 1))]
    return (torch.randn(n, dim // 16, 16) * tiles).reshape(n, dim)


# ---- the reference quantizer ------------------------------------------------------------------------------------


def test_fp8_scale_is_the_rounded_up_power_of_two():
    x = torch.zeros(3, 512)
    x[0, :32] = 448.0  # amax / 448 = 1: scale 1, byte 127
    x[1, :32] = 450.0  # just past (a bf16): scale 2
    x[2, :32] = 1e-9  # floored at 1e-4: 2^ceil(log2(1e-4)) = 2^-13
    codes, scales = quant.v41_fp8_pack(x)
    assert scales[:, 0].tolist() == [127, 128, 127 - 13]
    assert scales.shape == (3, 16) and codes.shape == (3, 512)
    values = quant.v41_fp8_unpack(codes, scales)
    assert values[0, 0] == 448.0 and values[1, 0] == 448.0  # 450 -> 225 at scale 2 -> e4m3 224 -> 448


def test_fp4_rules():
    tile = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, -0.1, 0.3, -6.0, 1.0, 2.0, 3.0, 4.0])
    x = torch.zeros(4, 512)
    x[0, :16] = tile  # amax 6: scale exactly 1, ties go to the even code
    x[1, :16] = tile * 100  # amax / 6 = 100 is an e4m3 tie: the even 96; 600 / 96 = 6.25 saturates at 6
    x[2, :16] = tile
    x[2, 3] = math.nan  # a NaN poisons its tile: NaN scale, all codes 0
    x[3, :16] = 1e-9  # amax / 6 floored at 2^-9
    data, scales = quant.v41_fp4_pack(x)
    codes = torch.stack([data & 0xF, data >> 4], -1).reshape(4, 512)
    assert scales[0, 0] == 0x38  # e4m3 1.0
    assert codes[0, :16].tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 8, 8, 1, 15, 2, 4, 5, 6]
    assert quant.decode_e4m3(scales[1, :1]).item() == 96.0 and codes[1, 7] == 7
    assert scales[2, 0] == 0x7F and (codes[2, :16] == 0).all()
    assert quant.v41_fp4_unpack(data, scales)[2, :16].isnan().all()
    assert quant.decode_e4m3(scales[3, :1]).item() == 2.0**-9
    assert scales[0, 1] == quant.encode_e4m3(torch.tensor([2.0**-9])).item(), "an all-zero tile takes the floor"
    assert (codes[0, 16:] == 0).all()


def test_fp4_saturates_and_keeps_signs():
    x = torch.zeros(1, 512)
    x[0, :16] = torch.tensor([7e3] + [-7e3] + [1.0] * 14)  # the scale saturates at 448: 7000/448 = 15.6 -> +-6
    data, scales = quant.v41_fp4_pack(x)
    codes = torch.stack([data & 0xF, data >> 4], -1).reshape(512)
    assert quant.decode_e4m3(scales[0, :1]).item() == 448.0
    assert codes[:2].tolist() == [7, 15]


def test_vllm_scale_rule_decodes_to_the_same_values():
    """vLLM floors amax (not amax / 448) at 1e-4: small tiles get smaller scales, hence other bytes; values whose
    codes stay normal in both decode identically, and the big tiles are byte-identical."""
    x = mixed_rows(64)
    exact, vllm = quant.v41_fp8_pack(x, "flashmla"), quant.v41_fp8_pack(x, "vllm")
    big = x.reshape(64, 16, 32).abs().amax(-1) >= 0.0448
    assert torch.equal(exact[1][big], vllm[1][big]) and not torch.equal(exact[1], vllm[1])
    a, b = quant.v41_fp8_unpack(*exact), quant.v41_fp8_unpack(*vllm)
    normal = quant.round_bf16(x).abs() >= 2.0**-6 * 2.0 ** (exact[1].float() - 127).repeat_interleave(32, 1)
    assert torch.equal(a[normal], b[normal])
    assert ((a - b).abs() <= 2.0**-9 * 2.0 ** (exact[1].float() - 127).repeat_interleave(32, 1)).all()


def test_placements_hold_the_same_bytes():
    x, slots = mixed_rows(10), torch.tensor([0, 3, 4, 9, -1, 11, 2, 7, 8, 1])
    for layout in V41:
        split = cache.allocate_kv_cache(3, 4, layout)
        per_token = cache.allocate_kv_cache(3, 4, layout, placement="per_token")
        quant.write_records(split, slots, 4, x, layout, "page_split")
        quant.write_records(per_token, slots, 4, x, layout, "per_token")
        assert torch.equal(quant.read_records(split, slots, 4, layout), quant.read_records(per_token, slots, 4, layout,
                                                                                           "per_token"))
        data_bytes = quant.RECORDS[layout][1]
        assert torch.equal(per_token[0, :data_bytes], split[0, :data_bytes])  # entry 0's data leads both pages
        assert torch.equal(cache.convert_placement(split, 4, layout, "page_split", "per_token"), per_token)
        assert torch.equal(cache.convert_placement(per_token, 4, layout, "per_token", "page_split"), split)


def test_page_geometry():
    assert cache.kv_page_bytes(64, "v41_fp8") == 64 * 528  # already a multiple of 512
    assert cache.kv_page_bytes(5, "v41_fp8") == 3072 and cache.kv_page_bytes(5, "v41_fp8", "per_token") == 2640
    assert cache.kv_page_bytes(64, "v41_fp4") == 64 * 288
    assert cache.kv_page_bytes(1, "v41_fp4") == 512 and cache.kv_page_bytes(1, "v41_fp4", "per_token") == 288
    with pytest.raises(ValueError, match="placement"):
        cache.kv_page_bytes(64, "v41_fp8", "interleaved")


# ---- the writers and the gather on every tier ---------------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("layout", V41)
@pytest.mark.parametrize("block_size", PAGES)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32))
def test_quantize_insert_is_byte_exact(isa, layout, placement, block_size, dtype):
    num_blocks = 3
    pages = v41_pages(num_blocks, block_size, layout, placement)
    expected = clone_storage(pages)
    tokens = min(num_blocks * block_size, 40)
    slots = distinct_slots(tokens, num_blocks * block_size, 0.2)
    kv = mixed_rows(tokens).to(dtype)
    ops.quantize_kv_insert(kv, slots, pages, block_size, layout=layout, placement=placement)
    quant.write_records(expected, slots, block_size, kv.float(), layout, placement)
    assert torch.equal(storage_bytes(pages), storage_bytes(expected)), "written bytes or padding differ"


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("layout", V41)
def test_gather_decodes_exactly(isa, layout, placement):
    block_size, num_blocks = 5, 4
    pages = v41_pages(num_blocks, block_size, layout, placement)  # random bytes: every code, NaN scales included
    slots = torch.tensor([[0, 19, -1, 7], [20, 3, 3, -7]], dtype=torch.int32)
    got = ops.dequantize_kv_gather(pages, slots, block_size, layout=layout, placement=placement)
    want = quant.read_records(pages, slots, block_size, layout, placement).bfloat16()
    assert got.shape == (2, 4, 512)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def assert_stored_close(got: torch.Tensor, want: torch.Tensor, slots, block_size, layout, placement):
    """Entries decode within one code step of the reference's; most bytes identical; nothing else written."""
    a = quant.read_records(got, slots, block_size, layout, placement)
    b = quant.read_records(want, slots, block_size, layout, placement)
    _, data, scales, *_ = quant.RECORDS[layout]
    scale = (quant.decode_e4m3(quant.v41_fp4_pack(b)[1]) if layout == "v41_fp4" else
             2.0 ** (quant.v41_fp8_pack(b)[1].float() - 127)).repeat_interleave(16 if layout == "v41_fp4" else 32, 1)
    step = 2.0 if layout == "v41_fp4" else 2.0 ** -3 * 448  # the largest gap between neighbouring codes, x scale
    assert ((a - b).abs() <= step * scale + 1e-30).logical_or(a.isnan() & b.isnan()).all()
    got_bytes, want_bytes = storage_bytes(got), storage_bytes(want)
    assert (got_bytes == want_bytes).float().mean() >= MIN_EXACT_BYTES


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("layout", ("model1",) + V41)
def test_window_insert_without_q_norm(isa, layout, placement):
    tokens, heads, block_size = 12, 8, 61
    q = (torch.randn(tokens, heads, 512) * 3).bfloat16()
    kv = mixed_rows(tokens + 2).bfloat16()
    positions = torch.randint(0, MAX_POSITION, (tokens,))
    cos_sin = rope_table(MAX_POSITION)
    slots = distinct_slots(tokens, 2 * block_size, skip_every=4)
    pages = v41_pages(2, block_size, layout, placement) if layout != "model1" else random_pages(
        2, cache.kv_page_bytes(block_size), PAD_BYTES)
    expected = clone_storage(pages)
    q_out = ops.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, pages, block_size, padded_heads=16,
                                     q_norm=False, layout=layout, placement=placement)
    want_q = ref_kv_cache.qnorm_rope_kv_insert(q, kv, positions, cos_sin, slots, expected, block_size,
                                               padded_heads=16, q_norm=False, layout=layout, placement=placement)
    assert (q_out[:, heads:] == 0).all()
    torch.testing.assert_close(q_out.float(), want_q.float(), atol=0, rtol=2**-7)  # RoPE only: within 1 bf16 ULP
    if layout == "model1":
        return  # MODEL1 window inserts are checked in test_kv_cache_qnorm_rope_insert.py
    assert_stored_close(pages, expected, slots, block_size, layout, placement)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("layout", V41)
@pytest.mark.parametrize("ratio", (1, 2, 4, 128))
def test_compressor_store(isa, layout, placement, ratio):
    from test_compressor import make_case, written_slots  # noqa: PLC0415 (the compressor tests' inputs)

    case = make_case(512, ratio if ratio in (4, 128) else 4, 64)
    if ratio in (1, 2):  # V4.1's ratios: one window of `ratio` rows
        state = torch.randn(40, 4, 2 * 512) * 2
        positions = case.positions
        window = positions[:, None].long() - ratio + 1 + torch.arange(ratio)
        gather = torch.where(window >= 0, torch.randint(0, state.shape[0] * 4, window.shape), -1)
        case.state_cache, case.gather_slots, case.compress_ratio = state, gather, ratio
    pages = v41_pages(case.kv_cache.shape[0], 64, layout, placement)
    expected = clone_storage(pages)
    args = case.args(pages)
    tokens = case.positions.shape[0]
    latent = torch.full((tokens, 512), float("nan"), dtype=torch.bfloat16)  # rows no entry writes stay NaN
    want_latent = latent.clone()
    ops.compress_norm_rope_store(*args, layout=layout, placement=placement, latent_out=latent)
    ref_compressor.compress_norm_rope_store(*case.args(expected), layout, placement, latent_out=want_latent)
    slots = written_slots(case)
    assert slots.numel() > 0
    assert_stored_close(pages, expected, slots, 64, layout, placement)
    written = ~want_latent[:, 0].isnan()
    assert int(written.sum()) == slots.numel() and torch.equal(latent[:, 0].isnan(), ~written)
    # the normed entry before its RoPE: fp32 sums in another order, so within one bf16 step
    torch.testing.assert_close(latent[written].float(), want_latent[written].float(), atol=1e-6, rtol=2**-7)


# ---- conversions between records -------------------------------------------------------------------------------


def test_model1_to_v41_and_back(isa):
    block_size = 64
    model1 = cache.allocate_kv_cache(2, block_size)
    slots = torch.arange(2 * block_size)
    ops.quantize_kv_insert(mixed_rows(2 * block_size), slots, model1, block_size)
    v41 = cache.convert_kv_cache(model1, block_size, "model1", "v41_fp8")
    a = ops.dequantize_kv_gather(model1, slots, block_size)
    b = ops.dequantize_kv_gather(v41, slots, block_size, layout="v41_fp8")
    assert torch.equal(a[:, :448], b[:, :448]), "NoPE dims fit the 32-dim tiles exactly"
    rope_a, rope_b = a[:, 448:].float().reshape(-1, 2, 32), b[:, 448:].float().reshape(-1, 2, 32)
    assert ((rope_b - rope_a).abs() <= rope_a.abs().amax(-1, keepdim=True) / 8).all(), "RoPE dims within a code step"
    back = cache.convert_kv_cache(v41, block_size, "v41_fp8", "model1")
    c = ops.dequantize_kv_gather(back, slots, block_size)
    assert torch.equal(c[:, 448:], b[:, 448:]), "e4m3 RoPE values are exact in bf16"
    per_token = cache.convert_kv_cache(model1, block_size, "model1", "v41_fp8", dst_placement="per_token")
    assert torch.equal(cache.convert_placement(v41, block_size, "v41_fp8", "page_split", "per_token"), per_token)


# ---- bad input ---------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    pages = cache.allocate_kv_cache(2, 64, "v41_fp8")
    kv, slots = torch.randn(3, 512).bfloat16(), torch.arange(3)
    with pytest.raises(RuntimeError, match="argument 'layout' must be one of"):
        ops.quantize_kv_insert(kv, slots, pages, 64, layout="v41_fp16")
    with pytest.raises(RuntimeError, match="argument 'placement'"):
        ops.quantize_kv_insert(kv, slots, pages, 64, layout="v41_fp8", placement="rows")
    with pytest.raises(RuntimeError, match="V4.1 fp4 entries"):
        ops.quantize_kv_insert(kv, slots, cache.allocate_kv_cache(2, 64, "v41_fp4")[:, :100], 64, layout="v41_fp4")
    with pytest.raises(RuntimeError, match="head dim must be 512"):
        ops.quantize_kv_insert(torch.randn(3, 576).bfloat16(), slots, pages, 64, layout="v41_fp8")
    with pytest.raises(RuntimeError, match="block_size or the record format does not match"):
        ops.dequantize_kv_gather(pages, slots, 64, layout="v41_fp4")


@pytest.mark.parametrize("bad, message", [
    (lambda t: torch.zeros(t, 512), "argument 'latent_out' must have dtype BFloat16"),
    (lambda t: torch.zeros(t + 1, 512, dtype=torch.bfloat16), "argument 'latent_out'"),
    (lambda t: torch.zeros(512, t, dtype=torch.bfloat16).t(), "argument 'latent_out' must have a contiguous last dim"),
])
def test_compressor_latent_out_is_checked(bad, message):
    from test_compressor import make_case  # noqa: PLC0415 (the compressor tests' inputs)

    case = make_case(512, 4, 64)
    pages = v41_pages(case.kv_cache.shape[0], 64, "v41_fp8", "page_split")
    with pytest.raises(RuntimeError, match=message):
        ops.compress_norm_rope_store(*case.args(pages), layout="v41_fp8", latent_out=bad(case.positions.shape[0]))
